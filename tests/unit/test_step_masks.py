"""Action masks of the step layer (``rlserve.service.step.masks``) on their own: where a mask's
columns land in the dist inputs for each kind of action space, which rows are refused, and
what applying one does to the logits (and leaves alone)."""

from __future__ import annotations

import gymnasium.spaces as gs
import numpy as np
import pytest

from rlserve.models.config import merge_model_config
from rlserve.models.distributions import get_action_dist
from rlserve.models.distributions.masking import FLOAT_MIN
from rlserve.service.errors import AllActionsMasked, InvalidInput
from rlserve.service.step.masks import apply_mask, mask_layout, validate_mask

# Discrete(2), a Box(2) (DiagGaussian: 2 means, 2 log stds), Discrete(3): dist inputs 2 + 4 + 3.
TUPLE = gs.Tuple([gs.Discrete(2), gs.Box(-1.0, 1.0, (2,), np.float32), gs.Discrete(3)])


def layout_of(space: gs.Space):
    return mask_layout(get_action_dist(space, merge_model_config({}, space)))


@pytest.mark.parametrize(("space", "columns", "blocks"), [
    (gs.Discrete(3), [0, 1, 2], [("action", 0, 3)]),
    (gs.MultiDiscrete([2, 3]), [0, 1, 2, 3, 4], [("component 0", 0, 2), ("component 1", 2, 5)]),
    (TUPLE, [0, 1, 6, 7, 8], [("leaf '0'", 0, 2), ("leaf '2'", 2, 5)]),
])
def test_the_layout_covers_the_categorical_blocks_only(space, columns, blocks):
    layout = layout_of(space)
    assert layout.columns.tolist() == columns and layout.blocks == blocks and layout.width == len(columns)


def test_continuous_actions_have_no_layout_and_refuse_a_mask():
    layout = layout_of(gs.Box(-1.0, 1.0, (2,), np.float32))
    assert layout is None
    with pytest.raises(InvalidInput) as caught:
        validate_mask([1, 0], layout, "action_mask")
    assert caught.value.field == "action_mask" and "no categorical part" in caught.value.message


@pytest.mark.parametrize("value", [[1, 0, 1, 1, 0], [True, False, True, True, False], [1.0, 0.0, 1.0, 1.0, 0.0]])
def test_a_valid_mask_is_one_bool_row(value):
    mask = validate_mask(value, layout_of(TUPLE), "action_masks[3]")
    assert mask.dtype == bool and mask.tolist() == [True, False, True, True, False]


@pytest.mark.parametrize("value", [[1, 0, 1, 1], [1, 0, 1, 1, 0, 1], [1, 0, 1, 1, 0.5], [[1, 0, 1, 1, 0]],
                                   ["1", "0", "1", "1", "0"], None, "10110", {"a": 1}])
def test_a_malformed_mask_is_refused_naming_its_field(value):
    with pytest.raises(InvalidInput) as caught:
        validate_mask(value, layout_of(TUPLE), "action_masks[3]")
    assert caught.value.status == 422 and caught.value.field == "action_masks[3]"
    assert caught.value.expected == "list of 5 zeros/ones"


def test_a_mask_that_excludes_every_choice_of_one_block_is_refused_by_that_block():
    with pytest.raises(AllActionsMasked) as caught:
        validate_mask([1, 0, 0, 0, 0], layout_of(TUPLE), "action_mask")
    assert "every choice of leaf '2'" in caught.value.message and caught.value.received == [0, 0, 0]
    with pytest.raises(AllActionsMasked) as caught:
        validate_mask([0, 0, 0], layout_of(gs.Discrete(3)), "action_mask")
    assert "the mask excludes every action" in caught.value.message


def test_applying_a_mask_sets_masked_logits_only_and_twice_is_once():
    layout = layout_of(TUPLE)
    logits = np.arange(18, dtype=np.float32).reshape(2, 9)
    mask = np.array([[True, False, True, True, False], [False, True, True, True, True]])
    out = apply_mask(logits, mask, layout)
    assert out is not logits and logits[0, 1] == 1.0  # the input is left as it was
    expected = logits.copy()
    expected[0, [1, 8]] = FLOAT_MIN
    expected[1, [0]] = FLOAT_MIN
    np.testing.assert_array_equal(out, expected)  # the Gaussian's inputs (columns 2-5) untouched
    np.testing.assert_array_equal(apply_mask(out, mask, layout), out)  # no -inf from masking twice
