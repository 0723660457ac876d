"""``/v1/models/{name}/stream`` and ``/v1/models/{name}/openpi``: the WebSocket upgrades, ahead
of FastAPI like the fast POST routes (``/`` too, as the openpi route of ``RLSERVE_OPENPI_MODEL``).

The upgrade's query parameters are the stream's options (``seed``, ``explore``,
``version``, ``outputs``, ``session_id`` to resume a session, ``debug``). An upgrade that
cannot be served is answered with an HTTP status and the JSON error body of every other
route (ASGI's ``websocket.http.response`` extension, which uvicorn offers): 400 for an
option, 404 for an unknown model (or policy set), 503 when ``RLSERVE_STREAM_MAX_CONNECTIONS`` streams are
open (openpi connections count as streams). A server without that extension gets a close
before the accept (HTTP 403 from uvicorn, close code 1013 for the full case) instead.

``/v1/models/{set}/agents/stream`` is a policy set's stream (``agents.py``): its options are
``seed``, ``explore``, ``outputs``, ``clip_actions``, ``unsquash_actions`` and ``episode_id``
to resume an episode. ``kinds`` counts the open connections by kind (``rlserve_streams_open``).

Two transports share ``admit``, ``refused``, ``connect`` and ``closed``: ``__call__`` is the
ASGI server's WebSocket (``asgi.py``), and ``upgrade.py`` takes the upgrade inside ``rlserve
serve``'s HTTP protocol (``protocol.py``); every kind of stream runs on both.
"""

from __future__ import annotations

import logging
import re
import uuid
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl

from gymnasium import spaces as gs

from rlserve.service.access_log import AccessLog
from rlserve.service.act.outputs import EXTRA_NAMES
from rlserve.service.act.use_case import ActService
from rlserve.service.act.wire import MAX_SEED
from rlserve.service.engine.metrics import Metrics
from rlserve.service.errors import BadRequest, ServiceError, as_service_error, error_reply
from rlserve.service.multiagent.use_case import AgentsActService
from rlserve.service.serving.policy import Policy
from rlserve.service.stream import asgi, frames, openpi
from rlserve.service.stream.agents import AGENTS_ROUTE, AgentsStreamConnection, check_upgrade
from rlserve.service.stream.connection import Dialect, Outlet, StreamConnection, StreamLimits, StreamOptions

log = logging.getLogger("rlserve.stream")

STREAM_PATH = re.compile(r"^/v1/models/(?P<name>[^/]+)/(?P<dialect>stream|openpi|agents/stream)$")
OPENPI_ROUTE = "/v1/models/{name}/openpi"
CLOSE_FULL = 1013  # try again later: the connection cap, where no HTTP answer can be sent
MAX_OPTION = 256  # characters of a query parameter's value
_OPTIONS = ("seed", "explore", "version", "outputs", "session_id", "debug")
_OPENPI_OPTIONS = (*_OPTIONS, "observation_key")
_AGENTS_OPTIONS = ("seed", "explore", "outputs", "episode_id", "clip_actions", "unsquash_actions")
KINDS = ("stream", "openpi", "agents")  # rlserve_streams_open{kind=...}
_BOOLS = {"true": True, "1": True, "false": False, "0": False}


class StreamsFull(ServiceError):
    """The upgrade of one stream more than ``RLSERVE_STREAM_MAX_CONNECTIONS``."""

    status, code = 503, "streams_full"


@dataclass(frozen=True, slots=True)
class Upgrade:
    """Which model an upgrade asks for, and in which dialect."""

    name: str
    openpi: bool
    route: str  # the access log's name of the route
    agents: bool = False  # a policy set's stream

    @property
    def kind(self) -> str:
        return "agents" if self.agents else "openpi" if self.openpi else "stream"


