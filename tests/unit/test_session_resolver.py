"""Which sessions a request's ids name (``SessionResolver``), without HTTP: the refusals name
the request's field, nothing is changed while resolving, 404 / 410 / 503 say why an id does
not name a live session."""

from __future__ import annotations

import pytest

from rlserve.models.interface import ModelSignature, StateSpec
from rlserve.service.errors import BadRequest, SessionExpired, SessionNotFound, SessionsUnavailable
from rlserve.service.sessions.lifecycle import SessionLifecycle
from rlserve.service.sessions.store import SessionStore

SIG = ModelSignature(obs_shape=(2,), num_outputs=2, state=(StateSpec("h", (2,)),))


def _book(refusal: str | None = None) -> SessionLifecycle:
    book = SessionLifecycle("m", tombstones=2)
    book.add("1", SessionStore(SIG, version="1", max_sessions=4, idle_ttl_s=60.0, refusal=refusal))
    return book


def _live(book: SessionLifecycle, *ids: str) -> None:
    for session_id in ids:
        bound = book.bind(book.resolve([session_id], [True], None, True), "1", [True], [None], True)
        assert bound is not None
        bound.release()


def test_resolving_changes_nothing() -> None:
    book = _book()
    _live(book, "a")
    binding = book.resolve(["a", "b", None], [False, True, False], None, single=False)
    assert [row for row, _ in binding.existing] == [0] and binding.new == [(1, "b")]
    assert binding.version == "1" and "b" not in book.stores["1"] and book.find("a").inflight == 0


def test_an_id_twice_in_one_request_names_its_row() -> None:
    book = _book()
    _live(book, "a")
    with pytest.raises(BadRequest) as caught:
        book.resolve(["a", "a"], [False, False], None, single=False)
    assert caught.value.field == "session_ids[1]" and "appears twice" in caught.value.message


def test_an_unknown_id_is_404_in_either_form_named_by_its_field() -> None:
    book = _book()
    with pytest.raises(SessionNotFound) as single:
        book.resolve(["nope"], [False], None, single=True)
    assert single.value.field == "session_id"
    with pytest.raises(SessionNotFound) as batch:
        book.resolve([None, "nope"], [False, False], None, single=False)
    assert batch.value.field == "session_ids[1]" and batch.value.message.startswith("session_ids[1]: ")


def test_an_unloaded_versions_sessions_answer_410_and_the_memory_is_bounded() -> None:
    book = _book()
    _live(book, "a", "b", "c")
    book.retire("1")
    assert list(book.gone) == ["b", "c"]  # at most `tombstones` ids remembered, the newest
    with pytest.raises(SessionExpired, match="unloaded"):
        book.find("c")
    with pytest.raises(SessionNotFound):
        book.find("a")


def test_where_no_session_can_exist_the_id_is_unavailable_not_unknown() -> None:
    book = _book(refusal="sessions need a shared store")
    with pytest.raises(SessionsUnavailable, match="shared store"):
        book.find("x")
