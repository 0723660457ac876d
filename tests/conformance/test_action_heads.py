"""Models with an action head (kinds ``q_model``, ``autoregressive``) against RLlib's numbers.

Every check runs on three sources of the same outputs: the catalog's torch model and the
exported bundle's ONNX and TorchScript graphs (one export per case). Dispatch is on
``kind`` only; what each kind's graph outputs stand for is in ``heads.py``.

- q_model: the Q-values, advantages, state value, embedding and base value; the greedy
  action of the served Q-policy; ``q_logits`` (all ones for num_atoms = 1).
- autoregressive: the a1/a2 logits, RLlib's sampling order (our logits sampled with
  torch's RNG after ``torch.manual_seed(0)``, as recorded, give RLlib's samples), logp of
  a flattened ``(B, 2)`` action, deterministic sampling, and the stochastic entropy
  recomputed with ``a1' = dist/sample/0`` (check_format.md).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from oracle import OracleCase, assert_close, cases_of_kind, catalog_config, load_case

from conformance.heads import HEAD_KINDS, a2_keys, expected_graph_outputs
from conformance.keys_checked import mark_fields, mark_io
from conformance.test_export import _export_case, _runner
from rlserve.models.catalog import build_model, describe_model
from rlserve.models.distributions import ActionDistSpec, Categorical, get_action_dist, model_output_width
from rlserve.models.export.bundle import Bundle
from rlserve.models.rllib_import import load_rllib_weights
from rlserve.models.spaces import space_from_json

SOURCES = ("catalog", "onnx", "torchscript")


def _case(name: str) -> OracleCase:
    if name.startswith("<no cases"):
        pytest.fail(name)
    return load_case(name)


@functools.cache
def _model(path: str) -> torch.nn.Module:
    case = load_case(Path(path).name)
    meta = case.meta
    model = build_model(space_from_json(meta["observation_space"]), space_from_json(meta["action_space"]),
                        catalog_config(meta), num_outputs=meta["num_outputs"])
    return load_rllib_weights(model, case.weights).eval()


_BUNDLES: dict[str, Bundle] = {}


def _bundle(case: OracleCase, tmp_path_factory: pytest.TempPathFactory) -> Bundle:
    key = str(case.path)
    if key not in _BUNDLES:
        _BUNDLES[key] = _export_case(case, tmp_path_factory.mktemp(case.name))
    return _BUNDLES[key]


def _outputs(case: OracleCase, source: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, np.ndarray]:
    obs = case.io["obs_flat"].astype(np.float32)
    if source == "catalog":
        model = _model(str(case.path))
        with torch.no_grad():
            outs = model(torch.from_numpy(obs))
        return {n: o.numpy() for n, o in zip(model.signature().output_names, outs, strict=True)}
    return _runner(_bundle(case, tmp_path_factory), source)({"obs": obs})


def _spec(case: OracleCase) -> ActionDistSpec:
    return get_action_dist(space_from_json(case.meta["action_space"]), catalog_config(case.meta))


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("name", cases_of_kind(*HEAD_KINDS))
def test_graph_outputs_match_rllib(name: str, source: str, tmp_path_factory) -> None:
    case = _case(name)
    out = _outputs(case, source, tmp_path_factory)
    for output, (expected, keys) in expected_graph_outputs(case).items():
        assert_close(out[output], expected, f"{name}/{source}: {output} ({', '.join(keys) or 'derived'})")
        mark_io(case, *keys)
    mark_io(case, "obs_flat")


@pytest.mark.parametrize("name", cases_of_kind(*HEAD_KINDS))
def test_catalog_describes_rllibs_model_and_dist(name: str) -> None:
    case = _case(name)
    meta = case.meta
    obs_space, action_space = space_from_json(meta["observation_space"]), space_from_json(meta["action_space"])
    config = catalog_config(meta)
    assert describe_model(obs_space, action_space, config) == meta["model_class"]
    model = _model(str(case.path))
    assert model.num_outputs == meta["model_num_outputs"]
    spec = _spec(case)
    assert model.signature().num_outputs == spec.num_outputs
    assert meta["dist_errors"] == {}, "RLlib failed on a method; no such case is expected for these kinds"
    if case.kind == "q_model":
        # DQN's builder decides num_outputs itself; the catalog must reach the same value.
        unsized = build_model(obs_space, action_space, config)
        assert unsized.num_outputs == meta["num_outputs"]
        # RLlib pairs the Q-values with TorchCategoricalWithTemperature (used only by SoftQ);
        # the served rule is epsilon-greedy. The recorded temperature is the config's.
        assert meta["action_dist"]["class"] == "TorchCategoricalWithTemperature"
        temperature = meta["dqn_config"]["categorical_distribution_temperature"]
        assert Categorical(np.zeros((1, spec.num_outputs), np.float32), temperature=temperature).probs.shape[1] == int(
            action_space.n)
        mark_fields(case, "dqn_config")
    else:
        assert spec.dist_class.rllib_name == meta["action_dist"]["class"]
        assert model_output_width(action_space, config) == meta["num_outputs"]
    mark_fields(case, "model_class", "model_num_outputs", "num_outputs", "action_dist", "dist_errors")


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("name", cases_of_kind("q_model"))
def test_q_policy_acts_greedily_on_rllibs_q_values(name: str, source: str, tmp_path_factory) -> None:
    case = _case(name)
    out = _outputs(case, source, tmp_path_factory)
    dist = _spec(case).build(out["dist_inputs"])
    greedy = dist.deterministic_sample()
    assert_close(greedy, case.io["greedy_action"], f"{name}/{source}: greedy_action")
    dist.set_epsilon(np.zeros(len(greedy)))
    assert_close(dist.logp(greedy), np.zeros(len(greedy), np.float32), f"{name}/{source}: greedy logp")
    # num_atoms = 1: RLlib's q_logits are ones of shape (B, n_actions, 1).
    assert_close(np.ones((*out["dist_inputs"].shape, 1), np.float32), case.io["q_logits"], "q_logits")
    mark_io(case, "greedy_action", "q_logits")


def _pair(case: OracleCase, prefix: str) -> tuple[np.ndarray, np.ndarray]:
    return case.io[f"{prefix}/0"], case.io[f"{prefix}/1"]


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("name", cases_of_kind("autoregressive"))
def test_autoregressive_distribution_matches_rllib(name: str, source: str, tmp_path_factory) -> None:
    case = _case(name)
    io = case.io
    dist: Any = _spec(case).build(_outputs(case, source, tmp_path_factory)["dist_inputs"])
    where = f"{name}/{source}"

    mode = dist.deterministic_sample()
    for got, key in zip(mode, ("dist/deterministic_sample/0", "dist/deterministic_sample/1"), strict=True):
        assert_close(got, io[key], f"{where}: {key}")
    assert_close(dist.sampled_action_logp(), io["dist/deterministic_sampled_action_logp"], f"{where}: det logp")
    assert_close(dist.a2_logits(mode[0]), io["a2_logits_given_a1"], f"{where}: a2_logits_given_a1")

    sample = _pair(case, "dist/sample")
    assert_close(dist.logp(np.stack(sample, axis=1)), io["dist/logp"], f"{where}: dist/logp of a (B, 2) action")
    assert_close(dist.logp(sample), io["dist/sampled_action_logp"], f"{where}: dist/sampled_action_logp")
    assert_close(dist.entropy_given(sample[0]), io["dist/entropy"], f"{where}: entropy with a1' = dist/sample/0")
    fixed = _pair(case, "dist/actions/fixed")
    assert_close(dist.logp(np.stack(fixed, axis=1)), io["dist/logp/fixed"], f"{where}: dist/logp/fixed")

    # RLlib's order (a1 from one draw over the batch, then a2 given a1) with torch's RNG on
    # our logits reproduces the recorded samples.
    torch.manual_seed(0)
    a1 = torch.distributions.Categorical(logits=torch.from_numpy(dist.inputs[:, :2])).sample()
    a2 = torch.distributions.Categorical(logits=torch.from_numpy(dist.a2_logits(a1.numpy()))).sample()
    assert_close(a1.numpy(), sample[0], f"{where}: dist/sample/0")
    assert_close(a2.numpy(), sample[1], f"{where}: dist/sample/1")
    mark_io(case, "a2_logits_given_a1", "dist/deterministic_sample/0", "dist/deterministic_sample/1",
            "dist/deterministic_sampled_action_logp", "dist/sample/0", "dist/sample/1", "dist/logp",
            "dist/sampled_action_logp", "dist/entropy", "dist/actions/fixed/0", "dist/actions/fixed/1",
            "dist/logp/fixed", *a2_keys(case))
