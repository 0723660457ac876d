"""Preprocessors: choice rules, outputs, batch = single, and error messages."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from gymnasium import spaces as gs
from hypothesis import given, settings
from hypothesis import strategies as st

from rlserve.models.preprocessors import (
    ObservationError,
    get_preprocessor,
    resize_area,
)
from rlserve.models.spaces import Repeated, Simplex

from .space_catalog import row_from_columns, sample, spaces, to_columns

PIXELS = gs.Box(0, 255, (210, 160, 3), dtype=np.uint8)


# --------------------------------------------------------------------------- batch = single

@settings(max_examples=150, deadline=None)
@given(spaces, st.integers(0, 2**31 - 1), st.integers(1, 5))
def test_batch_and_columns_equal_single_transform(space, seed, n) -> None:
    prep = get_preprocessor(space)
    rng = np.random.default_rng(seed)
    rows = [sample(space, rng) for _ in range(n)]
    single = np.stack([prep.transform(r) for r in rows])
    assert single.dtype == prep.output_dtype and single.shape == (n, *prep.output_shape)
    batch = prep.transform_batch(rows)
    columns = prep.transform_columns(to_columns(space, rows))
    np.testing.assert_array_equal(batch, single)
    np.testing.assert_array_equal(columns, single)
    assert batch.dtype == columns.dtype == prep.output_dtype


@settings(max_examples=60, deadline=None)
@given(spaces, st.integers(0, 2**31 - 1))
def test_columns_accept_any_leading_axes(space, seed) -> None:
    prep = get_preprocessor(space)
    rng = np.random.default_rng(seed)
    rows = [sample(space, rng) for _ in range(6)]
    cols = {k: v.reshape((2, 3, *v.shape[1:])) for k, v in to_columns(space, rows).items()}
    out = prep.transform_columns(cols)
    assert out.shape == (2, 3, *prep.output_shape)
    for t in range(2):
        for b in range(3):
            np.testing.assert_array_equal(out[t, b], prep.transform(row_from_columns(space, cols, (t, b))))


@settings(max_examples=100, deadline=None)
@given(spaces)
def test_layout_tiles_the_output(space) -> None:
    prep = get_preprocessor(space)
    end = 0
    for entry in prep.layout:
        assert entry["offset"] == end
        end += entry["size"]
    assert end == prep.size == int(np.prod(prep.output_shape))


# --------------------------------------------------------------------------- choice rules

@pytest.mark.parametrize(
    ("space", "name", "dtype"),
    [
        (gs.Discrete(4), "OneHotPreprocessor", np.float32),
        (gs.MultiDiscrete([2] * 128), "OneHotPreprocessor", np.float32),  # type before shape
        (gs.MultiBinary(128), "AtariRamPreprocessor", np.float32),  # shape before type
        (gs.Box(-1, 1, (128,), dtype=np.float32), "AtariRamPreprocessor", np.float32),
        (PIXELS, "GenericPixelPreprocessor", np.float64),
        (gs.Box(0, 1, (210, 160, 3), dtype=np.float32), "GenericPixelPreprocessor", np.float32),
        (gs.Box(0, 255, (84, 84, 3), dtype=np.uint8), "NoPreprocessor", np.uint8),
        (gs.MultiBinary(6), "NoPreprocessor", np.int8),
        (Simplex((3,)), "NoPreprocessor", np.float32),
        (gs.Tuple([gs.Discrete(2)]), "TupleFlatteningPreprocessor", np.float32),
        (gs.Dict({"a": gs.Discrete(2)}), "DictFlatteningPreprocessor", np.float32),
        (Repeated(gs.Discrete(2), 3), "RepeatedValuesPreprocessor", np.float64),
    ],
)
def test_choice_rules(space, name, dtype) -> None:
    prep = get_preprocessor(space)
    assert prep.name == name
    assert prep.output_dtype == np.dtype(dtype)


def test_observation_space_carries_original_space() -> None:
    space = gs.Dict({"a": gs.Discrete(3), "b": gs.Box(-1, 1, (2,))})
    obs_space = get_preprocessor(space).observation_space
    assert isinstance(obs_space, gs.Box) and obs_space.shape == (5,) and obs_space.dtype == np.float32
    assert obs_space.original_space is space
    raw = gs.Box(-1, 1, (3, 4))
    assert get_preprocessor(raw).observation_space is raw  # NoPreprocessor hands over the raw space
    assert not hasattr(get_preprocessor(raw).observation_space, "original_space")


def test_unsupported_space_is_rejected() -> None:
    with pytest.raises(ValueError, match="unsupported observation space Text"):
        get_preprocessor(gs.Text(5))


# --------------------------------------------------------------------------- outputs

def test_one_hot_subtracts_start() -> None:
    np.testing.assert_array_equal(get_preprocessor(gs.Discrete(3, start=-1)).transform(-1), [1, 0, 0])
    md = gs.MultiDiscrete([2, 3], start=[1, -1])
    np.testing.assert_array_equal(get_preprocessor(md).transform(np.array([2, 1])), [0, 1, 0, 0, 1])


def test_flattening_order_and_leaf_values() -> None:
    space = gs.Dict(
        [("z", gs.Box(-5, 5, (2,), dtype=np.float64)), ("a", gs.Tuple([gs.Discrete(2), gs.MultiBinary(2)]))]
    )
    out = get_preprocessor(space).transform({"a": (1, np.array([1, 0], np.int8)), "z": np.array([0.1, -3.0])})
    # the space's own key order (z first), float32 leaf values
    np.testing.assert_array_equal(out, np.array([0.1, -3.0, 0, 1, 1, 0], dtype=np.float32))
    assert out.dtype == np.float32


def test_box_bounds_are_not_enforced() -> None:
    out = get_preprocessor(gs.Box(-1, 1, (2,))).transform(np.array([5.0, -7.0]))
    np.testing.assert_array_equal(out, [5.0, -7.0])


def test_repeated_pads_with_zeros_not_one_hot_zero() -> None:
    space = Repeated(gs.Discrete(3, start=5), max_len=3)
    prep = get_preprocessor(space)
    expected = np.array([1, 0, 1, 0, 0, 0, 0, 0, 0, 0], dtype=np.float64)
    np.testing.assert_array_equal(prep.transform([6]), expected)
    np.testing.assert_array_equal(prep.transform([]), np.zeros(10))
    # Padding slots hold 0, outside Discrete(3, start=5): they are not validated.
    cols = {"__len__": np.array([1, 0]), "__items__": np.array([[6, 0, 0], [0, 0, 0]])}
    np.testing.assert_array_equal(prep.transform_columns(cols), np.stack([expected, np.zeros(10)]))


def test_repeated_keeps_float64_precision_of_nested_leaves() -> None:
    space = Repeated(gs.Dict({"x": gs.Box(-1, 1, (1,), dtype=np.float64)}), max_len=2)
    out = get_preprocessor(space).transform([{"x": np.array([0.1])}])
    assert out[1] == 0.1 and out.dtype == np.float64


def test_atari_ram_nested_in_dict() -> None:
    space = gs.Dict({"ram": gs.Box(0, 255, (128,), dtype=np.uint8), "d": gs.Discrete(2)})
    prep = get_preprocessor(space)
    assert [e["preprocessor"] for e in prep.layout] == ["OneHotPreprocessor", "AtariRamPreprocessor"]
    ram = np.arange(128, dtype=np.uint8) * 2
    out = prep.transform({"ram": ram, "d": 1})
    np.testing.assert_array_equal(out[2:], (ram.astype(np.float32) - 128) / 128)


def test_generic_pixel_nested_in_tuple_is_float32_of_top_level_output() -> None:
    frame = np.random.default_rng(1).integers(0, 256, (210, 160, 3), dtype=np.uint8)
    top = get_preprocessor(PIXELS).transform(frame)
    nested = get_preprocessor(gs.Tuple([gs.Discrete(2), PIXELS])).transform((0, frame))
    np.testing.assert_array_equal(nested[2:], top.ravel().astype(np.float32))


# --------------------------------------------------------------------------- pixels

def _exact_area(image: np.ndarray, dst: int) -> np.ndarray:
    """Exact rational area average of a square (S, S) image, as float64."""
    src = image.shape[0]
    weights = np.zeros((dst, src))
    for d in range(dst):
        lo, hi = Fraction(d * src, dst), Fraction((d + 1) * src, dst)
        for s in range(src):
            overlap = min(hi, s + 1) - max(lo, s)
            if overlap > 0:
                weights[d, s] = float(overlap / (hi - lo))
    return weights @ image.astype(np.float64) @ weights.T


@pytest.mark.parametrize("dst", [84, 100, 61, 40, 80])
def test_resize_area_is_the_rounded_exact_area_average(dst) -> None:
    image = np.random.default_rng(dst).integers(0, 256, (160, 160), dtype=np.uint8)
    ours = resize_area(image[None, :, :, None], dst, dst)[0, :, :, 0].astype(np.float64)
    exact = _exact_area(image, dst)
    not_a_tie = np.abs(exact - np.floor(exact) - 0.5) > 1e-3
    np.testing.assert_array_equal(ours[not_a_tie], np.rint(exact[not_a_tie]))
    assert np.abs(ours - exact).max() <= 0.5 + 1e-3


def test_resize_area_two_by_two_rounds_half_up() -> None:
    image = np.array([[[[1], [2]], [[1], [2]]]], dtype=np.uint8)  # mean 1.5
    assert resize_area(image, 1, 1).item() == 2
    image = np.array([[[[1], [2]], [[2], [2]]]], dtype=np.uint8)  # mean 1.75
    assert resize_area(image, 1, 1).item() == 2


def test_colour_zero_mean_wraps_in_uint8() -> None:
    frame = np.zeros((210, 160, 3), dtype=np.uint8)
    frame[..., 0], frame[..., 1], frame[..., 2] = 0, 127, 200
    out = get_preprocessor(PIXELS).transform(frame)
    assert out.shape == (84, 84, 3) and out.dtype == np.float64
    np.testing.assert_array_equal(out[0, 0], [(0 - 128) % 256 / 128, (127 - 128) % 256 / 128, (200 - 128) / 128])


def test_grayscale_dim42_goes_through_84() -> None:
    frame = np.random.default_rng(3).integers(0, 256, (210, 160, 3), dtype=np.uint8)
    out = get_preprocessor(PIXELS, {"dim": 42, "grayscale": True, "zero_mean": False}).transform(frame)
    assert out.shape == (42, 42, 1) and out.dtype == np.float32
    at84 = resize_area(frame[None, 25:-25], 84, 84)[0].astype(np.int32)
    blocks = at84.reshape(42, 2, 42, 2, 3).sum(axis=(1, 3))
    at42 = ((blocks + 2) >> 2).astype(np.float64)  # 2x2 means, rounded half up
    np.testing.assert_allclose(out[..., 0], (at42.mean(axis=2) / 255.0), rtol=1e-6)


def test_colour_without_zero_mean_is_float32_unit_range() -> None:
    # RLlib crashes here (SKIPPED.md); our defined result is the resized frame / 255.
    frame = np.full((210, 160, 3), 255, dtype=np.uint8)
    out = get_preprocessor(PIXELS, {"zero_mean": False}).transform(frame)
    assert out.dtype == np.float32 and out.shape == (84, 84, 3)
    np.testing.assert_allclose(out, 1.0, rtol=1e-6)


def test_pixel_space_dtype_and_dim_are_checked() -> None:
    with pytest.raises(ValueError, match="uint8, float32 or float64"):
        get_preprocessor(gs.Box(0, 255, (210, 160, 3), dtype=np.int64))
    with pytest.raises(ValueError, match="'dim'"):
        get_preprocessor(PIXELS, {"dim": 200})


# --------------------------------------------------------------------------- errors

NESTED = gs.Dict({
    "mode": gs.Discrete(3),
    "sensors": gs.Tuple([gs.Discrete(2), gs.Box(0, 1, (2,)), gs.Dict({"a": gs.Box(-1, 1, (1,)), "b": gs.Discrete(2)})]),
    "items": Repeated(gs.Discrete(2), 2),
})


def _good():
    return {"mode": 1, "sensors": (0, np.zeros(2), {"a": np.zeros(1), "b": 1}), "items": [1]}


def _with(**changes):
    obs = _good()
    obs.update(changes)
    return obs


@pytest.mark.parametrize(
    ("obs", "path", "received"),
    [
        (_with(sensors=(0, np.zeros(2), {"a": np.zeros(1), "b": 2})), "obs.sensors[2].b", "2"),
        (_with(mode=-1), "obs.mode", "-1"),
        (_with(mode=1.0), "obs.mode", "float"),
        (_with(mode=True), "obs.mode", "bool"),
        (_with(mode="1"), "obs.mode", "str"),
        (_with(sensors=(0, np.zeros(3), {"a": np.zeros(1), "b": 1})), "obs.sensors[1]", "shape (3,)"),
        (_with(sensors=(0, ["x", "y"], {"a": np.zeros(1), "b": 1})), "obs.sensors[1]", "dtype str"),
        (_with(sensors=(0, np.zeros(2))), "obs.sensors", "tuple of length 2"),
        (_with(items=[1, 0, 1]), "obs.items", "3 items"),
        (_with(items=[0, 5]), "obs.items[1]", "5"),
        (_with(items=7), "obs.items", "int 7"),
        ({k: v for k, v in _good().items() if k != "mode"}, "obs.mode", "no such key"),
        (_with(extra=1), "obs", "unexpected key(s) ['extra']"),
        ([1, 2], "obs", "list of length 2"),
    ],
)
def test_observation_errors_name_path_expected_and_received(obs, path, received) -> None:
    prep = get_preprocessor(NESTED)
    with pytest.raises(ObservationError) as info:
        prep.transform(obs)
    err = info.value
    assert isinstance(err, ValueError)
    assert err.path == path, str(err)
    assert received in err.received, str(err)
    assert err.expected and str(err).startswith(f"{path}: expected ")
    with pytest.raises(ObservationError) as batch_info:
        prep.transform_batch([_good(), obs])
    # A batch names Repeated items by "[*]" in the path and "item i" in what was received.
    assert batch_info.value.path == path.replace("items[1]", "items[*]")
    assert "batch row 1" in batch_info.value.received


def test_expected_describes_the_space() -> None:
    with pytest.raises(ObservationError) as info:
        get_preprocessor(NESTED).transform(_with(mode=3))
    assert info.value.expected == "Discrete(n=3): an integer in [0, 2]"


def test_multibinary_rejects_non_binary_values() -> None:
    with pytest.raises(ObservationError, match="MultiBinary"):
        get_preprocessor(gs.MultiBinary(3)).transform(np.array([0, 2, 1]))


def test_column_errors() -> None:
    prep = get_preprocessor(NESTED)
    cols = to_columns(NESTED, [_good(), _good()])
    bad = dict(cols, mode=np.array([0, 3]))
    with pytest.raises(ObservationError, match=r"obs.mode: .*3 \(batch row 1\)"):
        prep.transform_columns(bad)
    with pytest.raises(ObservationError, match="no such column"):
        prep.transform_columns({k: v for k, v in cols.items() if k != "mode"})
    with pytest.raises(ObservationError, match="unexpected column"):
        prep.transform_columns(dict(cols, other=np.zeros(2)))
    with pytest.raises(ObservationError, match="leading batch axes"):
        prep.transform_columns(dict(cols, mode=np.zeros(3, dtype=np.int64)))
    items = cols["items/__items__"].copy()
    items[1, 0] = 9
    with pytest.raises(ObservationError, match=r"obs.items\[\*\]: .*9 \(batch row 1, item 0\)"):
        prep.transform_columns(dict(cols, **{"items/__items__": items}))
    with pytest.raises(ObservationError, match=r"length in \[0, 2\]"):
        prep.transform_columns(dict(cols, **{"items/__len__": np.array([1, 3])}))
    with pytest.raises(ObservationError, match="dtype float64"):
        prep.transform_columns(dict(cols, mode=np.array([0.0, 1.0])))


def test_serving_modules_do_not_import_torch() -> None:
    import subprocess
    import sys
    from pathlib import Path

    code = (
        "import sys; import rlserve.models.preprocessors, rlserve.models.filters, rlserve.models.config, "
        "rlserve.models.spaces; "
        "bad = [m for m in sys.modules if m == 'torch' or m.startswith('torch.') or m == 'cv2']; "
        "assert not bad, bad"
    )
    root = Path(__file__).resolve().parents[2]
    result = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
