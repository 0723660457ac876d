"""Catalog choice, feedforward network properties and the defined behaviour of configs RLlib crashes on."""

from __future__ import annotations

import ast
from collections import OrderedDict

import gymnasium.spaces as gs
import numpy as np
import pytest
import torch

from rlserve.models.catalog import build_model, describe_model
from rlserve.models.networks.complex_input import (
    FLATTEN,
    IMAGE,
    ONE_HOT,
    ComplexInputNetwork,
    components_for,
)
from rlserve.models.networks.fcnet import FullyConnectedNetwork
from rlserve.models.networks.visionnet import VisionNetwork
from rlserve.models.spaces import Repeated

torch.set_num_threads(1)
DISCRETE3 = gs.Discrete(3)
SMALL_FILTERS = [[4, [4, 4], 2], [8, [4, 4], 2], [8, [11, 11], 1]]  # 42x42 -> 1x1


def _box(*shape: int) -> gs.Box:
    return gs.Box(-1.0, 1.0, shape, np.float32)


IMAGE_DICT = gs.Dict({"img": gs.Box(0, 255, (42, 42, 3), np.uint8), "pos": _box(3), "mode": gs.Discrete(4)})

SELECTION = [
    (_box(4), {}, "FullyConnectedNetwork"),
    (gs.Discrete(5), {}, "FullyConnectedNetwork"),
    (gs.MultiDiscrete([3, 2]), {}, "FullyConnectedNetwork"),
    (gs.Tuple((_box(2), gs.Discrete(3))), {}, "FullyConnectedNetwork"),
    (Repeated(_box(2), max_len=3), {}, "FullyConnectedNetwork"),
    (gs.Box(0, 255, (128,), np.uint8), {}, "FullyConnectedNetwork"),
    (gs.Box(0, 255, (84, 84, 3), np.uint8), {}, "VisionNetwork"),
    (gs.Box(0, 255, (210, 160, 3), np.uint8), {}, "VisionNetwork"),
    (_box(3, 4), {}, "ComplexInputNetwork"),
    (gs.MultiBinary(6), {}, "ComplexInputNetwork"),
    (IMAGE_DICT, {"conv_filters": SMALL_FILTERS}, "ComplexInputNetwork"),
    (gs.Dict({"a": _box(2, 2), "b": _box(1)}), {}, "ComplexInputNetwork"),
    # RLlib fails on these two (it sizes sub-models by the raw leaf); ours use the preprocessed leaf.
    (gs.Dict({"frame": gs.Box(0, 255, (210, 160, 3), np.uint8), "v": _box(2)}), {}, "ComplexInputNetwork"),
    (gs.Tuple((gs.Box(0, 1, (10, 10, 1)), Repeated(gs.Discrete(2), max_len=3))), {}, "ComplexInputNetwork"),
    (_box(4), {"use_lstm": True}, "FullyConnectedNetwork_as_LSTMWrapper"),
    (_box(4), {"use_attention": True}, "FullyConnectedNetwork_as_AttentionWrapper"),
    (gs.Box(0, 1, (42, 42, 1), np.float32), {"use_lstm": True, "conv_filters": SMALL_FILTERS},
     "VisionNetwork_as_LSTMWrapper"),
]


@pytest.mark.parametrize(("obs_space", "config", "expected"), SELECTION)
def test_model_selection(obs_space, config, expected):
    assert describe_model(obs_space, DISCRETE3, config) == expected
    model = build_model(obs_space, DISCRETE3, config)
    base = getattr(model, "base", model)
    assert expected.startswith(type(base).__name__)
    assert model.num_outputs == 3


