"""Per-session tensors kept in preallocated numpy slabs, one row ("slot") per session.

For a model with signature state ``S_i`` (per row ``shape_i``) and a previous-action window
of ``n`` actions of width ``A`` the slabs are::

    state[i]      (capacity, *shape_i)   recurrent / attention state fed back each step
    prev_actions  (capacity, n, A)       flattened actions, oldest first
    prev_rewards  (capacity, n)          rewards, oldest first

Slot 0 is never written after construction: it holds the initial values, so a stateless
row (a request without a session) gathers from slot 0 and scatters nowhere. Every
operation takes an index array of slots and is plain fancy indexing; there is no
per-session Python loop over tensors. A lock guards growth against a batch that runs in a
worker thread while the event loop creates sessions.
"""

from __future__ import annotations

import threading

import numpy as np

from rlserve.models.interface import ModelSignature

STATELESS_SLOT = 0


class SessionSlabs:
    """Slot-indexed state, previous actions and previous rewards of one model version."""

    def __init__(self, signature: ModelSignature, capacity: int, max_capacity: int):
        self.signature = signature
        self.lock = threading.Lock()
        self.max_capacity = max(int(max_capacity), 2)
        capacity = min(max(int(capacity), 2), self.max_capacity)
        self._initial = [np.full(s.shape, s.initial_value, dtype=s.dtype) for s in signature.state]
        prev = signature.prev
        self._n_actions, self._n_rewards = prev.n_prev_actions, prev.n_prev_rewards
        self._action_width = prev.action_width
        self.state: list[np.ndarray] = []
        self.prev_actions: np.ndarray | None = None
        self.prev_rewards: np.ndarray | None = None
        self._allocate(capacity)

    @property
    def capacity(self) -> int:
        return self._capacity

    def _allocate(self, capacity: int) -> None:
        old_state, old_actions, old_rewards = self.state, self.prev_actions, self.prev_rewards
        keep = getattr(self, "_capacity", 0)
        self.state = [np.empty((capacity, *init.shape), dtype=init.dtype) for init in self._initial]
        for slab, init in zip(self.state, self._initial, strict=True):
            slab[:] = init
        if self._n_actions:
            self.prev_actions = np.zeros((capacity, self._n_actions, self._action_width), np.float32)
        if self._n_rewards:
            self.prev_rewards = np.zeros((capacity, self._n_rewards), np.float32)
        for new, old in zip(self.state, old_state, strict=False):
            new[:keep] = old[:keep]
        if old_actions is not None and self.prev_actions is not None:
            self.prev_actions[:keep] = old_actions[:keep]
        if old_rewards is not None and self.prev_rewards is not None:
            self.prev_rewards[:keep] = old_rewards[:keep]
        self._capacity = capacity

    def ensure_capacity(self, slots_needed: int) -> None:
        """Grow (doubling, up to ``max_capacity``) so slot ``slots_needed - 1`` exists."""
        if slots_needed <= self._capacity:
            return
        if slots_needed > self.max_capacity:
            raise ValueError(f"{slots_needed} slots exceed the maximum {self.max_capacity}")
        capacity = self._capacity
        while capacity < slots_needed:
            capacity *= 2
        with self.lock:
            self._allocate(min(capacity, self.max_capacity))

    # ------------------------------------------------------------------ batch operations
    # Callers hold ``lock`` during each call (not across the runtime call between them):
    # growth copies the rows, so a scatter after a growth lands in the new slabs.

    def reset(self, slots: np.ndarray) -> None:
        """Episode start: initial state, zero previous actions and rewards. ``slots`` (K,)"""
        if not slots.size:
            return
        for slab, init in zip(self.state, self._initial, strict=True):
            slab[slots] = init
        if self.prev_actions is not None:
            self.prev_actions[slots] = 0.0
        if self.prev_rewards is not None:
            self.prev_rewards[slots] = 0.0

    def report(self, slots: np.ndarray, rewards: np.ndarray | None, actions: np.ndarray | None) -> None:
        """Overwrite the newest reward (K,) / action (K, A) with what the client reported."""
        if rewards is not None and self.prev_rewards is not None and slots.size:
            self.prev_rewards[slots, -1] = rewards
        if actions is not None and self.prev_actions is not None and slots.size:
            self.prev_actions[slots, -1] = actions

    def gather(self, slots: np.ndarray) -> dict[str, np.ndarray]:
        """Model inputs for rows ``slots`` (B,): state_in_i, prev_actions, prev_rewards."""
        inputs = {f"state_in_{i}": slab[slots] for i, slab in enumerate(self.state)}
        windowed = self.signature.prev.windowed
        if self.prev_actions is not None:
            window = self.prev_actions[slots]
            inputs["prev_actions"] = window if windowed else window[:, -1]
        if self.prev_rewards is not None:
            window = self.prev_rewards[slots]
            inputs["prev_rewards"] = window if windowed else window[:, -1]
        return inputs

    def scatter(self, slots: np.ndarray, state_out: list[np.ndarray], actions: np.ndarray | None) -> None:
        """Store the new state and push this step's actions (K, A) into the windows."""
        if not slots.size:
            return
        for slab, out in zip(self.state, state_out, strict=True):
            slab[slots] = out
        if self.prev_actions is not None and actions is not None:
            self.prev_actions[slots] = _push(self.prev_actions[slots], actions)
        if self.prev_rewards is not None:
            # The reward of this step arrives with the next observation (``report``).
            self.prev_rewards[slots] = _push(self.prev_rewards[slots], 0.0)


    # ------------------------------------------------------------------ whole rows (the external store)

    def rows(self, slots: np.ndarray) -> list[np.ndarray]:
        """Everything a session holds, for rows ``slots`` (K,): each state slab's rows, then the
        previous-action window (K, n, A) and reward window (K, n) when the model uses them.
        The order is ``rlserve.service.sessions.record.SessionLayout``'s."""
        rows = [slab[slots] for slab in self.state]
        if self.prev_actions is not None:
            rows.append(self.prev_actions[slots])
        if self.prev_rewards is not None:
            rows.append(self.prev_rewards[slots])
        return rows

    def put_rows(self, slots: np.ndarray, rows: list[np.ndarray]) -> None:
        """Overwrite rows ``slots`` (K,) with arrays in the order of ``rows``."""
        targets = [*self.state]
        if self.prev_actions is not None:
            targets.append(self.prev_actions)
        if self.prev_rewards is not None:
            targets.append(self.prev_rewards)
        for target, values in zip(targets, rows, strict=True):
            target[slots] = values


def _push(window: np.ndarray, newest: np.ndarray | float) -> np.ndarray:
    """Drop the oldest entry of each row's window (axis 1) and append ``newest``."""
    out = np.empty_like(window)
    out[:, :-1] = window[:, 1:]
    out[:, -1] = newest
    return out
