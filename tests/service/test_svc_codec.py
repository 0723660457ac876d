"""The codec: JSON <-> space values, validation errors, and action encoding."""

from __future__ import annotations

import base64

import gymnasium.spaces as gs
import numpy as np
import pytest

from rlserve.models.distributions.actions import actions_to_json
from rlserve.models.spaces import Repeated, Simplex
from rlserve.service.errors import InvalidInput
from rlserve.service.step import codec

NESTED = gs.Dict({
    "pos": gs.Box(-1.0, 1.0, (2,), np.float32),
    "mode": gs.Discrete(3, start=1),
    "parts": gs.Tuple([gs.MultiDiscrete([2, 4]), gs.MultiBinary(3)]),
    "items": Repeated(gs.Box(0.0, 1.0, (2,), np.float32), max_len=3),
})


def test_nested_value_decodes_to_gymnasium_types():
    value = {"pos": [0.5, -0.5], "mode": 3, "parts": [[1, 3], [0, 1, 1]], "items": [[0.1, 0.2]]}
    out = codec.decode_value(NESTED, value, "observation")
    assert out["pos"].dtype == np.float32 and out["pos"].tolist() == [0.5, -0.5]
    assert out["mode"] == 3
    assert out["parts"][0].tolist() == [1, 3] and out["parts"][1].tolist() == [0, 1, 1]
    assert len(out["items"]) == 1 and out["items"][0].shape == (2,)
    assert NESTED.contains({**out, "parts": tuple(out["parts"])})


@pytest.mark.parametrize(
    ("value", "field", "fragment"),
    [
        ({"pos": [0.5], "mode": 1, "parts": [[1, 3], [0, 1, 1]], "items": []}, "observation.pos", "shape [2]"),
        (
            {"pos": [0.5, 0.1], "mode": 0, "parts": [[1, 3], [0, 1, 1]], "items": []},
            "observation.mode",
            "outside [1, 3]",
        ),
        ({"pos": [0.5, 0.1], "mode": 1, "parts": [[2, 3], [0, 1, 1]], "items": []}, "observation.parts[0]", "outside"),
        ({"pos": [0.5, 0.1], "mode": 1, "parts": [[1, 3], [0, 2, 1]], "items": []}, "observation.parts[1]", "0 or 1"),
        (
            {"pos": [0.5, 0.1], "mode": 1, "parts": [[1, 3], [0, 1, 1]], "items": [[0, 0]] * 4},
            "observation.items",
            "max_len",
        ),
        ({"pos": [0.5, 0.1], "mode": 1, "parts": [[1, 3], [0, 1, 1]]}, "observation", "missing keys ['items']"),
        ({"pos": ["a", 1], "mode": 1, "parts": [[1, 3], [0, 1, 1]], "items": []}, "observation.pos", "numbers"),
        ({"pos": [0.5, 0.1], "mode": True, "parts": [[1, 3], [0, 1, 1]], "items": []}, "observation.mode", "integer"),
    ],
)
def test_errors_name_the_field(value, field, fragment):
    with pytest.raises(InvalidInput) as info:
        codec.decode_value(NESTED, value, "observation")
    assert info.value.field == field
    assert fragment in info.value.message
    assert info.value.status == 422


@pytest.mark.filterwarnings("ignore:overflow encountered in cast")  # silenced in rlserve.service.step.codec too
def test_box_rejects_non_finite_and_ragged():
    box = gs.Box(-1.0, 1.0, (2, 2), np.float32)
    with pytest.raises(InvalidInput, match=r"nested lists of shape \[2, 2\]; the lists' lengths differ"):
        codec.decode_value(box, [[1, 2], [3]], "o")
    with pytest.raises(InvalidInput, match=r"expected finite numbers; element \[0, 0\] is 1e\+39, beyond the range "
                                           "of float32"):
        codec.decode_value(box, [[1e39, 0], [0, 0]], "o")  # overflows float32 to inf


@pytest.mark.parametrize(("value", "said"), [
    ([0.1, 0.2, "nan", 0.4], "expected finite numbers; element 2 is the string 'nan'"),
    ([0.1, None, 0.3, 0.4], "expected finite numbers; element 1 is null"),
    ([0.1, 0.2, 0.3, {"x": 1}], "expected finite numbers; element 3 is an object"),
    ([0.1, 0.2, 0.3, "x" * 5000], "expected finite numbers; element 3 is a string of 5000 characters"),
])
def test_what_is_no_number_is_said_in_json_terms(value, said):
    """Not numpy's dtype codes ('U', 'O'): the element and what it is, as JSON calls it."""
    box = gs.Box(-1.0, 1.0, (4,), np.float32)
    with pytest.raises(InvalidInput) as info:
        codec.decode_value(box, value, "observation")
    assert info.value.message == f"observation: {said}"
    assert len(info.value.body()) < 1024  # a long string is said by its length, not repeated
    with pytest.raises(InvalidInput) as info:  # a batch names the row too
        codec.decode_batch(box, [[0.0] * 4, value], "observations")
    assert info.value.message == f"observations[1]: {said}"


