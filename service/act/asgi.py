"""The hot POST routes as a raw ASGI handler, ahead of FastAPI's router.

FastAPI's routing, dependency and response machinery costs ~200 us per request, more
than a small policy's whole step. ``RawActHandler`` answers ``POST /v1/models/{name}/act``
and ``POST /v1/models/{name}/versions/{version}/act`` straight from the ASGI scope, and
the same way any other ``FastRoute`` it is given (the Open Inference Protocol's
``.../infer``, ``rlserve.service.protocols.kserve_v2.route``); the app dispatches to it
before FastAPI's router. ``rlserve serve`` goes one step further and answers these
requests inside uvicorn's protocol (``rlserve.service.act.protocol``); this handler serves
them under any other ASGI server. The documented FastAPI routes of the same paths live in
``rlserve.service.api``. All of them end in ``ActService``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import Any, Protocol

from rlserve.service.act.binary import is_raw
from rlserve.service.act.body import read_body
from rlserve.service.act.raw import act_raw, act_raw_nowait
from rlserve.service.act.use_case import ActService
from rlserve.service.errors import ErrorCounter, ServiceError, as_service_error, error_reply

log = logging.getLogger("rlserve.api")

ACT_PATH = re.compile(r"^/v1/models/(?P<name>[^/]+)(?:/versions/(?P<version>[^/]+))?/act$")
JSON_HEADERS = [(b"content-type", b"application/json")]
Headers = list[tuple[bytes, bytes]]


class RouteReply(Protocol):
    """How a route answers: ``(body, None[, headers])`` or ``(None, error)``. ``headers``
    (content-type included) default to JSON's."""

    def __call__(self, payload: bytes | None, error: ServiceError | None, headers: Headers = ...) -> None: ...


class FastRoute(Protocol):
    """A POST route answered ahead of FastAPI (here and in the act protocol)."""

    suffix: str  # every path the route takes ends with it (a cheap test before the regex)

    def match(self, path: str) -> re.Match[str] | None: ...

    def submit(self, match: re.Match[str], scope: dict[str, Any], body: bytes, reply: RouteReply) -> None:
        """Answer through ``reply`` once the batch is over; refusals may raise at once."""

    async def call(self, match: re.Match[str], scope: dict[str, Any], body: bytes) -> tuple[bytes, Headers]:
        """The answer (body, headers), awaited; raises a ``ServiceError`` for the client."""

    def error_reply(self, error: ServiceError, counter: ErrorCounter | None) -> tuple[int, bytes, Headers]:
        """(status, JSON body, headers besides content-type) of a refusal, counted."""


class ActRoute:
    """The JSON act routes (``ActService``)."""

    suffix = "/act"

    def __init__(self, service: ActService):
        self.service = service

    @staticmethod
    def match(path: str) -> re.Match[str] | None:
        return ACT_PATH.match(path)

    def submit(self, match: re.Match[str], scope: dict[str, Any], body: bytes, reply: RouteReply) -> None:
        if is_raw(scope["headers"]):
            act_raw_nowait(self.service, match["name"], match["version"], scope["headers"], body, reply)
        else:
            self.service.act_nowait(match["name"], match["version"], body, reply)

    async def call(self, match: re.Match[str], scope: dict[str, Any], body: bytes) -> tuple[bytes, Headers]:
        if is_raw(scope["headers"]):
            return await act_raw(self.service, match["name"], match["version"], scope["headers"], body), JSON_HEADERS
        return await self.service.act(match["name"], match["version"], body), JSON_HEADERS

    @staticmethod
    def error_reply(error: ServiceError, counter: ErrorCounter | None) -> tuple[int, bytes, Headers]:
        return error_reply(error, counter)


class RawActHandler:
    """ASGI callable for the fast routes; ``match(scope)`` says whether (and which) applies."""

    def __init__(self, service: ActService, metrics: ErrorCounter | None, max_body_bytes: int,
                 routes: Sequence[FastRoute] = ()):
        self.service = service
        self.metrics = metrics
        self.max_body_bytes = max_body_bytes
        self.routes: tuple[FastRoute, ...] = (ActRoute(service), *routes)

    def match(self, scope: dict[str, Any]) -> tuple[FastRoute, re.Match[str]] | None:
        if scope["type"] != "http" or scope["method"] != "POST":
            return None
        path = scope["path"]
        for route in self.routes:
            if path.endswith(route.suffix):
                match = route.match(path)
                if match is not None:
                    return route, match
        return None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any,
                       found: tuple[FastRoute, re.Match[str]]) -> None:
        route, match = found
        try:
            body = await read_body(receive, self.max_body_bytes)
            payload, headers = await route.call(match, scope, body)
            status = 200
        except Exception as exc:  # never let one request take the worker down
            status, payload, extra = route.error_reply(as_service_error(exc, log, "act failed"), self.metrics)
            headers = JSON_HEADERS + extra
        headers = [*headers, (b"content-length", b"%d" % len(payload))]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": payload})