class StreamRoute:
    """The ASGI handler of stream upgrades; ``open`` counts the connections it holds."""

    def __init__(self, service: ActService, metrics: Metrics | None, access: AccessLog | None,
                 max_connections: int, limits: StreamLimits, openpi_model: str | None = None,
                 agents: AgentsActService | None = None):
        self.service, self.metrics = service, metrics
        self.access = access if access is not None and access.enabled else None
        self.max_connections = max_connections
        self.limits = limits
        self.openpi_model = openpi_model  # "/" speaks openpi for this model
        self.agents = agents  # serves policy sets' streams
        self.kinds = dict.fromkeys(KINDS, 0)  # open connections by kind

    def match(self, scope: dict[str, Any]) -> Upgrade | None:
        if scope["type"] != "websocket":
            return None
        return self.match_path(scope["path"])

    def match_path(self, path: str) -> Upgrade | None:
        if path == "/" and self.openpi_model is not None:
            return Upgrade(self.openpi_model, True, "/")
        found = STREAM_PATH.match(path)
        if found is None:
            return None
        if found["dialect"] == "agents/stream":
            return None if self.agents is None else Upgrade(found["name"], False, AGENTS_ROUTE, agents=True)
        if found["dialect"] == "openpi":
            return Upgrade(found["name"], True, OPENPI_ROUTE)
        return Upgrade(found["name"], False, frames.STREAM.route)

    def admit(self, match: Upgrade, query: bytes) -> tuple[StreamOptions, Policy | None]:
        """The upgrade's options and the policy it streams (None for a policy set's); raises
        what refuses it."""
        if self.open >= self.max_connections:
            raise StreamsFull(f"{self.max_connections} streams are open (RLSERVE_STREAM_MAX_CONNECTIONS)",
                              field="connections", expected=f"at most {self.max_connections}",
                              received=self.open + 1, headers={"Retry-After": "1"})
        known = _AGENTS_OPTIONS if match.agents else _OPENPI_OPTIONS if match.openpi else _OPTIONS
        options = stream_options(query, known)
        if self.agents is not None and match.agents:
            check_upgrade(self.agents, match.name, options)  # 404s before the accept
            return options, None
        return options, self.service.registry.entry(match.name).policy(options.version)

    def refused(self, match: Upgrade, exc: Exception, note: Any) -> tuple[int, bytes, list[tuple[bytes, bytes]]]:
        """An upgrade refused: its status, JSON body and headers, and its access-log line."""
        error = as_service_error(exc, log, "stream upgrade failed")
        if note is not None and self.access is not None:
            self.access.record("WS", match.route, error.status, note, match.name)
        return error_reply(error, self.metrics)

    def connect(self, match: Upgrade, options: StreamOptions, policy: Policy | None,
                outlet: Outlet) -> tuple[StreamConnection, dict[str, Any] | None]:
        """The stream's connection (counted in ``open`` and ``kinds`` until ``closed``), and
        the frame to send first (openpi's metadata)."""
        self.kinds[match.kind] += 1
        if self.agents is not None and match.agents:
            return AgentsStreamConnection(self.agents, self.metrics, self.access, match.name, options, self.limits,
                                          outlet), None
        assert policy is not None  # admit gives a model's stream its policy
        dialect: Dialect = frames.STREAM
        first = None
        if match.openpi:
            key = options.observation_key
            dialect = openpi.OpenpiFrames(match.route, key, isinstance(policy.pipeline.obs_space, gs.Dict))
            first = openpi.binary(openpi.metadata(policy, options.session_id, key))
        return StreamConnection(self.service, self.metrics, self.access, match.name, options, self.limits, outlet,
                                dialect), first

    def closed(self, match: Upgrade) -> None:
        self.kinds[match.kind] -= 1

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any, match: Upgrade) -> None:
        """The ASGI server's WebSocket (``asgi.py``)."""
        if (await receive())["type"] != "websocket.connect":
            return
        note = None if self.access is None else self.access.note()
        try:
            options, policy = self.admit(match, scope.get("query_string", b""))
        except Exception as exc:
            await self._refuse(scope, send, *self.refused(match, exc, note))
            return
        outlet = asgi.AsgiOutlet()
        connection, first = self.connect(match, options, policy, outlet)
        try:
            await send({"type": "websocket.accept"})
            if first is not None:
                await send(first)
            await asgi.run(connection, outlet, receive, send)
        finally:
            self.closed(match)

    @property
    def open(self) -> int:
        """The connections held, of every kind."""
        return sum(self.kinds.values())

    def open_by_kind(self) -> list[tuple[str, int]]:
        """(kind, open connections) per kind of stream, for ``rlserve_streams_open``."""
        return list(self.kinds.items())

    @staticmethod
    async def _refuse(scope: dict[str, Any], send: Any, status: int, body: bytes,
                      headers: list[tuple[bytes, bytes]]) -> None:
        if "websocket.http.response" not in scope.get("extensions", {}):
            await send({"type": "websocket.close", "code": CLOSE_FULL if status == 503 else 1008})
            return
        headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body)), *headers]
        await send({"type": "websocket.http.response.start", "status": status, "headers": headers})
        await send({"type": "websocket.http.response.body", "body": body})


