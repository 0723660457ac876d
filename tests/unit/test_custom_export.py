"""A registered custom model exports, and its bundle runs where the class does not exist.

The serving process never has the user's model code: the bundle must carry everything.
A fresh interpreter loads the bundle and runs it with ONNX Runtime (torch never imported)
and with TorchScript, with the custom class's module absent from ``sys.modules``, and
the outputs must match the eager model in this process.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import gymnasium.spaces as gs
import numpy as np
import pytest
import torch
from torch import nn

from rlserve.models.catalog import build_model
from rlserve.models.custom import register_custom_model, unregister_custom_model
from rlserve.models.export.exporter import export_bundle

REPO = Path(__file__).resolve().parents[2]
NAME = "test_custom_export_gated_mlp"


class GatedMLP(nn.Module):
    """Not a catalog network: a gated hidden layer and a value head reading sin(obs)."""

    def __init__(self, obs_space, action_space, num_outputs, model_config, name, hidden: int = 8):
        super().__init__()
        self.num_outputs = int(num_outputs)
        width = int(np.prod(obs_space.shape))
        self.hidden = nn.Linear(width, hidden)
        self.gate = nn.Linear(width, hidden)
        self.out = nn.Linear(hidden, self.num_outputs)
        self.vf = nn.Linear(width, 1)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.tanh(self.hidden(obs)) * torch.sigmoid(self.gate(obs))
        return self.out(h), self.vf(torch.sin(obs)).squeeze(-1)


@pytest.fixture
def custom_bundle(tmp_path: Path):
    register_custom_model(NAME, GatedMLP)
    try:
        torch.manual_seed(0)
        obs_space, action_space = gs.Box(-2.0, 2.0, (5,)), gs.Discrete(3)
        config = {"custom_model": NAME, "custom_model_config": {"hidden": 6}}
        model = build_model(obs_space, action_space, config).eval()
        bundle = export_bundle(
            model, obs_space=obs_space, action_space=action_space, model_config=config,
            out_dir=tmp_path / "bundle", name="gated",
        )
        yield model, bundle
    finally:
        unregister_custom_model(NAME)


_CHILD = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import onnxruntime as ort
    from rlserve.models.export.bundle import load_bundle

    bundle_path, obs_path, class_module = sys.argv[1:4]
    bundle = load_bundle(bundle_path)
    obs = np.load(obs_path, allow_pickle=False)
    session = ort.InferenceSession(str(bundle.runtime_path("onnx")), providers=["CPUExecutionProvider"])
    out = dict(zip(bundle.manifest.output_names, session.run(bundle.manifest.output_names, {"obs": obs})))
    report = {"onnx": {k: v.tolist() for k, v in out.items()},
              "torch_after_onnx": "torch" in sys.modules}
    import torch
    ts = torch.jit.load(str(bundle.runtime_path("torchscript")))
    with torch.no_grad():
        logits, value = ts(torch.from_numpy(obs))
    report["torchscript"] = {"dist_inputs": logits.tolist(), "value": value.tolist()}
    report["class_module_loaded"] = class_module in sys.modules
    report["custom_in_manifest"] = bundle.manifest.model_config["custom_model"]
    print(json.dumps(report))
    """
)


def test_custom_model_bundle_runs_without_its_class(custom_bundle, tmp_path: Path) -> None:
    model, bundle = custom_bundle
    obs = np.random.default_rng(1).uniform(-2, 2, size=(4, 5)).astype(np.float32)
    np.save(tmp_path / "obs.npy", obs)
    with torch.no_grad():
        logits, value = (t.numpy() for t in model(torch.from_numpy(obs)))
    result = subprocess.run(
        [sys.executable, "-c", _CHILD, str(bundle.root), str(tmp_path / "obs.npy"), GatedMLP.__module__],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["class_module_loaded"] is False
    assert report["torch_after_onnx"] is False, "running an ONNX bundle must not import torch"
    assert report["custom_in_manifest"] == NAME
    for runtime in ("onnx", "torchscript"):
        got = report[runtime]
        np.testing.assert_allclose(np.array(got["dist_inputs"]), logits, rtol=1e-5, atol=1e-6, err_msg=runtime)
        np.testing.assert_allclose(np.array(got["value"]), value, rtol=1e-5, atol=1e-6, err_msg=runtime)


class BranchOnData(nn.Module):
    """Python control flow on the batch size: a trace records one branch, eager takes both."""

    def __init__(self, obs_space, action_space, num_outputs, model_config, name):
        super().__init__()
        self.num_outputs = int(num_outputs)
        self.linear = nn.Linear(int(np.prod(obs_space.shape)), self.num_outputs)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.linear(obs)
        if obs.shape[0] > 2:  # the exporter traces at batch 3 and checks batches 1 and 64
            logits = -logits
        return logits, obs.mean(dim=1)


def test_a_trace_that_disagrees_with_eager_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    from rlserve.models.export.bundle import BundleError

    register_custom_model(NAME + "_branch", BranchOnData)
    try:
        obs_space, action_space = gs.Box(-1.0, 1.0, (3,)), gs.Discrete(2)
        config = {"custom_model": NAME + "_branch"}
        model = build_model(obs_space, action_space, config)
        with pytest.raises(BundleError, match=r"torchscript export at batch size \d+ vs eager torch"):
            export_bundle(model, obs_space=obs_space, action_space=action_space, model_config=config,
                          out_dir=tmp_path / "bundle", formats=("torchscript",))
    finally:
        unregister_custom_model(NAME + "_branch")
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no bundle, no staging leftovers
