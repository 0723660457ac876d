"""Custom models that declare their own recurrent state: build checks, export, session state.

A user's ``RecurrentCustomModel`` with a non-zero initial state is exported and its bundle
stepped in ONNX Runtime and TorchScript with the state carried through the graph's outputs;
the session slabs start an episode from the declared initial state. Contract slips are
refused at build with messages naming what is wrong.
"""

from __future__ import annotations

from pathlib import Path

import gymnasium.spaces as gs
import numpy as np
import pytest
import torch
from torch import nn

from rlserve.models.catalog import build_model
from rlserve.models.custom import register_custom_model, unregister_custom_model
from rlserve.models.export.bundle import load_bundle
from rlserve.models.export.exporter import export_bundle
from rlserve.models.export.onnx import onnx_runner
from rlserve.models.export.torchscript import torchscript_runner
from rlserve.models.networks.custom_policy import RecurrentCustomModel
from rlserve.service.sessions.slabs import SessionSlabs

NAME = "test_custom_recurrent_gru"


class TwoStateGRU(RecurrentCustomModel):
    """A GRU cell and a decaying trace as a second state tensor of another shape."""

    def __init__(self, obs_space, action_space, num_outputs, model_config, name, cell=5, start=0.25, bad=""):
        super().__init__()
        self.obs_shape, self.num_outputs = tuple(obs_space.shape), int(num_outputs)
        self.cell, self.start, self.bad = cell, start, bad
        self.gru = nn.GRUCell(int(np.prod(self.obs_shape)), cell)
        self.head, self.vf = nn.Linear(cell + 2, self.num_outputs), nn.Linear(cell, 1)

    def initial_state(self):
        first = np.full(self.cell, self.start, np.float32)
        if self.bad == "initial":
            first[0] = 1.0
        return [first, np.zeros((2,), np.float32)]

    def forward_step(self, obs, state):
        h = self.gru(obs.reshape(obs.shape[0], -1), state[0])
        trace = 0.5 * state[1] + obs[:, :2]
        out = self.head(torch.cat([h, trace], dim=1))
        if self.bad == "outputs":
            return out, self.vf(h).squeeze(-1), [h]
        return out, self.vf(h).squeeze(-1), [h, trace]


@pytest.fixture
def registered():
    register_custom_model(NAME, TwoStateGRU)
    yield NAME
    unregister_custom_model(NAME)


SPACES = (gs.Box(-1.0, 1.0, (3,)), gs.Discrete(4))


def test_signature_declares_the_state(registered: str) -> None:
    sig = build_model(*SPACES, {"custom_model": registered}).signature()
    assert [(s.shape, s.initial_value) for s in sig.state] == [((5,), 0.25), ((2,), 0.0)]
    assert sig.input_names == ["obs", "state_in_0", "state_in_1"]
    assert sig.output_names == ["dist_inputs", "value", "state_out_0", "state_out_1"]


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"custom_model_config": {"bad": "initial"}}, "initial_state()[0]: expected one constant"),
        ({"custom_model_config": {"bad": "outputs"}}, "one new state per declared state tensor"),
        ({"use_lstm": True}, "model_config.use_lstm"),
    ],
)
def test_contract_slips_are_refused_at_build(registered: str, config: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        build_model(*SPACES, {"custom_model": registered, **config})


def test_bundle_steps_like_the_eager_model(registered: str, tmp_path: Path) -> None:
    torch.manual_seed(3)
    config = {"custom_model": registered}
    model = build_model(*SPACES, config).eval()
    export_bundle(model, obs_space=SPACES[0], action_space=SPACES[1], model_config=config,
                  out_dir=tmp_path / "bundle", name="gru")
    bundle = load_bundle(tmp_path / "bundle")
    manifest_state = bundle.manifest.signature.state
    assert [(s.shape, s.initial_value) for s in manifest_state] == [((5,), 0.25), ((2,), 0.0)]
    runners = {
        "onnx": onnx_runner(bundle.runtime_path("onnx")),
        "torchscript": torchscript_runner(
            bundle.runtime_path("torchscript"), bundle.manifest.input_names, bundle.manifest.output_names
        ),
    }
    rng = np.random.default_rng(0)
    obs = rng.uniform(-1, 1, (6, 2, 3)).astype(np.float32)
    for name, run in runners.items():
        state = [np.full((2, *s.shape), s.initial_value, np.float32) for s in manifest_state]
        eager = [torch.from_numpy(s.copy()) for s in state]
        for t in range(obs.shape[0]):
            out = run({"obs": obs[t], "state_in_0": state[0], "state_in_1": state[1]})
            with torch.no_grad():
                logits, value, *eager = model(torch.from_numpy(obs[t]), *eager)
            np.testing.assert_allclose(out["dist_inputs"], logits.numpy(), rtol=1e-5, atol=1e-5, err_msg=f"{name} {t}")
            np.testing.assert_allclose(out["value"], value.numpy(), rtol=1e-5, atol=1e-5, err_msg=f"{name} {t}")
            state = [out["state_out_0"], out["state_out_1"]]


def test_an_episode_start_gathers_the_declared_initial_state(registered: str) -> None:
    sig = build_model(*SPACES, {"custom_model": registered}).signature()
    slabs = SessionSlabs(sig, capacity=4, max_capacity=4)
    slots = np.array([1, 2])
    slabs.reset(slots)
    slabs.scatter(slots, [np.ones((2, 5), np.float32), np.ones((2, 2), np.float32)], None)
    slabs.reset(slots[:1])
    gathered = slabs.gather(slots)
    np.testing.assert_array_equal(gathered["state_in_0"], [[0.25] * 5, [1.0] * 5])
    np.testing.assert_array_equal(gathered["state_in_1"], [[0.0] * 2, [1.0] * 2])
