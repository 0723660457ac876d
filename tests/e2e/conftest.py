"""The e2e tests' shared fixtures: a model repository and ``rlserve serve`` replicas sharing
one real redis-server (the durable session tests, JSON and Open Inference Protocol)."""

from __future__ import annotations

from pathlib import Path

import pytest
from fleet import model_repository
from server_process import ServerProcess


@pytest.fixture
def repository(tmp_path) -> Path:
    return model_repository(tmp_path)


@pytest.fixture
def replicas(redis_server, repository):
    """``replicas(n, **env)``: n server processes sharing the redis-server and the repository."""
    started: list[ServerProcess] = []

    def make(n: int = 1, **env: str) -> list[ServerProcess]:
        base = {"RLSERVE_REPOSITORY": str(repository), "RLSERVE_SESSION_STORE": redis_server.url,
                "RLSERVE_MAX_SESSIONS": "1000"}
        servers = [ServerProcess({**base, **env}) for _ in range(n)]
        started.extend(servers)
        for server in servers:
            server.start(wait=False)
        for server in servers:
            server.wait_ready()
        return servers

    yield make
    for server in started:
        server.stop()
