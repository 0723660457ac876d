"""Wiring of the act protocol (service/act_protocol.py); its HTTP behaviour is tested end
to end in tests/e2e/test_act_protocol_e2e.py."""

from __future__ import annotations

import pytest
import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from service import act_protocol, server
from service.api.act import RawActHandler
from service.server import serve_main


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
    monkeypatch.setattr(uvicorn.Server, "run", lambda self: configs.append(self.config))
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
