"""prev_action_from_json: a reported previous action is what the model saw (RLlib's raw
sampled action), so float Box leaves are not held to the bounds; everything else is."""

from __future__ import annotations

import gymnasium.spaces as gs
import numpy as np
import pytest

from rlserve.models.distributions import actions_from_json, flatten_actions, prev_action_from_json

BOX = gs.Box(-2.0, 2.0, (1,), np.float32)


def test_a_raw_box_action_outside_the_bounds_is_accepted_as_previous_action() -> None:
    with pytest.raises(ValueError, match="is not in Box"):
        actions_from_json(BOX, [2.84])
    batch = prev_action_from_json(BOX, [2.84])
    np.testing.assert_array_equal(flatten_actions(BOX, batch), np.array([[2.84]], np.float32))


@pytest.mark.parametrize(("value", "message"), [
    (["nan"], "expected finite numbers"),
    ([1.0, 2.0], r"expected shape \[1\]"),
    ("left", "expected a number"),
])
def test_shape_dtype_and_finiteness_are_still_checked(value, message) -> None:
    with pytest.raises(ValueError, match=message):
        prev_action_from_json(BOX, value)


def test_discrete_and_structured_leaves_keep_their_checks() -> None:
    space = gs.Dict({"move": gs.Box(-1.0, 1.0, (2,), np.float32), "pick": gs.Discrete(3, start=1)})
    batch = prev_action_from_json(space, {"move": [1.5, -3.0], "pick": 3})
    assert batch["pick"].tolist() == [2]  # env value 3 = index 2, as actions_from_json
    np.testing.assert_array_equal(batch["move"], np.array([[1.5, -3.0]], np.float32))
    with pytest.raises(ValueError, match="is not in Discrete"):
        prev_action_from_json(space, {"move": [0.0, 0.0], "pick": 4})
    with pytest.raises(ValueError, match="is not in MultiBinary"):
        prev_action_from_json(gs.MultiBinary(2), [0, 2])
