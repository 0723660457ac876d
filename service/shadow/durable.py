"""The shadow's per-session state in the external session store, so it outlives a replica.

Under ``RLSERVE_SESSION_STORE`` the runner writes, after each candidate batch, the state of
every session the batch stepped: one key per session in a namespace of the shadow's own,
``<prefix>:shadow:<live model>@<live version>><candidate>:<session id>``, holding a session
record of the candidate's layout (``rlserve.service.sessions.record``: its recurrent state,
previous-action and reward windows) whose step count is the live session's after that
step, with the sessions' idle TTL. A live session id is unique per model name, and the key
names the candidate too, so a candidate that is another version of the live model shares
no key with any live session.

When the runner meets a row of a session whose state it does not hold at the step before
(a restart after a crash, another replica stepped it meanwhile), it reads these keys (one
MGET per batch). A record is used only when it left off exactly at the step before the
row's; otherwise the session is broken until its next episode start (the shadow's rule).

The writes and reads happen in the candidate's process with a client of its own: the live path
never waits for them. A store that fails is logged (at most every 10 s) and counted; the
shadow goes on with the state it holds.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np

from rlserve.service.sessions.record import RecordError, encode_sessions
from rlserve.service.sessions.store import Session, SessionStore

log = logging.getLogger("rlserve.shadow")

WARN_EVERY_S = 10.0


class DurableShadowState:
    def __init__(self, url: str, namespace: str, *, ttl_s: float, timeout_s: float):
        import redis  # the [redis] extra: present whenever a session store is configured

        self._client = redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
        self._errors = redis.exceptions.RedisError
        self.namespace = namespace
        self.ttl_ms = max(1, int(ttl_s * 1000))
        self.failures = 0
        self._warned = -WARN_EVERY_S

    def key(self, session_id: str) -> str:
        return f"{self.namespace}:{session_id}"

    def read(self, session_ids: list[str]) -> list[bytes | None]:
        """The records of ``session_ids`` (None where there is none, or the store failed)."""
        try:
            found: list[Any] = self._client.mget([self.key(s) for s in session_ids])
            return [value if isinstance(value, bytes) else None for value in found]
        except self._errors as exc:
            self._failed("read", exc)
            return [None] * len(session_ids)

    def write(self, store: SessionStore, sessions: list[Session]) -> None:
        """Write ``sessions`` (of ``store``, just stepped) as they are now."""
        if not sessions:
            return
        rows = store.slabs.rows(np.fromiter((s.slot for s in sessions), np.int64, len(sessions)))
        records = encode_sessions(store.layout, store.version, sessions, [0] * len(sessions), rows, store.clock())
        try:
            with self._client.pipeline(transaction=False) as pipe:
                for session, record in zip(sessions, records, strict=True):
                    pipe.set(self.key(session.id), record, px=self.ttl_ms)
                pipe.execute()
        except self._errors as exc:
            self._failed("write", exc)

    def adopt(self, store: SessionStore, session_id: str, data: bytes, steps: int) -> Session | None:
        """Hold the record ``data`` as ``session_id`` when it left off at ``steps``; else None."""
        try:
            record = store.layout.decode(data)
        except RecordError:
            return None
        if record.steps != steps or record.version != store.version:
            return None
        return store.adopt(session_id, data)

    def _failed(self, what: str, exc: Exception) -> None:
        self.failures += 1
        now = time.monotonic()
        if now - self._warned >= WARN_EVERY_S:
            self._warned = now
            log.warning("shadow %s: the session store failed to %s its state (%s: %s); %d failures so far",
                        self.namespace, what, type(exc).__name__, exc, self.failures)

    def close(self) -> None:
        self._client.close()


def namespace(prefix: str, live: str, candidate: str) -> str:
    return f"{prefix}:shadow:{live}>{candidate}"

