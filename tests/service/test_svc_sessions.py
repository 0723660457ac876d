"""Session slabs (gather/scatter by slot) and the session store (LRU, expiry, 404 vs 410)."""

from __future__ import annotations

import numpy as np
import pytest

from rlserve.models.interface import ModelSignature, PrevSpec, StateSpec
from rlserve.service.errors import SessionConflict, SessionExpired, SessionNotFound
from rlserve.service.sessions.slabs import STATELESS_SLOT, SessionSlabs
from rlserve.service.sessions.store import SessionStore

LSTM_SIG = ModelSignature(
    obs_shape=(4,),
    num_outputs=2,
    state=(StateSpec("h", (3,)), StateSpec("c", (3,), initial_value=0.5)),
    prev=PrevSpec(n_prev_actions=1, n_prev_rewards=1, action_width=2),
)
ATTN_SIG = ModelSignature(obs_shape=(4,), num_outputs=2, state=(StateSpec("memory_0", (3, 2)),),
                          prev=PrevSpec(n_prev_actions=3, n_prev_rewards=3, action_width=1, windowed=True))


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_initial_rows_and_stateless_slot():
    slabs = SessionSlabs(LSTM_SIG, capacity=4, max_capacity=8)
    inputs = slabs.gather(np.array([STATELESS_SLOT, 1]))
    assert inputs["state_in_0"].shape == (2, 3) and not inputs["state_in_0"].any()
    assert np.all(inputs["state_in_1"] == 0.5)
    assert inputs["prev_actions"].shape == (2, 2) and inputs["prev_rewards"].shape == (2,)


def test_scatter_then_gather_roundtrip_and_windows():
    slabs = SessionSlabs(ATTN_SIG, capacity=4, max_capacity=8)
    slots = np.array([1, 3])
    for step in range(4):
        memory = np.full((2, 3, 2), step, np.float32)
        slabs.scatter(slots, [memory], np.array([[10 + step], [20 + step]], np.float32))
        slabs.report(slots, np.array([step, -step], np.float32), None)
    got = slabs.gather(np.array([3, 1, STATELESS_SLOT]))
    assert np.all(got["state_in_0"][0] == 3) and np.all(got["state_in_0"][2] == 0)
    # Oldest first: the last three actions of slot 3 are 21, 22, 23.
    assert got["prev_actions"][0, :, 0].tolist() == [21, 22, 23]
    assert got["prev_rewards"][1].tolist() == [1, 2, 3]
    assert not got["prev_actions"][2].any()


def test_report_overrides_newest_action_and_reset_clears():
    slabs = SessionSlabs(LSTM_SIG, capacity=4, max_capacity=8)
    slots = np.array([2])
    slabs.scatter(slots, [np.ones((1, 3), np.float32), np.ones((1, 3), np.float32)], np.array([[0.1, 0.2]], np.float32))
    slabs.report(slots, None, np.array([[0.7, 0.8]], np.float32))
    assert slabs.gather(slots)["prev_actions"].tolist() == [[pytest.approx(0.7), pytest.approx(0.8)]]
    slabs.reset(slots)
    got = slabs.gather(slots)
    assert not got["state_in_0"].any() and np.all(got["state_in_1"] == 0.5) and not got["prev_actions"].any()


def test_growth_keeps_rows():
    slabs = SessionSlabs(LSTM_SIG, capacity=2, max_capacity=64)
    slabs.scatter(
        np.array([1]), [np.full((1, 3), 7, np.float32), np.full((1, 3), 8, np.float32)], np.zeros((1, 2), np.float32)
    )
    slabs.ensure_capacity(40)
    assert slabs.capacity >= 40
    assert slabs.gather(np.array([1]))["state_in_0"].tolist() == [[7, 7, 7]]
    with pytest.raises(ValueError):
        slabs.ensure_capacity(65)


def _store(**kw) -> tuple[SessionStore, Clock]:
    clock = Clock()
    kw.setdefault("max_sessions", 3)
    kw.setdefault("idle_ttl_s", 10.0)
    return SessionStore(LSTM_SIG, version="1", clock=clock, initial_slots=1, **kw), clock


def test_unknown_is_404_and_ended_is_410():
    store, _ = _store()
    with pytest.raises(SessionNotFound):
        store.get("nope")
    store.create("a")
    store.end("a")
    with pytest.raises(SessionExpired, match="ended"):
        store.get("a")


def test_idle_sessions_expire_with_410():
    store, clock = _store()
    store.create("a")
    clock.now += 11
    with pytest.raises(SessionExpired, match="idle"):
        store.get("a")
    assert len(store) == 0


def test_sweep_only_drops_stale_sessions():
    store, clock = _store()
    store.create("old")
    clock.now += 6
    store.create("young")
    clock.now += 6
    assert store.expire_idle() == 1
    assert store.ids() == ["young"]


def test_lru_eviction_spares_recent_and_in_flight_sessions():
    store, clock = _store()
    a, b, _ = store.create("a"), store.create("b"), store.create("c")
    a.inflight = 1  # least recently used, but a request is in flight
    clock.now += 1
    store.touch(b)
    store.create("d")  # LRU order is a, c, b; a is busy, so c goes
    assert set(store.ids()) == {"a", "b", "d"}
    with pytest.raises(SessionExpired, match="evicted"):
        store.get("c")
    assert store.evicted_total == 1


def test_slots_are_reused_and_distinct():
    store, _ = _store(max_sessions=5)
    sessions = [store.create(f"s{i}") for i in range(4)]
    slots = {s.slot for s in sessions}
    assert len(slots) == 4 and STATELESS_SLOT not in slots
    store.end("s1")
    again = store.create("s9")
    assert again.slot == sessions[1].slot


def test_slot_of_ended_in_flight_session_is_freed_on_release():
    store, _ = _store()
    s = store.create("a")
    s.inflight = 1
    store.end("a")
    fresh = store.create("b")
    assert fresh.slot != s.slot  # still owned by the in-flight request
    store.release(s)
    assert store.create("c").slot == s.slot


def test_duplicate_create_conflicts_and_seed_reproduces():
    store, _ = _store()
    s = store.create("a", seed=7)
    with pytest.raises(SessionConflict):
        store.create("a")
    assert s.rng.integers(1 << 30) == np.random.default_rng(7).integers(1 << 30)
    store.restart(s, seed=7)
    assert s.rng.integers(1 << 30) == np.random.default_rng(7).integers(1 << 30)


def test_recycled_slot_starts_from_the_initial_state():
    store, _ = _store()
    first = store.create("a")
    slabs = store.slabs
    slot = np.array([first.slot])
    slabs.scatter(slot, [np.full((1, 3), 9, np.float32), np.full((1, 3), 9, np.float32)], np.ones((1, 2), np.float32))
    store.end("a")
    second = store.create("b")
    assert second.slot == first.slot
    got = slabs.gather(np.array([second.slot]))
    assert not got["state_in_0"].any() and np.all(got["state_in_1"] == 0.5) and not got["prev_actions"].any()
