"""Custom models through the catalog, and the built-in action-mask model."""

from __future__ import annotations

from collections import OrderedDict

import gymnasium.spaces as gs
import numpy as np
import pytest
import torch
from torch import nn

from rlserve.models.catalog import build_model, describe_model
from rlserve.models.custom import (
    UnknownCustomModelError,
    get_custom_model,
    register_custom_model,
    registered_custom_models,
    unregister_custom_model,
)
from rlserve.models.networks.action_mask import FLOAT_MIN, RLLIB_PATHS, ActionMaskModel

torch.set_num_threads(1)
OBS = gs.Dict({"pos": gs.Box(-1, 1, (2,), np.float32), "kind": gs.Discrete(3)})  # flat: kind(3), pos(2)


class ScaledLinear(nn.Module):
    """A tiny custom model: out = scale * (W obs), value = sum(obs)."""

    received: dict = {}

    def __init__(self, obs_space, action_space, num_outputs, model_config, name, scale=1.0):
        super().__init__()
        ScaledLinear.received = {"obs_space": obs_space, "num_outputs": num_outputs, "name": name,
                                 "hidden": model_config["fcnet_hiddens"]}
        self.num_outputs = num_outputs or 6
        self.scale = scale
        self.linear = nn.Linear(int(np.prod(obs_space.shape)), self.num_outputs, bias=False)

    def forward(self, obs):
        return self.scale * self.linear(obs), obs.sum(dim=1)


class WrongShape(ScaledLinear):
    def forward(self, obs):
        return self.linear(obs)[:, :1], obs.sum(dim=1)


@pytest.fixture
def registered():
    register_custom_model("scaled_linear", ScaledLinear)
    register_custom_model("wrong_shape", WrongShape)
    yield
    unregister_custom_model("scaled_linear")
    unregister_custom_model("wrong_shape")


def test_custom_model_end_to_end(registered):
    config = {"custom_model": "scaled_linear", "custom_model_config": {"scale": 3.0}, "fcnet_hiddens": [7]}
    model = build_model(OBS, gs.Discrete(4), config)
    received = ScaledLinear.received
    assert received["num_outputs"] == 4 and received["hidden"] == [7] and isinstance(received["name"], str)
    assert received["obs_space"].shape == (5,) and received["obs_space"].original_space == OBS
    assert describe_model(OBS, gs.Discrete(4), config) == "ScaledLinear"
    obs = torch.tensor([[0.0, 1.0, 0.0, 0.5, -0.5], [1.0, 0.0, 0.0, 0.25, 0.75]])
    out, value = model(obs)
    weight = model.base.linear.weight.detach()
    torch.testing.assert_close(out, 3.0 * obs @ weight.T)
    torch.testing.assert_close(value, torch.tensor([1.0, 2.0]))
    assert model.signature().obs_shape == (5,) and model.signature().num_outputs == 4


def test_custom_model_class_object_is_accepted():
    model = build_model(gs.Box(-1, 1, (3,)), gs.Discrete(2), {"custom_model": ScaledLinear})
    assert isinstance(model.base, ScaledLinear)


def test_custom_model_under_lstm(registered):
    config = {"custom_model": "scaled_linear", "use_lstm": True, "lstm_cell_size": 8}
    assert describe_model(OBS, gs.Discrete(4), config) == "ScaledLinear_as_LSTMWrapper"
    model = build_model(OBS, gs.Discrete(4), config)
    assert ScaledLinear.received["num_outputs"] is None  # wrapped bases get num_outputs=None
    out, value, h, c = model(torch.zeros(2, 5), torch.zeros(2, 8), torch.zeros(2, 8))
    assert out.shape == (2, 4) and value.shape == (2,) and h.shape == (2, 8)


def test_contract_violation_fails_at_build(registered):
    with pytest.raises(ValueError, match=r"returned out \[2, 1\].*expected \[2, 4\]"):
        build_model(OBS, gs.Discrete(4), {"custom_model": "wrong_shape"})


def test_unknown_custom_model_names_the_registered_ones(registered):
    with pytest.raises(UnknownCustomModelError, match="did you mean 'scaled_linear'"):
        build_model(OBS, gs.Discrete(4), {"custom_model": "scaled_linaer"})


def test_action_mask_is_registered_under_rllib_paths():
    assert "action_mask" in registered_custom_models()
    for path in RLLIB_PATHS:
        assert get_custom_model(path) is ActionMaskModel


def _mask_space(order=("action_mask", "observations")):
    leaves = {"action_mask": gs.Box(0, 1, (4,), np.float32), "observations": gs.Box(-1, 1, (3,), np.float32)}
    return gs.Dict(OrderedDict((k, leaves[k]) for k in order))


@pytest.mark.parametrize("order", [("action_mask", "observations"), ("observations", "action_mask")])
def test_action_mask_slices_by_layout_and_masks(order):
    model = build_model(_mask_space(order), gs.Discrete(4), {"custom_model": "action_mask", "fcnet_hiddens": [8]})
    mask = torch.tensor([[1.0, 0.0, 1.0, 0.0], [0.0, 1.0, 1.0, 1.0]])
    inner = torch.tensor([[0.1, -0.2, 0.3], [0.5, 0.5, -0.5]])
    obs = torch.cat([mask, inner] if order[0] == "action_mask" else [inner, mask], dim=1)
    out, value = model(obs)
    logits, inner_value = model.base.internal_model(inner)
    torch.testing.assert_close(value, inner_value)
    torch.testing.assert_close(out[mask == 1], logits[mask == 1])
    assert bool((out[mask == 0] == torch.tensor(FLOAT_MIN, dtype=torch.float32) + logits[mask == 0]).all())
    assert bool(torch.isfinite(out).all())


def test_action_mask_no_masking_option():
    config = {"custom_model": "action_mask", "custom_model_config": {"no_masking": True}, "fcnet_hiddens": [8]}
    model = build_model(_mask_space(), gs.Discrete(4), config)
    obs = torch.cat([torch.zeros(1, 4), torch.ones(1, 3)], dim=1)
    torch.testing.assert_close(model(obs)[0], model.base.internal_model(torch.ones(1, 3))[0])


@pytest.mark.parametrize(
    ("obs_space", "config", "match"),
    [
        (gs.Box(-1, 1, (7,)), {}, "Dict observation space"),
        (gs.Dict({"action_mask": gs.Box(0, 1, (4,)), "obs": gs.Box(-1, 1, (3,))}), {}, "'observations' is missing"),
        (_mask_space(), {"use_lstm": True}, "cannot be wrapped"),
    ],
)
def test_action_mask_misuse_is_explained(obs_space, config, match):
    with pytest.raises(ValueError, match=match):
        build_model(obs_space, gs.Discrete(4), {"custom_model": "action_mask", **config})


def test_action_mask_size_must_match_the_action_space():
    with pytest.raises(ValueError, match="action_mask has 4 entries.*takes 5"):
        build_model(_mask_space(), gs.Discrete(5), {"custom_model": "action_mask"})
