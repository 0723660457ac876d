"""Unit tests of the action distributions' catalog rule (which distribution a space gets,
its width and keyword arguments), the registry of custom distributions and the action
helpers; the package imports without torch.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from gymnasium import spaces as gs

from rlserve.models.distributions import (
    ActionDistribution,
    ActionDistSpec,
    MultiActionDistribution,
    UnknownActionDistError,
    UnsupportedActionSpaceError,
    get_action_dist,
    register_action_dist,
    unregister_action_dist,
)
from rlserve.models.distributions.actions import action_width, flatten_actions
from rlserve.models.spaces import Repeated, Simplex

from .distribution_helpers import _close, _inputs

# --------------------------------------------------------------------------- catalog

@pytest.mark.parametrize(
    "space,name,num",
    [
        (gs.Discrete(7, start=3), "TorchCategorical", 7),
        (gs.MultiDiscrete([2, 5]), "TorchMultiCategorical", 7),
        (gs.Box(-1, 1, (3,)), "TorchDiagGaussian", 6),
        (gs.Box(-1, 1, ()), "TorchDiagGaussian", 2),
        (gs.Box(0, 255, (2,), np.uint8), "TorchDiagGaussian", 4),  # RLlib tests dtype.name.startswith("int")
        (gs.Box(np.array([-1, 0]), np.array([2, 4]), dtype=np.int32), "TorchMultiCategorical", 12),
        (Simplex((5,)), "TorchDirichlet", 5),
        (gs.Dict({"b": gs.Discrete(2), "a": gs.Box(-1, 1, (2,))}), "TorchMultiActionDistribution", 6),
    ],
)
def test_catalog_rule(space, name, num):
    spec = get_action_dist(space, {"free_log_std": True})
    assert (spec.name, spec.num_outputs) == (name, num)
    back = ActionDistSpec.from_json(json.loads(json.dumps(spec.to_json())))
    assert back == spec
    assert back.build(np.zeros((2, num), np.float32)).entropy().shape[0] == 2


def test_int_box_uses_global_bounds_and_index_actions():
    spec = get_action_dist(gs.Box(np.array([-1, 0]), np.array([2, 4]), dtype=np.int64))
    assert spec.kwargs["input_lens"] == [6, 6]  # max(high) - min(low) + 1 for every element
    mode = spec.build(np.tile(np.eye(6, dtype=np.float32)[5] * 9, (1, 2))).deterministic_sample()
    np.testing.assert_array_equal(mode, [[5, 5]])  # indices, not values shifted by low


def test_dict_children_follow_sorted_keys_and_keep_space_order():
    space = gs.Dict([("z", gs.Discrete(3)), ("a", gs.Box(-1, 1, (2,))), ("m", gs.MultiDiscrete([2, 2]))])
    spec = get_action_dist(space)
    assert [c.name for c in spec.children] == ["TorchDiagGaussian", "TorchMultiCategorical", "TorchCategorical"]
    assert spec.kwargs["input_lens"] == [4, 4, 3]
    x = _inputs(5, spec.num_outputs)
    dist = spec.build(x)
    mode = dist.deterministic_sample()
    assert list(mode) == ["z", "a", "m"]
    np.testing.assert_array_equal(mode["z"], np.argmax(x[:, 8:11], axis=1))
    _close(mode["a"], x[:, :2])
    flat = flatten_actions(space, mode)  # a(2) | m(2) | z(1)
    _close(dist.logp(flat), dist.logp(mode))
    _close(dist.entropy(), sum(c.entropy() for c in dist.children))
    logp_sum = sum(c.logp(v) for c, v in zip(dist.children, (mode["a"], mode["m"], mode["z"]), strict=True))
    _close(dist.logp(mode), logp_sum)


def test_nested_tuple_actions():
    space = gs.Tuple([gs.Discrete(2), gs.Tuple([gs.Box(-1, 1, (1,)), gs.Discrete(3)])])
    spec = get_action_dist(space)
    assert spec.num_outputs == 2 + 2 + 3
    sample = spec.build(_inputs(4, 7)).sample(np.random.default_rng(0))
    assert isinstance(sample, tuple) and isinstance(sample[1], tuple) and sample[1][1].shape == (6,)
    assert action_width(space) == 3


@pytest.mark.parametrize(
    "space", [gs.MultiBinary(3), gs.Box(-1, 1, (2, 2)), Repeated(gs.Discrete(2), 3), gs.Tuple([gs.MultiBinary(2)])]
)
def test_unsupported_action_spaces(space):
    with pytest.raises(UnsupportedActionSpaceError, match="supported|dimension"):
        get_action_dist(space)


def test_explicit_dist_types():
    box = gs.Box(-1, 1, (3,))
    assert get_action_dist(box, dist_type="TorchSquashedGaussian").kwargs == {}
    assert get_action_dist(box, dist_type="deterministic").num_outputs == 3
    assert get_action_dist(box, dist_type="Beta", dist_kwargs={"low": -1, "high": 1}).kwargs == {"low": -1, "high": 1}
    with pytest.raises(ValueError, match="Box"):
        get_action_dist(gs.Discrete(3), dist_type="beta")
    with pytest.raises(ValueError, match="not a distribution"):
        get_action_dist(box, dist_type="gamma")
    with pytest.raises(ValueError, match="allowed"):
        get_action_dist(box, dist_type="beta", dist_kwargs={"scale": 2})


# --------------------------------------------------------------------------- registry

class SevenWay(ActionDistribution):
    """A custom distribution: uniform over 7 actions whatever the inputs."""

    @staticmethod
    def required_model_output_shape(action_space, model_config):
        return 7

    @classmethod
    def dist_kwargs(cls, action_space, model_config):
        return {"bias": model_config.get("custom_model_config", {}).get("bias", 0)}

    def __init__(self, inputs, bias=0):
        super().__init__(inputs)
        self.bias = bias

    def _sample(self, rng):
        return rng.integers(0, 7, size=self.batch_size) + self.bias

    def _mode(self):
        return np.full(self.batch_size, self.bias)

    def logp(self, actions):
        return np.full(self.batch_size, -math.log(7), np.float32)

    def entropy(self):
        return np.full(self.batch_size, math.log(7), np.float32)


class MyMulti(MultiActionDistribution):
    pass


@pytest.fixture
def registered():
    register_action_dist("seven", SevenWay)
    register_action_dist("my_multi", MyMulti)
    yield
    unregister_action_dist("seven")
    unregister_action_dist("my_multi")


def test_custom_action_dist(registered):
    config = {"custom_action_dist": "seven", "custom_model_config": {"bias": 2}}
    spec = get_action_dist(gs.Discrete(3), config)
    assert (spec.name, spec.num_outputs, spec.custom, spec.kwargs) == ("seven", 7, True, {"bias": 2})
    dist = ActionDistSpec.from_json(json.loads(json.dumps(spec.to_json()))).build(np.zeros((4, 7), np.float32))
    assert isinstance(dist, SevenWay) and list(dist.deterministic_sample()) == [2] * 4
    multi = get_action_dist(gs.Tuple([gs.Discrete(2), gs.Discrete(3)]), {"custom_action_dist": "my_multi"})
    assert multi.num_outputs == 5 and [c.name for c in multi.children] == ["TorchCategorical"] * 2
    assert isinstance(multi.build(np.zeros((1, 5), np.float32)), MyMulti)


def test_unknown_custom_name_lists_registered(registered):
    with pytest.raises(UnknownActionDistError) as info:
        get_action_dist(gs.Discrete(3), {"custom_action_dist": "nope"})
    # The names registered here, beside the built-in example dists (binary_autoreg_dist, ...).
    assert "'my_multi'" in str(info.value) and "'seven'" in str(info.value)
    assert "'binary_autoreg_dist'" in str(info.value)
    with pytest.raises(TypeError):
        register_action_dist("bad", dict)  # type: ignore[arg-type]


def test_package_is_torch_free():
    import subprocess
    import sys
    from pathlib import Path

    code = "import sys, rlserve.models.distributions; print('torch' in sys.modules)"
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root)
    assert out.stdout.strip() == "False", out.stderr