def stream_options(query: bytes, known: tuple[str, ...] = _OPTIONS) -> StreamOptions:
    """The upgrade's query parameters; a 400 naming the parameter for anything else."""
    try:
        pairs = parse_qsl(query.decode("latin-1"), keep_blank_values=True, strict_parsing=False,
                          max_num_fields=len(known))
    except ValueError:
        raise BadRequest("too many query parameters", field="query", expected=f"at most {list(known)}",
                         received=f"{query.count(b'&') + 1} parameters") from None
    given: dict[str, str] = {}
    for key, value in pairs:
        if key not in known:
            raise BadRequest(f"unknown stream option {key[:MAX_OPTION]!r}", field=key[:MAX_OPTION],
                             expected=f"one of {list(known)}", received=key[:MAX_OPTION])
        if key in given or len(value) > MAX_OPTION:
            raise BadRequest(f"stream option {key!r} given twice or longer than {MAX_OPTION} characters", field=key,
                             expected=f"one value of at most {MAX_OPTION} characters", received=len(value))
        given[key] = value
    key = "episode_id" if "episode_id" in known else "session_id"  # a policy set's stream holds an episode
    session_id = given.get(key)
    if session_id is not None and "seed" in given:
        raise BadRequest(f"'seed' seeds a new {key[:-3]}'s first episode; a resumed one keeps its own", field="seed",
                         expected=f"no 'seed' with {key!r}", received=given["seed"])
    return StreamOptions(
        session_id=uuid.uuid4().hex if session_id is None else session_id, resume=session_id is not None,
        version=given.get("version"), seed=_seed(given.get("seed")), explore=_bool(given, "explore"),
        outputs=_outputs(given.get("outputs")), debug=bool(_bool(given, "debug")),
        observation_key=given.get("observation_key") or openpi.OBSERVATION_KEY,
        clip_actions=_bool(given, "clip_actions"), unsquash_actions=_bool(given, "unsquash_actions"))


def _seed(text: str | None) -> int | None:
    if text is None:
        return None
    if not text.isdigit() or int(text) > MAX_SEED:
        raise BadRequest("'seed' is not a seed", field="seed", expected=f"an integer in 0..{MAX_SEED}", received=text)
    return int(text)


def _bool(given: dict[str, str], key: str) -> bool | None:
    text = given.get(key)
    if text is None:
        return None
    value = _BOOLS.get(text.lower())
    if value is None:
        raise BadRequest(f"{key!r} is not a boolean", field=key, expected=list(_BOOLS), received=text)
    return value


def _outputs(text: str | None) -> tuple[str, ...]:
    if not text:
        return ()
    names = tuple(text.split(","))
    for name in names:
        if name not in EXTRA_NAMES:
            raise BadRequest(f"unknown output {name!r}", field="outputs", expected=f"some of {list(EXTRA_NAMES)}",
                             received=name)
    return names
