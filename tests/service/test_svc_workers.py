"""Wiring of ``rlserve serve --workers N`` (service/workers.py); workers sharing sessions,
stopping with their supervisor and refusing sessions without a store are tested end to
end in tests/e2e/test_sessions_durable_e2e.py."""

from __future__ import annotations

import socket

import pytest
import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from rlserve.service import serve_command, server, workers
from rlserve.service.settings import Settings


def test_each_worker_serves_its_socket_with_the_act_protocol(monkeypatch):
    """A worker runs what a single `rlserve serve` runs: its own app, the act protocol class
    built around it, on the socket the supervisor bound."""
    runs = []
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, sockets=None: runs.append((self, sockets)))
    monkeypatch.setattr(server.gc, "freeze", lambda: None)  # not this test process's heap
    with socket.socket() as sock, pytest.raises(SystemExit) as exited:
        workers._worker(Settings(workers=2, log_level="warning"), sock)
    assert exited.value.code == 0  # serve's status: a worker whose named checkpoint fails exits 2
    [(uvicorn_server, sockets)] = runs
    assert sockets == [sock]
    http = uvicorn_server.config.http
    assert isinstance(http, type) and issubclass(http, HttpToolsProtocol) and http.__name__ == "ActProtocol"
    app = uvicorn_server.config.app
    assert app.state.settings.workers == 2
    # Without a session store this worker refuses sessions: each worker holds its own.
    policy = app.state.registry.entry("cartpole-memory").policy()
    assert policy.sessions.refusal is not None and "RLSERVE_SESSION_STORE" in policy.sessions.refusal


def test_the_cli_starts_the_supervisor_for_more_than_one_worker(monkeypatch):
    started = []
    monkeypatch.setattr(serve_command, "run_workers", lambda settings, sock: started.append(settings.workers) or 0)
    monkeypatch.setattr(serve_command, "serve", lambda settings, sockets, announce: started.append("single") or 0)
    monkeypatch.delenv("RLSERVE_WORKERS", raising=False)
    assert serve_command.serve_main(["--workers", "3", "--log-level", "warning", "--port", "0"]) == 0
    assert serve_command.serve_main(["--log-level", "warning", "--port", "0"]) == 0
    assert started == [3, "single"]
