"""Trajectory windows sent by stateless rows (``rlserve.service.step.windows``) on their own:
the layout a signature's views make, each refusal naming its field, and the sent windows
written over the gathered session inputs of their rows only."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from rlserve.service.errors import InvalidInput
from rlserve.service.step.windows import WindowLayout, apply_windows, validate_window

# Two earlier observations (kept as state), one earlier action and one earlier reward.
LAYOUT = WindowLayout(lengths={"observations": 2, "actions": 1, "rewards": 1},
                      inputs={"observations": "state_in_0", "actions": "prev_actions", "rewards": "prev_rewards"},
                      started="obs_started")
GOOD = {"observations": [[0.1, 0.2], [0.3, 0.4]], "actions": [1], "rewards": [0.5]}


def observation(raw: Any, field: str) -> np.ndarray:
    """One observation of a Box(2), refused as the preparer refuses one."""
    if not (isinstance(raw, list) and len(raw) == 2):
        raise InvalidInput(f"{field}: expected shape [2]", field=field, expected="[2]", received=raw)
    return np.asarray(raw, np.float32)


def action(raw: Any, field: str) -> np.ndarray:
    """One action of a Discrete(3), flattened to its index."""
    if type(raw) is not int or not 0 <= raw < 3:
        raise InvalidInput(f"{field}: not in Discrete(3)", field=field, expected="Discrete(3)", received=raw)
    return np.asarray([raw], np.float32)


def window(value: Any, *, in_session: bool = False, layout: WindowLayout | None = LAYOUT) -> dict[str, np.ndarray]:
    return validate_window(value, layout, "windows[2]", in_session=in_session, observation=observation, action=action)


def test_a_window_becomes_the_model_inputs_it_fills():
    out = window(GOOD)
    assert set(out) == {"state_in_0", "prev_actions", "prev_rewards", "obs_started"}
    np.testing.assert_array_equal(out["state_in_0"], np.array([[0.1, 0.2], [0.3, 0.4]], np.float32))
    assert out["prev_actions"].tolist() == [[1.0]] and out["prev_rewards"].tolist() == [0.5]
    assert out["obs_started"].tolist() == [1.0]
    assert {a.dtype for a in out.values()} == {np.dtype(np.float32)}


@pytest.mark.parametrize(("value", "field", "words"), [
    ({"observations": [[0.1, 0.2], [0.3, 0.4]], "actions": [1]}, "windows[2]", "expected an object with keys"),
    ([1, 2], "windows[2]", "expected an object with keys"),
    ({**GOOD, "observations": [[0.1, 0.2]]}, "windows[2].observations", "expected a list of 2 entries"),
    ({**GOOD, "actions": 1}, "windows[2].actions", "expected a list of 1 entries"),
    ({**GOOD, "observations": [[0.1, 0.2], [0.3]]}, "windows[2].observations[1]", "expected shape [2]"),
    ({**GOOD, "actions": [3]}, "windows[2].actions[0]", "not in Discrete(3)"),
    ({**GOOD, "rewards": [1e39]}, "windows[2].rewards[0]", "finite as float32"),
    ({**GOOD, "rewards": [True]}, "windows[2].rewards[0]", "finite as float32"),
    ({**GOOD, "rewards": ["0.5"]}, "windows[2].rewards[0]", "finite as float32"),
])
def test_a_window_that_does_not_fit_is_refused_naming_the_entry(value, field, words):
    with pytest.raises(InvalidInput) as caught:
        window(value)
    assert caught.value.field == field and words in caught.value.message, caught.value.message


def test_a_window_with_a_session_or_for_a_model_without_views_is_refused():
    with pytest.raises(InvalidInput, match="a session keeps its own windows"):
        window(GOOD, in_session=True)
    with pytest.raises(InvalidInput, match="reads no trajectory window"):
        window(GOOD, layout=None)


def test_sent_windows_replace_only_their_rows_of_a_copy():
    gathered = {"state_in_0": np.zeros((3, 2, 2), np.float32), "prev_actions": np.full((3, 1), 7.0, np.float32),
                "prev_rewards": np.zeros((3, 1), np.float32), "obs_started": np.zeros(3, np.float32),
                "state_in_1": np.ones((3, 4), np.float32)}
    originals = {name: array.copy() for name, array in gathered.items()}
    inputs = dict(gathered)
    apply_windows(inputs, [None, window(GOOD), None])
    np.testing.assert_array_equal(inputs["state_in_0"][1], np.array([[0.1, 0.2], [0.3, 0.4]], np.float32))
    np.testing.assert_array_equal(inputs["state_in_0"][[0, 2]], originals["state_in_0"][[0, 2]])
    assert inputs["prev_actions"].tolist() == [[7.0], [1.0], [7.0]]
    assert inputs["prev_rewards"].tolist() == [[0.0], [0.5], [0.0]] and inputs["obs_started"].tolist() == [0, 1, 0]
    assert inputs["state_in_1"] is gathered["state_in_1"]  # an input no window fills is not copied
    for name, array in gathered.items():  # the gathered arrays (the session slabs' rows) are untouched
        np.testing.assert_array_equal(array, originals[name])
