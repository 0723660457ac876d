"""The column codec (service/step/columns.py): tensors per leaf validated like JSON values.

Properties over the shared space catalog: leaf columns built by the catalog's own
(independent) columnar encoder decode to observations the preprocessor turns into the
same model input as the sampled values themselves; ``action_columns`` holds exactly the
values ``codec.encode_batch`` writes as JSON. Refusals name the field and the row.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from gymnasium import spaces as gs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from unit import space_catalog

from rlserve.models.distributions.actions import actions_from_json
from rlserve.models.distributions.structure import (
    flatten_leaves,
    leaf_paths,
    leaf_spaces,
    path_str,
    unflatten_leaves,
)
from rlserve.models.preprocessors import get_preprocessor
from rlserve.models.spaces import Repeated
from rlserve.service.errors import InvalidInput
from rlserve.service.step import codec, columns


def _no_repeated(space: gs.Space) -> bool:
    if isinstance(space, Repeated):
        return False
    if isinstance(space, gs.Tuple):
        return all(_no_repeated(s) for s in space.spaces)
    if isinstance(space, gs.Dict):
        return all(_no_repeated(s) for s in space.spaces.values())
    return True


tensor_spaces = space_catalog.spaces.filter(_no_repeated)


def _leaf_columns(space: gs.Space, rows: list[Any]) -> list[np.ndarray]:
    """The catalog's columns (keyed 'a/0/b') in the flattened leaf order."""
    cols = space_catalog.to_columns(space, rows)
    return [cols[path_str(path)] for path in leaf_paths(space)]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(space=tensor_spaces, n=st.integers(1, 4), seed=st.integers(0, 2**16))
def test_decoded_columns_give_the_model_input_of_the_values_themselves(space, n, seed):
    rng = np.random.default_rng(seed)
    rows = [space_catalog.sample(space, rng) for _ in range(n)]
    leaves = [columns.decode_column(s, col, f"leaf{i}")
              for i, (s, col) in enumerate(zip(leaf_spaces(space), _leaf_columns(space, rows), strict=True))]
    decoded = columns.observations_from_columns(space, leaves)
    prep = get_preprocessor(space)
    np.testing.assert_array_equal(prep.transform_batch(decoded), prep.transform_batch(rows))


def _jsonable(value: Any) -> Any:
    if isinstance(value, tuple | list):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    return np.asarray(value).tolist()


action_spaces = st.recursive(
    st.one_of(space_catalog.boxes(), space_catalog.discretes(), space_catalog.multi_discretes()),
    lambda children: st.one_of(st.lists(children, min_size=1, max_size=3).map(gs.Tuple),
                               st.lists(children, min_size=1, max_size=3).map(
                                   lambda ss: gs.Dict({f"k{i}": s for i, s in enumerate(ss)}))),
    max_leaves=4)


@settings(max_examples=80, deadline=None)
@given(space=action_spaces, n=st.integers(1, 4), seed=st.integers(0, 2**16))
def test_action_columns_hold_what_the_json_encoder_writes(space, n, seed):
    rng = np.random.default_rng(seed)
    singles = [actions_from_json(space, _jsonable(space_catalog.sample(space, rng))) for _ in range(n)]
    per_leaf = zip(*(flatten_leaves(space, one) for one in singles), strict=True)
    batched = unflatten_leaves(space, [np.concatenate(leaf) for leaf in per_leaf])
    expected = codec.encode_batch(space, batched)
    got = columns.values_from_columns(space, columns.action_columns(space, batched))
    assert _jsonable(got) == _jsonable(expected)


# --------------------------------------------------------------------------- refusals

@pytest.mark.parametrize(("space", "column", "words"), [
    (gs.Box(-1.0, 1.0, (2,), np.float32), np.array([[0.0, 0.0], [np.inf, 0.0]]), ["finite", "row 1"]),
    (gs.Box(-1.0, 1.0, (2,), np.float32), np.zeros((2, 3), np.float32), ["shape [B, 2]"]),
    (gs.Box(0, 255, (2,), np.uint8), np.array([[1.5, 2.0]]), ["integers", "row 0"]),
    (gs.Box(0, 255, (2,), np.uint8), np.array([[1, 300]]), ["outside the range of uint8", "row 0 index [1]"]),
    (gs.Discrete(3, start=1), np.array([1, 2, 4]), ["row 2", "outside [1, 3]"]),
    (gs.Discrete(3), np.array([True, False]), ["booleans"]),
    (gs.MultiDiscrete([2, 3]), np.array([[1, 2], [2, 0]]), ["row 1 index [0]", "outside [0, 1]"]),
    (gs.MultiBinary(3), np.array([[0, 1, 2]]), ["0 or 1", "row 0 index [2]"]),
])
def test_refusals_name_the_field_and_the_row(space, column, words):
    with pytest.raises(InvalidInput) as info:
        columns.decode_column(space, column, "obs.x")
    assert info.value.field == "obs.x"
    assert info.value.message.startswith("obs.x: ")
    for word in words:
        assert word in info.value.message


def test_a_column_already_in_the_space_dtype_is_not_copied():
    column = np.zeros((64, 16), np.float32)
    assert columns.decode_column(gs.Box(-1.0, 1.0, (16,), np.float32), column, "obs") is column
