"""Trajectory windows sent by a stateless request (``window`` / ``windows``).

A trajectory-view policy (its manifest's ``signature.views``, e.g. RLlib's frame-stacking
model) reads the last n observations, actions and rewards. A session keeps them on the
server; a request without a session may instead send them itself, per row:

    {"observations": [n_obs earlier raw observations, oldest first],
     "actions":      [n_act earlier actions, oldest first],
     "rewards":      [n_rew earlier rewards, oldest first]}

The current observation is ``observation`` as always. Each key is present exactly when the
model has that view, with exactly that many entries (RLlib's shifts: observations -(n-1)..-1,
actions and rewards -n..-1). Episode-start padding is the client's: RLlib repeats the first
observation and uses zeros for actions and rewards. Observations are checked and
preprocessed like ``observation``, actions like ``prev_action``, rewards as finite float32.
Rows without a window read the initial (episode start) windows, as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from rlserve.models.interface import ModelSignature
from rlserve.service.errors import InvalidInput

# data_col of a view -> the request key that carries it.
KEYS = {"obs": "observations", "actions": "actions", "rewards": "rewards"}


@dataclass(frozen=True)
class WindowLayout:
    """Which model inputs a sent window fills, and how long each part is."""

    lengths: dict[str, int]  # request key -> number of entries
    inputs: dict[str, str]  # request key -> model input name
    started: str | None  # model input set to 1 for a row with a sent obs window

    @staticmethod
    def from_signature(sig: ModelSignature) -> WindowLayout | None:
        if not sig.views:
            return None
        specs = {f"state_in_{i}": s for i, s in enumerate(sig.state)}
        lengths, inputs, started = {}, {}, None
        for view in sig.views.values():
            column, name = str(view.get("data_col")), view.get("input")
            key = KEYS.get(column)
            if key is None or name is None:
                continue
            inputs[key] = str(name)
            if name in specs:  # a window kept as session state (the observations)
                lengths[key] = int(specs[str(name)].shape[0])
                started = view.get("started_input", started)
            elif column == "actions":
                lengths[key] = sig.prev.n_prev_actions
            else:
                lengths[key] = sig.prev.n_prev_rewards
        return WindowLayout(lengths, inputs, None if started is None else str(started)) if inputs else None

    def expected(self) -> dict[str, str]:
        return {key: f"list of {n}" for key, n in self.lengths.items()}


def validate_window(value: Any, layout: WindowLayout | None, field: str, *, in_session: bool,
                    observation: Any, action: Any) -> dict[str, np.ndarray]:
    """One row's window as model-input rows; ``observation(raw, field)`` preprocesses one
    observation, ``action(raw, field)`` flattens one action (both raise ``InvalidInput``)."""
    if layout is None:
        raise InvalidInput(f"{field}: this model reads no trajectory window", field=field,
                           expected="no window", received="a window")
    if in_session:
        raise InvalidInput(f"{field}: a session keeps its own windows; send a window only without a session",
                           field=field, expected="no window with a session_id", received="a window")
    if not isinstance(value, dict) or set(value) != set(layout.lengths):
        received = sorted(value) if isinstance(value, dict) else type(value).__name__
        raise InvalidInput(f"{field}: expected an object with keys {sorted(layout.lengths)}", field=field,
                           expected=layout.expected(), received=received)
    out: dict[str, np.ndarray] = {}
    for key, n in layout.lengths.items():
        part, where = value[key], f"{field}.{key}"
        if not isinstance(part, list) or len(part) != n:
            raise InvalidInput(f"{where}: expected a list of {n} entries, oldest first", field=where,
                               expected=f"list of {n}",
                               received=f"list of {len(part)}" if isinstance(part, list) else type(part).__name__)
        if key == "observations":
            rows = [observation(x, f"{where}[{i}]") for i, x in enumerate(part)]
        elif key == "actions":
            rows = [action(x, f"{where}[{i}]") for i, x in enumerate(part)]
        else:
            rows = [_reward(x, f"{where}[{i}]") for i, x in enumerate(part)]
        out[layout.inputs[key]] = np.stack(rows).astype(np.float32)
    if layout.started is not None and layout.inputs.get("observations") in out:
        out[layout.started] = np.ones(1, np.float32)
    return out


def _reward(value: Any, field: str) -> np.ndarray:
    limit = float(np.finfo(np.float32).max)
    if isinstance(value, bool) or not isinstance(value, int | float) or not -limit <= value <= limit:
        raise InvalidInput(f"{field}: expected a number that is finite as float32", field=field,
                           expected=f"a number with |x| <= {limit:.8g}", received=value)
    return np.asarray(value, np.float32)


def apply_windows(inputs: dict[str, np.ndarray], windows: list[dict[str, np.ndarray] | None]) -> None:
    """Overwrite the gathered session inputs of the rows that sent a window (in place)."""
    for name in {name for w in windows if w for name in w}:
        column = np.array(inputs[name], copy=True)
        for row, window in enumerate(windows):
            if window and name in window:
                column[row] = window[name].reshape(column.shape[1:])
        inputs[name] = column
