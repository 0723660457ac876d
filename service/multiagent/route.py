"""``POST /v1/models/{name}/agents/act`` answered ahead of FastAPI, as the act route is
(a ``FastRoute`` of ``rlserve.service.act.asgi.RawActHandler`` and the act protocol)."""

from __future__ import annotations

import re
from typing import Any

from rlserve.service.act.asgi import JSON_HEADERS, Headers, RouteReply
from rlserve.service.errors import ErrorCounter, ServiceError, error_reply
from rlserve.service.multiagent.use_case import AgentsActService

AGENTS_ACT_PATH = re.compile(r"^/v1/models/(?P<name>[^/]+)/agents/act$")


class AgentsActRoute:
    suffix = "/agents/act"

    def __init__(self, service: AgentsActService):
        self.service = service

    @staticmethod
    def match(path: str) -> re.Match[str] | None:
        return AGENTS_ACT_PATH.match(path)

    def submit(self, match: re.Match[str], scope: dict[str, Any], body: bytes, reply: RouteReply) -> None:
        self.service.agents_act_nowait(match["name"], body, reply)

    async def call(self, match: re.Match[str], scope: dict[str, Any], body: bytes) -> tuple[bytes, Headers]:
        return await self.service.agents_act(match["name"], body), JSON_HEADERS

    @staticmethod
    def error_reply(error: ServiceError, counter: ErrorCounter | None) -> tuple[int, bytes, Headers]:
        return error_reply(error, counter)
