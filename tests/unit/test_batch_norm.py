"""RLlib's TorchBatchNormModel serves in inference mode only.

The recorded cases (kind ``batch_norm``, tests/fixtures/oracle) hold running statistics
moved by training-mode passes in RLlib; the conformance tests compare their outputs. Here:
the statistics are really used (the recorded answers differ from batch statistics and from
the default ones), a forward pass never changes them, even with the model in ``.train()``,
and a row's answer does not depend on the rows beside it, in the catalog model and in
both exported runtimes.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from oracle import case_model, load_case_at

from rlserve.models.export.bundle import load_bundle
from rlserve.models.export.exporter import export_bundle
from rlserve.models.export.onnx import onnx_runner
from rlserve.models.export.torchscript import torchscript_runner
from rlserve.models.networks.batch_norm import InferenceBatchNorm1d

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "oracle"
CASES = sorted(p for p in FIXTURES.iterdir() if (p / "case.json").is_file()
               and json.loads((p / "case.json").read_text())["kind"] == "batch_norm")


def _load(case: Path):
    recorded = load_case_at(case)
    return (*case_model(recorded), recorded.io)


def _buffers(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.named_buffers()}


def test_there_are_cases() -> None:
    assert len(CASES) >= 2


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.name)
def test_running_statistics_matter(case: Path) -> None:
    """RLlib's answers need the recorded statistics: batch statistics or the initial (0, 1)
    ones give other logits, so a model that ignored them could not pass the conformance."""
    model, *_, recorded = _load(case)
    obs = torch.from_numpy(recorded["obs_flat"])
    norms = [m for m in model.modules() if isinstance(m, InferenceBatchNorm1d)]
    assert len(norms) == 2
    for m in norms:
        assert int(m.num_batches_tracked) > 0
        assert not torch.allclose(m.running_mean, torch.zeros_like(m.running_mean), atol=1e-3)
    with torch.no_grad():
        ours, _ = model(obs)
        np.testing.assert_allclose(ours.numpy(), recorded["model_out"], rtol=1e-5, atol=1e-5)
        for m in norms:  # plain BatchNorm1d behaviour, for contrast
            m.running_mean.zero_()
            m.running_var.fill_(1.0)
        default_stats, _ = model(obs)
    assert np.abs(default_stats.numpy() - recorded["model_out"]).max() > 1e-2
    batch_stats = _with_batch_statistics(case, obs)
    assert np.abs(batch_stats - recorded["model_out"]).max() > 1e-2


def _with_batch_statistics(case: Path, obs: torch.Tensor) -> np.ndarray:
    """What a training-mode BatchNorm1d would answer for this batch."""
    model, *_ = _load(case)
    hidden = obs
    with torch.no_grad():
        for layer in model.base._hidden_layers:
            if isinstance(layer, InferenceBatchNorm1d):
                hidden = torch.nn.functional.batch_norm(hidden, None, None, layer.weight, layer.bias, True, 0.0,
                                                        layer.eps)
            else:
                hidden = layer(hidden)
        return model.base._logits(hidden).numpy()


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.name)
def test_forward_never_updates_statistics_even_in_train_mode(case: Path) -> None:
    model, obs_space, *_ = _load(case)
    before = _buffers(model)
    model.train()
    rows = torch.from_numpy(np.stack([obs_space.sample() for _ in range(32)]).astype(np.float32))
    with torch.no_grad():
        trained_mode, _ = model(rows)
    model.eval()
    with torch.no_grad():
        eval_mode, _ = model(rows)
    after = _buffers(model)
    assert before.keys() == after.keys()
    for key in before:
        assert torch.equal(before[key], after[key]), f"{key} changed"
    torch.testing.assert_close(trained_mode, eval_mode, rtol=0, atol=0)


@pytest.mark.parametrize("runtime", ["onnx", "torchscript"])
@pytest.mark.parametrize("case", CASES, ids=lambda p: p.name)
def test_exported_row_does_not_depend_on_its_batch(case: Path, runtime: str, tmp_path: Path) -> None:
    model, obs_space, action_space, config, recorded = _load(case)
    export_bundle(model, obs_space=obs_space, action_space=action_space, model_config=config,
                  out_dir=tmp_path / "b", name=case.name, formats=(runtime,))
    bundle = load_bundle(tmp_path / "b")
    path = bundle.runtime_path(runtime)
    run = onnx_runner(path) if runtime == "onnx" else torchscript_runner(
        path, bundle.manifest.input_names, bundle.manifest.output_names)
    obs = recorded["obs_flat"].astype(np.float32)
    others = np.stack([obs_space.sample() for _ in range(9)]).astype(np.float32) * 3.0
    alone = [run({"obs": obs[i : i + 1]}) for i in range(len(obs))]
    mixed = run({"obs": np.concatenate([others[:4], obs, others[4:]])})
    again = run({"obs": obs})
    for i, single in enumerate(alone):
        for key in ("dist_inputs", "value"):
            np.testing.assert_allclose(single[key][0], mixed[key][4 + i], rtol=1e-6, atol=1e-6)
            np.testing.assert_allclose(single[key][0], again[key][i], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(again["dist_inputs"], recorded["model_out"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(again["value"], recorded["value"], rtol=1e-5, atol=1e-5)
