"""``POST /v2/models/{name}[/versions/{version}]/infer`` on the fast path, next to act.

A ``FastRoute`` (``rlserve.service.act.asgi``): ``rlserve serve`` answers it inside
uvicorn's protocol without an ASGI task, other servers through the raw ASGI handler,
both ahead of FastAPI (``rlserve.service.api.inference_v2`` documents it, and serves it
when the fast path is off).
"""

from __future__ import annotations

import re
from typing import Any

from rlserve.service.act.asgi import Headers, RouteReply
from rlserve.service.errors import ErrorCounter, ServiceError
from rlserve.service.protocols.kserve_v2 import errors
from rlserve.service.protocols.kserve_v2.handler import Answer, InferService

INFER_PATH = re.compile(r"^/v2/models/(?P<name>[^/]+)(?:/versions/(?P<version>[^/]+))?/infer$")
HEADER_LENGTH = b"inference-header-content-length"


def header_length(scope: dict[str, Any]) -> str | None:
    """The Inference-Header-Content-Length header of an ASGI scope (names are lower case)."""
    for name, value in scope["headers"]:
        if name == HEADER_LENGTH:
            return value.decode("latin-1")
    return None


class InferRoute:
    suffix = "/infer"

    def __init__(self, service: InferService):
        self.service = service

    @staticmethod
    def match(path: str) -> re.Match[str] | None:
        return INFER_PATH.match(path)

    def submit(self, match: re.Match[str], scope: dict[str, Any], body: bytes, reply: RouteReply) -> None:
        def done(answer: Answer | None, error: ServiceError | None) -> None:
            if answer is None:
                reply(None, error)
            else:
                reply(answer.body, None, answer.headers())

        self.service.infer_nowait(match["name"], match["version"], header_length(scope), body, done)

    async def call(self, match: re.Match[str], scope: dict[str, Any], body: bytes) -> tuple[bytes, Headers]:
        answer = await self.service.infer(match["name"], match["version"], header_length(scope), body)
        return answer.body, answer.headers()

    @staticmethod
    def error_reply(error: ServiceError, counter: ErrorCounter | None) -> tuple[int, bytes, Headers]:
        return errors.error_reply(error, counter)
