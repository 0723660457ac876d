"""Trajectory-view models (kind ``trajectory_view``) against RLlib's recorded episodes.

RLlib builds the windows (``prev_n_obs``, ``prev_n_actions``, ``prev_n_rewards``) in its
sampler's AgentCollector; the catalog model keeps the observation window as session state
and reads the action/reward windows the server keeps. Each case is replayed t = 0..T-1
through ``SessionSlabs`` driven as the batch step drives them (reset at the episode start,
report the last reward, gather, run, scatter the new state and the taken action): every
window must equal RLlib's at every step, and so must ``model_out`` and ``value``. The same
replay runs through the exported ONNX and TorchScript graphs.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from oracle import OracleCase, assert_close, case_model, cases_of_kind, load_case

from conformance.keys_checked import mark_fields, mark_io
from rlserve.models.catalog import describe_model
from rlserve.models.distributions.actions import flatten_actions
from rlserve.models.export.bundle import load_bundle
from rlserve.models.export.exporter import export_bundle
from rlserve.models.export.onnx import onnx_runner
from rlserve.models.export.torchscript import torchscript_runner
from rlserve.service.sessions.slabs import SessionSlabs

CASES = cases_of_kind("trajectory_view")
ATOL = 1e-5


def _model(case: OracleCase) -> tuple[torch.nn.Module, object, object, dict]:
    model, obs_space, action_space, config = case_model(case)
    return model.eval(), obs_space, action_space, config


def _replay(case: OracleCase, sig, action_space, run: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]],
            where: str, frames: Callable[[dict[str, np.ndarray]], np.ndarray] | None = None) -> None:
    batch, steps = case.meta["batch_size"], case.meta["T"]
    slabs = SessionSlabs(sig, capacity=batch + 1, max_capacity=batch + 1)
    slots = np.arange(1, batch + 1)
    for t in range(steps):
        if t == 0:
            slabs.reset(slots)
        else:
            slabs.report(slots, case.io["rewards"][t - 1].astype(np.float32), None)
        inputs = slabs.gather(slots)
        inputs["obs"] = case.io["obs_flat"][t].astype(np.float32)
        at = f"{where} t={t}"
        assert_close(inputs["prev_actions"][..., 0], case.io["prev_n_actions"][t], f"{at}: prev_n_actions")
        assert_close(inputs["prev_rewards"], case.io["prev_n_rewards"][t], f"{at}: prev_n_rewards")
        if frames is not None:
            assert_close(frames(inputs), case.io["prev_n_obs"][t], f"{at}: prev_n_obs", atol=0, rtol=0)
        out = run(inputs)
        assert_close(out["dist_inputs"], case.io["model_out"][t], f"{at}: model_out", atol=ATOL)
        assert_close(out["value"], case.io["value"][t], f"{at}: value", atol=ATOL)
        taken = np.asarray(flatten_actions(action_space, case.io["actions_taken"][t]), np.float32)
        slabs.scatter(slots, [out[f"state_out_{i}"] for i in range(len(sig.state))], taken.reshape(batch, -1))


@pytest.mark.parametrize("name", CASES)
def test_catalog_replays_rllibs_windows(name: str) -> None:
    case = load_case(name)
    model, obs_space, action_space, config = _model(case)
    sig = model.signature()
    assert describe_model(obs_space, action_space, config) == case.meta["model_class"]
    assert sig.num_outputs == case.meta["num_outputs"]
    n = case.io["prev_n_obs"].shape[2]
    assert sig.prev.n_prev_actions == case.io["prev_n_actions"].shape[2] == n
    assert sig.prev.n_prev_rewards == case.io["prev_n_rewards"].shape[2] == n

    def run(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        with torch.no_grad():
            outs = model(*(torch.from_numpy(np.ascontiguousarray(inputs[k])) for k in sig.input_names))
        return {k: o.numpy() for k, o in zip(sig.output_names, outs, strict=True)}

    def frames(inputs: dict[str, np.ndarray]) -> np.ndarray:
        tensors = (torch.from_numpy(inputs[k]) for k in ("obs", "state_in_0", "state_in_1"))
        return model.frames(*tensors).numpy()

    _replay(case, sig, action_space, run, name, frames)
    mark_io(case, "obs_flat", "prev_n_obs", "prev_n_actions", "prev_n_rewards", "model_out", "value",
            "actions_taken", "rewards")
    mark_fields(case, "model_class", "num_outputs", "batch_size", "T")


@pytest.mark.parametrize("runtime", ["onnx", "torchscript"])
@pytest.mark.parametrize("name", CASES)
def test_bundle_replays_rllibs_windows(name: str, runtime: str, tmp_path: Path) -> None:
    case = load_case(name)
    model, obs_space, action_space, config = _model(case)
    export_bundle(model, obs_space=obs_space, action_space=action_space, model_config=config,
                  out_dir=tmp_path / "bundle", name=name, formats=(runtime,))
    bundle = load_bundle(tmp_path / "bundle")
    sig = bundle.manifest.signature
    assert set(sig.views) == {"prev_n_obs", "prev_n_actions", "prev_n_rewards"}
    path = bundle.runtime_path(runtime)
    runner = onnx_runner(path) if runtime == "onnx" else torchscript_runner(
        path, bundle.manifest.input_names, bundle.manifest.output_names)
    _replay(case, sig, action_space, runner, f"{name}/{runtime}")
