"""Wiring of the act protocol (service/act/protocol.py); its HTTP behaviour is tested end
to end in tests/e2e/test_act_protocol_e2e.py."""

from __future__ import annotations

import asyncio

import pytest
import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from rlserve.service import server
from rlserve.service.act import protocol as act_protocol
from rlserve.service.act.asgi import RawActHandler
from rlserve.service.act.use_case import ActService
from rlserve.service.serve_command import serve_main


def _handler() -> RawActHandler:
    return RawActHandler(service=None, metrics=None, max_body_bytes=1024)  # type: ignore[arg-type]


def test_the_class_extends_uvicorns_httptools_protocol():
    cls = act_protocol.act_protocol_class(_handler())
    assert cls is not None and issubclass(cls, HttpToolsProtocol)


def test_no_class_when_uvicorns_internals_changed(monkeypatch):
    monkeypatch.setattr(act_protocol, "_CYCLE_NAMES", (*act_protocol._CYCLE_NAMES, "renamed_in_a_future_uvicorn"))
    assert act_protocol.act_protocol_class(_handler()) is None


@pytest.mark.parametrize("setting,uses_protocol", [(None, True), ("false", False)])
def test_serve_hands_the_protocol_to_uvicorn_unless_turned_off(monkeypatch, setting, uses_protocol):
    configs = []
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, sockets=None: configs.append(self.config))
    monkeypatch.setattr(server.gc, "freeze", lambda: None)  # not this test process's heap
    monkeypatch.delenv("RLSERVE_ACT_PROTOCOL", raising=False)
    if setting is not None:
        monkeypatch.setenv("RLSERVE_ACT_PROTOCOL", setting)
    assert serve_main(["--port", "0", "--log-level", "warning"]) == 0
    http = configs[0].http
    if uses_protocol:
        assert isinstance(http, type) and issubclass(http, HttpToolsProtocol)
    else:
        assert http == "auto"


@pytest.mark.asyncio
async def test_act_nowait_replies_even_when_building_the_response_fails(make_client, monkeypatch):
    """The protocol has no task that would turn an exception into a 500: act_nowait must
    reply on every outcome, or the client would wait for an answer that never comes."""
    app, _ = make_client(("mlp",))
    service = app.state.act_service
    replies: asyncio.Queue = asyncio.Queue()

    def broken_finish(self, accepted, output, info):
        raise RuntimeError("encoder bug")

    monkeypatch.setattr(ActService, "_finish", broken_finish)
    service.act_nowait("mlp", None, b'{"observation": [0.1, -0.2, 0.3, 0.05]}',
                       lambda payload, error: replies.put_nowait((payload, error)))
    payload, error = await asyncio.wait_for(replies.get(), 5)
    assert payload is None and error.status == 500 and error.code == "internal_error"
    assert "RuntimeError" in error.message
