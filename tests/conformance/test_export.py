"""Exported bundles reproduce RLlib's recorded numbers in ONNX Runtime and TorchScript.

For every oracle case with weights: build the model from case.json, import RLlib's
weights, export a bundle (both runtimes, verified against eager torch by the exporter),
load it back with checksums verified, and run the recorded inputs through each runtime.
Recurrent cases run step by step with the state carried through the *graph's* outputs and
the recorded previous actions/rewards flattened as the model contract says, so a runtime
that drifts or mishandles state fails at the step where it happens.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from oracle import (
    OracleCase,
    assert_close,
    case_dir,
    catalog_config,
    load_case,
    oracle_dirs_text,
    read_meta,
    select_cases,
)

from conformance.heads import expected_graph_outputs
from rlserve.models.config import merge_model_config
from rlserve.models.export.bundle import Bundle, load_bundle
from rlserve.models.export.onnx import onnx_runner
from rlserve.models.export.torchscript import torchscript_runner
from rlserve.models.spaces import space_from_json

RUNTIMES = ("onnx", "torchscript")


# Their bundles replay RLlib's windows through the session slabs in test_trajectory_view.py.
OWN_EXPORT_TESTS = ("trajectory_view",)


def _cases_with_weights() -> list[str]:
    return select_cases(
        lambda name: (case_dir(name) / "weights.npz").is_file() and read_meta(name)["kind"] not in OWN_EXPORT_TESTS
    )


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory):
    """Export each case once per module run; the runtime tests share the bundle."""
    cache: dict[str, Bundle] = {}

    def get(case: OracleCase) -> Bundle:
        if case.name not in cache:
            cache[case.name] = _export_case(case, tmp_path_factory.mktemp(case.name))
        return cache[case.name]

    return get


def _export_case(case: OracleCase, tmp: Path) -> Bundle:
    from rlserve.models.catalog import build_model
    from rlserve.models.export.describe import describe_action_dist
    from rlserve.models.export.exporter import export_bundle
    from rlserve.models.rllib_import import load_rllib_weights

    torch.set_num_threads(1)
    obs_space = space_from_json(case.meta["observation_space"])
    action_space = space_from_json(case.meta["action_space"])
    config = merge_model_config(catalog_config(case.meta), action_space)
    model = build_model(obs_space, action_space, config, num_outputs=case.meta["num_outputs"])
    load_rllib_weights(model, case.weights)
    dist = describe_action_dist(action_space, config, case.meta["action_dist"])
    export_bundle(
        model, obs_space=obs_space, action_space=action_space, model_config=config,
        out_dir=tmp / "bundle", name=case.name, action_dist=dist,
    )
    return load_bundle(tmp / "bundle")  # checksums verified


def _runner(bundle: Bundle, runtime: str):
    path = bundle.runtime_path(runtime)
    if runtime == "onnx":
        return onnx_runner(path)
    return torchscript_runner(path, bundle.manifest.input_names, bundle.manifest.output_names)


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("case_name", _cases_with_weights())
def test_runtime_reproduces_rllib(case_name: str, runtime: str, exported) -> None:
    if case_name.startswith("<no cases"):
        pytest.fail(f"no oracle cases with weights: set RLSERVE_ORACLE_DIR (looked in {oracle_dirs_text()})")
    case = load_case(case_name)
    bundle = exported(case)
    run = _runner(bundle, runtime)
    if bundle.manifest.signature.is_recurrent:
        _check_recurrent(case, bundle, run, runtime)
    else:
        _check_feedforward(case, run, runtime)


def _check_feedforward(case: OracleCase, run, runtime: str, check=assert_close) -> None:
    """``check(actual, expected, what)`` compares one output (tests/conformance/test_cuda_runtime.py
    passes the export tolerance's rule)."""
    out = run({"obs": case.io["obs_flat"].astype(np.float32)})
    for name, (expected, keys) in expected_graph_outputs(case).items():
        check(out[name], expected, f"{case.name}/{runtime}: {name} ({', '.join(keys) or 'derived'})")


def _flat_prev(values: np.ndarray, batch: int, windowed: bool) -> np.ndarray:
    """Recorded prev actions/rewards -> the contract's (B, [n,] width) float32 layout."""
    return values.reshape((batch, values.shape[1], -1) if windowed else (batch, -1)).astype(np.float32)


def _check_recurrent(case: OracleCase, bundle: Bundle, run, runtime: str, check=assert_close) -> None:
    sig = bundle.manifest.signature
    io, steps = case.io, case.io["obs_flat"].shape[0]
    batch = io["obs_flat"].shape[1]
    n_state = len(sig.state)
    assert n_state == len(case.keys_under("state_in")), "state tensor count differs from RLlib's"
    state = [io[f"state_in/{i}"][0].astype(np.float32) for i in range(n_state)]
    for t in range(steps):
        feed = {"obs": io["obs_flat"][t].astype(np.float32)}
        feed.update({f"state_in_{i}": s for i, s in enumerate(state)})
        if sig.uses_prev_actions:
            feed["prev_actions"] = _flat_prev(io["prev_actions"][t], batch, sig.prev.windowed)
        if sig.uses_prev_rewards:
            rewards = io["prev_rewards"][t]
            feed["prev_rewards"] = (
                rewards.astype(np.float32) if sig.prev.windowed else rewards.reshape(batch).astype(np.float32)
            )
        out = run(feed)
        where = f"{case.name}/{runtime} step {t}"
        check(out["dist_inputs"], io["model_out"][t], f"{where}: model_out")
        check(out["value"], io["value"][t], f"{where}: value")
        state = [out[f"state_out_{i}"] for i in range(n_state)]
        for i, got in enumerate(state):
            check(got, _expected_state_out(io, i, t), f"{where}: state_out/{i}")


def _expected_state_out(io: dict[str, np.ndarray], i: int, t: int) -> np.ndarray:
    """LSTM: RLlib's state_out. Attention memory: RLlib returns only the new row (B, D)
    while the contract's graph returns the rolled memory (B, M, D), oldest row dropped."""
    new = io[f"state_out/{i}"][t]
    if new.ndim == io[f"state_in/{i}"].ndim - 1:
        return new
    return np.concatenate([io[f"state_in/{i}"][t][:, 1:], new[:, None]], axis=1)
