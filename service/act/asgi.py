"""The act routes as a raw ASGI handler, ahead of FastAPI's router.

FastAPI's routing, dependency and response machinery costs ~200 us per request, more
than a small policy's whole step. ``RawActHandler`` answers ``POST /v1/models/{name}/act``
and ``POST /v1/models/{name}/versions/{version}/act`` straight from the ASGI scope; the
app dispatches to it before FastAPI's router. ``rlserve serve`` goes one step further and
answers these requests inside uvicorn's protocol (``rlserve.service.act.protocol``); this
handler serves them under any other ASGI server. The documented FastAPI routes of the
same paths live in ``rlserve.service.api.act``. All of them call ``ActService``.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from rlserve.service.act.body import read_body
from rlserve.service.act.use_case import ActService
from rlserve.service.errors import ErrorCounter, as_service_error, error_reply

log = logging.getLogger("rlserve.api")

ACT_PATH = re.compile(r"^/v1/models/(?P<name>[^/]+)(?:/versions/(?P<version>[^/]+))?/act$")
_JSON_HEADERS = [(b"content-type", b"application/json")]


class RawActHandler:
    """ASGI callable for the act routes; ``match(scope)`` says whether it applies."""

    def __init__(self, service: ActService, metrics: ErrorCounter | None, max_body_bytes: int):
        self.service = service
        self.metrics = metrics
        self.max_body_bytes = max_body_bytes

    @staticmethod
    def match(scope: dict[str, Any]) -> re.Match[str] | None:
        if scope["type"] != "http" or scope["method"] != "POST":
            return None
        path = scope["path"]
        if not path.endswith("/act"):
            return None
        return ACT_PATH.match(path)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any, match: re.Match[str]) -> None:
        try:
            body = await read_body(receive, self.max_body_bytes)
            payload = await self.service.act(match["name"], match["version"], body)
            status, headers = 200, _JSON_HEADERS
        except Exception as exc:  # never let one request take the worker down
            status, payload, extra = error_reply(as_service_error(exc, log, "act failed"), self.metrics)
            headers = _JSON_HEADERS + extra
        headers = [*headers, (b"content-length", b"%d" % len(payload))]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": payload})
