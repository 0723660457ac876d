"""A multi-agent episode as bytes: its record in an external store, and its export.

msgpack of ``{"format": "rlserve-episode", "v": 1, "id", "seed", "joins": {agent: n},
"seats": {agent: [policy id, session id]}, "steps"}``; an export adds ``"records": {agent:
bytes}``, each agent's session record (``rlserve.service.sessions.record``) as its policy's
store exports it, so the whole episode moves as one body and is imported as one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec

from rlserve.service.sessions.episode_store import MAX_AGENT_ID_LENGTH, Episode, Seat
from rlserve.service.sessions.record import RecordError

FORMAT = "rlserve-episode"
VERSION = 1
MAX_SEED = (1 << 64) - 1
MAX_COUNT = 1 << 62  # steps, and how often an agent joined


@dataclass
class EpisodeRecord:
    id: str
    seed: int | None
    seats: dict[str, Seat]
    joins: dict[str, int]
    steps: int = 0
    records: dict[str, bytes] = field(default_factory=dict)  # an export's per-agent session records


def encode_episode(episode: Episode, records: dict[str, bytes] | None = None) -> bytes:
    body: dict[str, Any] = {
        "format": FORMAT, "v": VERSION, "id": episode.id, "seed": episode.seed, "steps": episode.steps,
        "joins": dict(episode.joins),
        "seats": {agent: [seat.policy, seat.session_id] for agent, seat in episode.seats.items()},
    }
    if records is not None:
        body["records"] = records
    return msgspec.msgpack.encode(body)


def decode_episode(data: bytes) -> EpisodeRecord:
    """``RecordError`` saying what is wrong with ``data``."""
    try:
        body = msgspec.msgpack.decode(data)
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:  # invalid UTF-8 in a string: the latter
        raise RecordError(f"not an episode record ({exc})") from None
    if not isinstance(body, dict) or body.get("format") != FORMAT:
        raise RecordError(f"not an episode record (expected format {FORMAT!r})")
    if body.get("v") != VERSION:
        raise RecordError(f"episode record version {body.get('v')!r}; this server reads version {VERSION}")
    try:
        seed = body["seed"]
        if seed is not None and not (isinstance(seed, int) and 0 <= seed <= MAX_SEED):
            raise RecordError(f"seed {seed!r} is not an integer in 0..2**64-1")
        seats = {_agent(agent): Seat(_text(policy), _text(session))
                 for agent, (policy, session) in body["seats"].items()}
        joins = {_agent(agent): _count(n, f"joins of {agent!r}") for agent, n in body["joins"].items()}
        records = {_agent(agent): bytes(rec) for agent, rec in body.get("records", {}).items()}
        return EpisodeRecord(_text(body["id"]), seed, seats, joins, _count(body.get("steps", 0), "steps"), records)
    except RecordError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise RecordError(f"malformed episode record ({type(exc).__name__}: {exc})") from None


def _count(value: Any, name: str) -> int:
    """A counter of the record: an integer the episode can go on counting from (msgpack
    writes at most 2**64 - 1, so a count is kept well below it)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_COUNT:
        raise RecordError(f"{name} {value!r} is not an integer in 0..2**62")
    return value


def _agent(value: Any) -> str:
    """An agent id, as a request may send it (1..MAX_AGENT_ID_LENGTH characters)."""
    if not isinstance(value, str) or not 0 < len(value) <= MAX_AGENT_ID_LENGTH:
        shown = value[:MAX_AGENT_ID_LENGTH] + "..." if isinstance(value, str) else value
        raise RecordError(f"agent id {shown!r} is not a string of 1..{MAX_AGENT_ID_LENGTH} characters")
    return value


def _text(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise RecordError(f"expected a non-empty string, got {value!r}")
    return value
