"""Space JSON codec: round trips over a catalog of spaces, path-named errors, fixture spaces."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from gymnasium import spaces as gs
from hypothesis import given, settings
from oracle import case_names, load_case

from rlserve.models.spaces import Repeated, Simplex, space_from_json, space_to_json, spaces_equal

from .space_catalog import spaces


@settings(max_examples=300, deadline=None)
@given(spaces)
def test_json_round_trip_is_identity(space: gs.Space) -> None:
    encoded = space_to_json(space)
    text = json.dumps(encoded, allow_nan=False)  # non-finite bounds must be strings
    decoded = space_from_json(json.loads(text))
    assert spaces_equal(decoded, space)
    assert space_to_json(decoded) == encoded
    assert type(decoded) is type(space)
    if not isinstance(space, Repeated | gs.Tuple | gs.Dict):
        assert decoded.shape == space.shape
        assert np.dtype(decoded.dtype) == np.dtype(space.dtype)


@settings(max_examples=100, deadline=None)
@given(spaces)
def test_gymnasium_equality_survives_round_trip(space: gs.Space) -> None:
    decoded = space_from_json(space_to_json(space))
    # gymnasium's own __eq__ (and ours for Repeated/Simplex) agrees with the codec.
    assert decoded == space


def test_dict_keeps_recorded_key_order() -> None:
    node = {"type": "Dict", "keys": ["z", "a"], "spaces": {
        "a": {"type": "Discrete", "n": 2}, "z": {"type": "Discrete", "n": 3}}}
    assert list(space_from_json(node).spaces) == ["z", "a"]


def test_box_bounds_encoding() -> None:
    box = gs.Box(low=np.array([-np.inf, 0.0], dtype=np.float32), high=np.float32(np.inf), dtype=np.float32)
    node = space_to_json(box)
    assert node["low"] == ["-inf", 0.0] and node["high"] == "inf"
    int_box = gs.Box(low=-1, high=3, shape=(2, 2), dtype=np.int64)
    assert space_to_json(int_box)["low"] == -1 and space_to_json(int_box)["dtype"] == "int64"
    decoded = space_from_json(space_to_json(box))
    assert math.isinf(decoded.low[0]) and decoded.low[1] == 0.0


def test_simplex_and_repeated_round_trip() -> None:
    space = Repeated(gs.Dict({"s": Simplex((2, 3), [1.0, 2.0, 3.0])}), max_len=5)
    assert space_from_json(space_to_json(space)) == space


@pytest.mark.parametrize(
    ("node", "path"),
    [
        ({"type": "Dict", "keys": ["pos"], "spaces": {"pos": {"type": "Box", "low": "x", "high": 1, "shape": [2]}}},
         "$.spaces.pos.low"),
        ({"type": "Tuple", "spaces": [{"type": "Discrete", "n": 2}, {"type": "Discrete", "n": 0}]}, "$.spaces[1].n"),
        ({"type": "Repeated", "child_space": {"type": "Box", "low": 0, "high": 1, "shape": [2], "dtype": "nope"},
          "max_len": 2}, "$.child_space.dtype"),
        ({"type": "Box", "low": [0, 0, 0], "high": 1, "shape": [2]}, "$.low"),
        ({"type": "Box", "low": 0, "high": 1}, "$"),
        ({"type": "Teapot"}, "$.type"),
        ({"type": "Repeated", "child_space": {"type": "Discrete", "n": 2}, "max_len": 0}, "$.max_len"),
        ({"type": "Dict", "keys": ["a", "b"], "spaces": {"a": {"type": "Discrete", "n": 2}}}, "$.keys"),
        ({"type": "MultiDiscrete", "nvec": [2, -1]}, "$.nvec[1]"),
        ({"type": "Tuple", "spaces": [5]}, "$.spaces[0]"),
    ],
)
def test_malformed_json_names_the_bad_node(node: dict, path: str) -> None:
    with pytest.raises(ValueError) as info:
        space_from_json(node)
    assert str(info.value).startswith(path + ":"), str(info.value)


def test_every_fixture_space_loads_and_round_trips() -> None:
    names = case_names()
    assert names, "no oracle cases found"
    for name in names:
        meta = load_case(name).meta
        for key in ("observation_space", "action_space", "model_obs_space"):
            node = meta.get(key)
            if node is None:
                continue
            node = {k: v for k, v in node.items() if k != "has_original_space"}
            space = space_from_json(node)
            assert space_to_json(space) == node, f"{name}.{key}"