def test_a_nan_from_a_binary_block_is_named():
    box = gs.Box(-1.0, 1.0, (3,), np.float32)
    packed = {"b64": base64.b64encode(np.array([0, np.nan, 0], np.float32).tobytes()).decode(), "dtype": "float32",
              "shape": [3]}
    with pytest.raises(InvalidInput, match="expected finite numbers; element 1 is nan"):
        codec.decode_value(box, packed, "o")


def test_integer_box_refuses_fractions_and_overflow():
    box = gs.Box(0, 255, (2,), np.uint8)
    assert codec.decode_value(box, [0, 255], "o").dtype == np.uint8
    with pytest.raises(InvalidInput, match="integers"):
        codec.decode_value(box, [0.5, 1], "o")
    with pytest.raises(InvalidInput, match="range of uint8"):
        codec.decode_value(box, [256, 1], "o")


def test_base64_image_equals_list_form():
    space = gs.Box(0, 255, (4, 5, 3), np.uint8)
    img = np.random.default_rng(0).integers(0, 256, space.shape).astype(np.uint8)
    packed = {"b64": base64.b64encode(img.tobytes()).decode(), "dtype": "uint8", "shape": [4, 5, 3]}
    assert np.array_equal(codec.decode_value(space, packed, "o"), codec.decode_value(space, img.tolist(), "o"))


@pytest.mark.parametrize(
    ("patch", "fragment"),
    [({"shape": [5, 4, 3]}, "shape"), ({"b64": "!!!"}, "base64"), ({"dtype": "float32"}, "bytes"),
     ({"extra": 1}, "unknown keys"), ({"dtype": "str"}, "numeric")],
)
def test_base64_errors(patch, fragment):
    space = gs.Box(0, 255, (4, 5, 3), np.uint8)
    img = np.zeros(space.shape, np.uint8)
    packed = {"b64": base64.b64encode(img.tobytes()).decode(), "dtype": "uint8", "shape": [4, 5, 3], **patch}
    with pytest.raises(InvalidInput, match=fragment):
        codec.decode_value(space, packed, "o")


def test_decode_batch_stacks_boxes_and_names_the_bad_row():
    box = gs.Box(-1.0, 1.0, (3,), np.float32)
    stacked = codec.decode_batch(box, [[0, 0, 0], [1, 1, 1]], "observations")
    assert isinstance(stacked, np.ndarray) and stacked.shape == (2, 3) and stacked.dtype == np.float32
    with pytest.raises(InvalidInput) as info:
        codec.decode_batch(box, [[0, 0, 0], [1, 1]], "observations")
    assert info.value.field == "observations[1]"


def test_simplex_decodes():
    space = Simplex((3,))
    assert codec.decode_value(space, [0.2, 0.3, 0.5], "o").shape == (3,)


ACTION_SPACES = [
    gs.Discrete(4, start=2),
    gs.MultiDiscrete([2, 3], start=[1, -1]),
    gs.Box(-2, 2, (2,), np.int64),
    gs.Box(-1.0, 1.0, (3,), np.float32),
    gs.Tuple([gs.Discrete(2), gs.Box(-1.0, 1.0, (2,), np.float32)]),
    gs.Dict({"b": gs.Discrete(3), "a": gs.MultiDiscrete([2, 2])}),
]


def _model_space_batch(space, rng, n):
    """Random model-space actions (indices from 0 for the categorical kinds)."""
    if isinstance(space, gs.Discrete):
        return rng.integers(0, space.n, n)
    if isinstance(space, gs.MultiDiscrete):
        return rng.integers(0, space.nvec, (n, *space.nvec.shape))
    if isinstance(space, gs.Box) and space.dtype == np.int64:
        return rng.integers(0, 5, (n, *space.shape))
    if isinstance(space, gs.Box):
        return rng.standard_normal((n, *space.shape)).astype(np.float32)
    if isinstance(space, gs.Tuple):
        return tuple(_model_space_batch(s, rng, n) for s in space.spaces)
    return {k: _model_space_batch(s, rng, n) for k, s in space.spaces.items()}


@pytest.mark.parametrize("space", ACTION_SPACES, ids=lambda s: type(s).__name__)
def test_encode_batch_matches_the_distribution_helpers(space):
    rng = np.random.default_rng(1)
    batch = _model_space_batch(space, rng, 5)
    fast = codec.encode_batch(space, batch)
    reference = [actions_to_json(space, batch, row) for row in range(5)]
    assert fast == reference


def test_encode_batch_spells_non_finite_floats():
    space = gs.Box(-1.0, 1.0, (2,), np.float32)
    assert codec.encode_batch(space, np.array([[np.inf, np.nan]], np.float32)) == [["inf", "nan"]]
