"""The session lifecycle of one model name (``SessionLifecycle``), without HTTP: bind, release,
end, the routes' create / import, in-flight checks and one id on one version, over real
in-process stores of two versions."""

from __future__ import annotations

import asyncio

import pytest

from rlserve.models.interface import ModelSignature, PrevSpec, StateSpec
from rlserve.service.errors import SessionBusy, SessionConflict, SessionExpired, SessionNotFound
from rlserve.service.sessions.lifecycle import SessionLifecycle
from rlserve.service.sessions.store import SessionStore

SIG = ModelSignature(obs_shape=(4,), num_outputs=2, state=(StateSpec("h", (3,)),),
                     prev=PrevSpec(n_prev_actions=1, n_prev_rewards=1, action_width=2))


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def _store(version: str, clock: Clock) -> SessionStore:
    return SessionStore(SIG, version=version, max_sessions=8, idle_ttl_s=10.0, clock=clock)


@pytest.fixture
def book(clock: Clock) -> SessionLifecycle:
    sessions = SessionLifecycle("m")
    sessions.add("1", _store("1", clock))
    sessions.add("2", _store("2", clock))
    return sessions


def _bind(book: SessionLifecycle, ids: list[str | None], starts: list[bool], version: str | None = None,
          seeds: list[int | None] | None = None):
    seeds = seeds if seeds is not None else [None] * len(ids)
    binding = book.resolve(ids, starts, version, single=len(ids) == 1)
    return book.bind(binding, binding.version or version or "2", starts, seeds, len(ids) == 1)


def test_bind_creates_on_the_serving_version_pins_and_notes_restarts(book: SessionLifecycle) -> None:
    first = _bind(book, ["a", None, "b"], [True, False, True], version="1", seeds=[7, None, 9])
    assert first is not None and first.restarts is None
    a, none, b = first.sessions
    assert none is None and (a.version, b.version) == ("1", "1") and (a.seed, b.seed) == (7, 9)
    assert a.inflight == b.inflight == 1 and "a" in book.stores["1"] and "a" not in book.stores["2"]
    first.release()
    assert a.inflight == b.inflight == 0
    # A live session sent with episode_start is restarted by its batch (noted, not created again).
    again = _bind(book, ["a", "b"], [True, False], seeds=[3, None])
    assert again is not None and again.sessions == [a, b] and again.restarts == [(a, 3)]
    assert a.inflight == b.inflight == 1
    again.release()


def test_a_request_without_sessions_binds_nothing(book: SessionLifecycle) -> None:
    assert _bind(book, [None, None], [False, False]) is None


def test_a_pinned_session_outlives_its_idle_time_and_release_touches_it(book: SessionLifecycle, clock: Clock) -> None:
    created = _bind(book, ["s"], [True])
    assert created is not None
    created.release()
    step = _bind(book, ["s"], [False])
    assert step is not None
    clock.now += 60  # far past the idle TTL while the request queues
    assert book.find("s") is step.sessions[0]
    step.release()  # touched as it is released: idle from now on
    clock.now += 5
    assert book.find("s").inflight == 0
    clock.now += 6
    with pytest.raises(SessionExpired):
        book.find("s")


def test_the_sweep_ends_idle_sessions_of_every_version_but_not_pinned_ones(book: SessionLifecycle,
                                                                           clock: Clock) -> None:
    for version, session_id in (("1", "old"), ("2", "new")):
        bound = _bind(book, [session_id], [True], version=version)
        assert bound is not None
        bound.release()
    pinned = _bind(book, ["new"], [False])
    clock.now += 11
    assert book.sweep_idle() == 1
    assert "old" not in book.stores["1"] and book.find("new") is not None
    assert pinned is not None
    pinned.release()
    clock.now += 11
    assert book.sweep_idle() == 1 and len(book.stores["2"]) == 0


def test_release_after_a_reload_unpins_in_the_store_that_held_the_session(book: SessionLifecycle,
                                                                          clock: Clock) -> None:
    bound = _bind(book, ["s"], [True], version="1")
    assert bound is not None
    old = book.retire("1")
    book.add("1", _store("1", clock))  # the same version loaded again, a new store
    bound.release()
    assert bound.sessions[0].inflight == 0 and len(old) == 0 and len(book.stores["1"]) == 0
    with pytest.raises(SessionExpired):
        book.find("s")


def test_one_request_never_spans_two_versions_and_a_pin_must_match(book: SessionLifecycle) -> None:
    for version, session_id in (("1", "x"), ("2", "y")):
        bound = _bind(book, [session_id], [True], version=version)
        assert bound is not None
        bound.release()
    with pytest.raises(SessionConflict, match="share a model version"):
        _bind(book, ["x", "y"], [False, False])
    with pytest.raises(SessionConflict, match="bound to version '1'"):
        _bind(book, ["x"], [False], version="2")
    assert book.find("x").inflight == book.find("y").inflight == 0  # refused before anything was pinned


def test_end_and_end_id(book: SessionLifecycle) -> None:
    bound = _bind(book, ["e", "f"], [True, True])
    assert bound is not None
    bound.release()
    bound.end()  # a protocol's sequence_end, once the step was served
    bound.end()  # ended already: nothing more to do
    with pytest.raises(SessionExpired):
        book.find("e")
    book.end_id("never-seen")  # unknown: nothing to do
    with pytest.raises(SessionNotFound):
        book.find("never-seen")


def test_the_routes_create_refuses_a_live_id_on_any_version(book: SessionLifecycle) -> None:
    session = asyncio.run(book.open("r", "1", 5))
    assert session.version == "1" and session.seed == 5
    with pytest.raises(SessionConflict, match="already exists"):
        asyncio.run(book.open("r", "2", None))
    asyncio.run(book.close(session))
    assert asyncio.run(book.open("r", "2", None)).version == "2"  # ended: the id is free again


def test_import_is_refused_in_flight_and_keeps_one_id_on_one_version(book: SessionLifecycle) -> None:
    bound = _bind(book, ["i"], [True], version="1")
    assert bound is not None
    record = book.layout("1").decode(asyncio.run(book.export(bound.sessions[0])))
    assert book.in_flight("i")
    with pytest.raises(SessionBusy):
        book.check_idle("i", "session_id", "session 'i'")
    bound.release()
    book.check_idle("i", "session_id", "session 'i'")
    moved = asyncio.run(book.import_record("i", "2", record))
    assert moved.version == "2" and "i" not in book.stores["1"] and "i" in book.stores["2"]
    assert book.find("i") is moved
    assert asyncio.run(book.stored_record(moved)) is None  # in process: the session is the truth
    assert book.idle_s(moved) == (0.0, 10.0)


def test_prefetch_needs_no_read_in_process(book: SessionLifecycle) -> None:
    book.prefetch(["anything"])  # no external store: nothing to read, nothing raised