@pytest.mark.parametrize(("obs_space", "config", "expected"), [s for s in SELECTION if "_as_" not in s[2]])
def test_batch_equals_single_rows(obs_space, config, expected):
    model = build_model(obs_space, DISCRETE3, config).eval()
    obs = torch.rand((5, *model.signature().obs_shape)) * 2 - 1
    with torch.no_grad():
        out, value = model(obs)
        rows = [model(obs[i : i + 1]) for i in range(5)]
    assert out.shape == (5, 3) and value.shape == (5,)
    torch.testing.assert_close(out, torch.cat([r[0] for r in rows]), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(value, torch.cat([r[1] for r in rows]), rtol=1e-6, atol=1e-6)


def test_both_wrappers_is_an_error():
    with pytest.raises(ValueError, match="use_lstm"):
        build_model(_box(4), DISCRETE3, {"use_lstm": True, "use_attention": True})


def test_fcnet_rllib_initialisation():
    model = FullyConnectedNetwork(6, 4, {"fcnet_hiddens": [32, 16], "fcnet_activation": "relu"})
    norms = {name: p.detach().norm(dim=1) for name, p in model.named_parameters() if p.dim() == 2}
    torch.testing.assert_close(norms["_hidden_layers.0._model.0.weight"], torch.ones(32))
    torch.testing.assert_close(norms["_logits._model.0.weight"], torch.full((4,), 0.01))
    torch.testing.assert_close(norms["_value_branch._model.0.weight"], torch.full((1,), 0.01))
    assert all(float(p.detach().abs().sum()) == 0 for n, p in model.named_parameters() if n.endswith("bias"))


def test_fcnet_without_head_outputs_last_hidden_layer():
    model = FullyConnectedNetwork(5, None, {"fcnet_hiddens": [8, 7], "fcnet_activation": "tanh"})
    assert model.num_outputs == 7
    obs = torch.randn(3, 5)
    out, _ = model(obs)
    expected = obs
    for layer in model._hidden_layers:
        linear = layer._model[0]
        expected = torch.tanh(expected @ linear.weight.T + linear.bias)
    torch.testing.assert_close(out, expected)


def test_fcnet_free_log_std_appends_parameter():
    model = FullyConnectedNetwork(4, 6, {"fcnet_hiddens": [8], "free_log_std": True})
    with torch.no_grad():
        model._append_free_log_std.log_std.copy_(torch.tensor([0.1, 0.2, 0.3]))
        out, _ = model(torch.randn(2, 4))
    assert out.shape == (2, 6)
    torch.testing.assert_close(out[:, 3:], torch.tensor([[0.1, 0.2, 0.3]] * 2))


@pytest.mark.parametrize(
    ("config", "num_outputs", "match"),
    [
        ({"free_log_std": True}, None, "known num_outputs"),
        ({"free_log_std": True}, 5, "even num_outputs"),
        ({"free_log_std": True, "no_final_linear": True}, 4, "no_final_linear"),
        ({"no_final_linear": True, "vf_share_layers": False, "fcnet_hiddens": [8]}, 3, "value tower"),
    ],
)
def test_fcnet_configs_rllib_crashes_on(config, num_outputs, match):
    with pytest.raises(ValueError, match=match):
        FullyConnectedNetwork(4, num_outputs, config)


def test_free_log_std_under_lstm_is_a_clear_error():
    with pytest.raises(ValueError, match="free_log_std"):
        build_model(_box(4), gs.Box(-1, 1, (2,), np.float32), {"free_log_std": True, "use_lstm": True})


def test_vision_default_64x64_error_names_sizes_and_a_working_setting():
    space = gs.Box(0.0, 1.0, (64, 64, 1), np.float32)
    with pytest.raises(ValueError) as info:
        build_model(space, DISCRETE3, {})
    message = str(info.value)
    assert "3x3" in message and "64x64" in message and "8x8" in message
    suggestion = ast.literal_eval(message.split("conv_filters=")[1].split(" would work")[0])
    assert suggestion == [[16, [4, 4], 2], [32, [4, 4], 2], [64, [4, 4], 2], [128, [8, 8], 1]]
    model = build_model(space, DISCRETE3, {"conv_filters": suggestion})
    out, value = model(torch.rand(2, 64, 64, 1))
    assert out.shape == (2, 3) and value.shape == (2,)


def test_vision_without_default_filters_names_known_shapes():
    with pytest.raises(ValueError, match=r"no default for observation shape \[50, 50, 3\].*\[84, 84, K\]"):
        build_model(gs.Box(0.0, 1.0, (50, 50, 3), np.float32), DISCRETE3, {})


@pytest.mark.parametrize(
    ("config", "match"),
    [
        ({"post_fcnet_hiddens": [32, 16], "vf_share_layers": True}, "vf_share_layers=False"),
        ({"post_fcnet_hiddens": [32], "no_final_linear": True, "vf_share_layers": False}, "no_final_linear"),
    ],
)
def test_vision_configs_rllib_crashes_on(config, match):
    with pytest.raises(ValueError, match=match):
        VisionNetwork((42, 42, 3), 3, {"conv_filters": SMALL_FILTERS, **config})


def test_vision_same_padding_and_valid_last_conv():
    model = VisionNetwork((42, 42, 3), 3, {"conv_filters": SMALL_FILTERS, "vf_share_layers": True})
    pads = [m._model[0].padding for m in model._convs[:2]]
    # 42 -> 21 with k4 s2: total pad (21-1)*2+4-42 = 2 -> 1/1; 21 -> 11: (11-1)*2+4-21 = 3 -> 1/2.
    assert pads == [(1, 1, 1, 1), (1, 2, 1, 2)]
    assert isinstance(model._convs[2]._model[0], torch.nn.Conv2d)
    assert isinstance(model._logits._model[0], torch.nn.ZeroPad2d)


def test_vision_no_final_linear_gives_relu_logits():
    # Through the catalog: conv_activation comes from MODEL_DEFAULTS ("relu").
    model = build_model(gs.Box(-1, 1, (42, 42, 3)), DISCRETE3, {"conv_filters": SMALL_FILTERS, "no_final_linear": True})
    out, _ = model(torch.randn(4, 42, 42, 3))
    assert out.shape == (4, 3) and bool((out >= 0).all())


def test_complex_components_follow_sorted_keys_with_preprocessor_offsets():
    # Space order z, a, m: the preprocessor writes z first, RLlib's sub-models follow sorted keys.
    space = gs.Dict(OrderedDict([("z", _box(3)), ("a", gs.Discrete(2)), ("m", gs.Box(0, 1, (10, 10, 1)))]))
    components = components_for(space)
    assert [(c.kind, c.offset, c.shape) for c in components] == [
        (ONE_HOT, 3, (2,)),
        (IMAGE, 5, (10, 10, 1)),
        (FLATTEN, 0, (3,)),
    ]


def test_complex_input_registers_aliases_once():
    model = ComplexInputNetwork(_box(5), 2, {"fcnet_hiddens": [4]}, components_for(gs.Tuple((_box(3), gs.Discrete(2)))))
    keys = list(model.state_dict())
    assert any(k.startswith("flatten.0.") for k in keys) and any(k.startswith("one_hot.1.") for k in keys)
    assert not any(k.startswith(("flatten_0.", "one_hot_1.")) for k in keys)
    assert model.rllib_aliases == {"flatten.0.": ("flatten_0.",), "one_hot.1.": ("one_hot_1.",)}


def test_models_trace_like_eager():
    for space, config in [(_box(4), {}), (gs.Box(0, 1, (42, 42, 3)), {"conv_filters": SMALL_FILTERS}),
                          (IMAGE_DICT, {"conv_filters": SMALL_FILTERS})]:
        model = build_model(space, DISCRETE3, config).eval()
        obs = torch.rand((3, *model.signature().obs_shape))
        with torch.no_grad():
            traced = torch.jit.trace(model, (obs,))
            wider = torch.rand((5, *model.signature().obs_shape))
            for got, want in zip(traced(wider), model(wider), strict=True):
                torch.testing.assert_close(got, want)


def test_vision_without_head_flattens_any_map_and_has_no_value():
    # The wrappers' base: num_outputs=None flattens; RLlib's value_function() fails on a
    # non-1x1 map, here the value is NaN (wrappers never read it).
    model = VisionNetwork(
        (10, 10, 1), None, {"conv_filters": [[4, [3, 3], 2], [6, [3, 3], 1]], "vf_share_layers": True}
    )
    assert model.num_outputs == 6 * 3 * 3
    out, value = model(torch.rand(2, 10, 10, 1))
    assert out.shape == (2, 54) and bool(value.isnan().all())


def test_complex_input_sizes_sub_models_by_preprocessed_leaves():
    space = gs.Dict({"frame": gs.Box(0, 255, (210, 160, 3), np.uint8), "v": _box(2)})
    base = build_model(space, DISCRETE3, {}).base
    assert base.components[0].shape == (84, 84, 3) and base.components[1].offset == 84 * 84 * 3
    assert isinstance(base.cnns["0"], VisionNetwork) and base.cnns["0"].num_outputs == 256
