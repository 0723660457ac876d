"""The installed uvicorn is one that service/act/protocol.py was checked against.

The act protocol subclasses uvicorn's private ``HttpToolsProtocol`` and drives its
per-request cycle itself. When those internals are missing it falls back to the ASGI path
with a warning, which keeps the server up but quietly loses the fast path; a change that
keeps the names but not their meaning (0.53 made keep-alive follow the request's
``Connection`` header at parse time, which the protocol's replies rely on) would not even
warn. So the suite fails loudly instead: an upgrade of uvicorn is a decision, made by
re-checking the protocol against the new source and then widening the range below.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import logging
import re
from pathlib import Path

import uvicorn.protocols.http.flow_control as flow_control
import uvicorn.protocols.http.httptools_impl as httptools_impl
from uvicorn.server import ServerState

from rlserve.service.act import protocol as act_protocol
from rlserve.service.act.asgi import RawActHandler

from .checked_ranges import assert_bounded_and_installed

# sha256 of the uvicorn modules ActProtocol reaches into, in the releases it was checked
# against (uvicorn 0.53.0 and 0.54.0 ship the same bytes; 0.52.4's httptools_impl differs).
CHECKED_SOURCES = {
    "httptools_impl.py": {"1d4e1c579df4168433a61a01f10c628b31c1790e72dd9769d2b8633b22214033": "0.53.0-0.54.0"},
    "flow_control.py": {"d39d16560df512f3ce907c329c2a0c3f5cd7165fef3b753876eae5739bf2a785": "0.52.4-0.54.0"},
}
HOW_TO_UPGRADE = (
    "service/act/protocol.py subclasses uvicorn's private HttpToolsProtocol and was checked against "
    "uvicorn 0.53.0-0.54.0. Read the diff of uvicorn/protocols/http/ against 0.54.0, adapt "
    "act_protocol.py, run tests/e2e/test_act_protocol_e2e.py, then record the new digests here and "
    "widen the uvicorn range in pyproject.toml."
)


def test_the_declared_uvicorn_range_is_bounded_above_and_admits_the_installed_one():
    assert_bounded_and_installed("uvicorn", HOW_TO_UPGRADE)


def test_the_uvicorn_sources_are_the_ones_checked():
    version = importlib.metadata.version("uvicorn")
    for module in (httptools_impl, flow_control):
        path = Path(module.__file__ or "")
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        assert digest in CHECKED_SOURCES[path.name], (
            f"uvicorn {version}: {path.name} (sha256 {digest}) is not the source that was checked. {HOW_TO_UPGRADE}"
        )


def test_the_protocol_builds_on_the_installed_uvicorn_without_falling_back(caplog):
    handler = RawActHandler(service=None, metrics=None, max_body_bytes=1024)  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING, logger="rlserve.act_protocol"):
        cls = act_protocol.act_protocol_class(handler)
    assert cls is not None and issubclass(cls, httptools_impl.HttpToolsProtocol), (
        f"act_protocol_class fell back to the ASGI path: {caplog.text}. {HOW_TO_UPGRADE}"
    )
    assert not caplog.records, caplog.text
    # Outside the two modules: the server state's default headers it writes into every reply.
    assert "default_headers" in vars(ServerState())
    assert re.fullmatch(rb"HTTP/1\.1 200 OK\r\n", httptools_impl.STATUS_LINE[200])
