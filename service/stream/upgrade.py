"""A stream's upgrade taken inside the server's HTTP protocol (``rlserve serve``): the
opening handshake of RFC 6455 answered here, then the socket handed to ``StreamProtocol``.

The act protocol (``rlserve.service.act.protocol``) calls ``FastUpgrade`` with an upgrade
request's line and headers; a path that is no stream route is left to uvicorn's WebSocket
(and the ASGI app). A stream route's upgrade is checked as the RFC asks (``GET``,
``Connection: upgrade``, a ``Sec-WebSocket-Key`` of 16 bytes, version 13: else 400, or 426
with ``Sec-WebSocket-Version: 13``) and as ``StreamRoute.admit`` asks (options, model,
connection cap), each refusal an HTTP answer with the JSON error body of every route. No
extension (permessage-deflate) and no subprotocol is ever accepted: an offer of one is
answered without it, as the RFC allows.
"""

from __future__ import annotations

import asyncio
import functools
from http import HTTPStatus
from typing import Any
from urllib.parse import unquote

from rlserve.service.errors import BadRequest, ServiceError
from rlserve.service.stream.protocol import StreamProtocol
from rlserve.service.stream.route import StreamRoute
from rlserve.service.stream.websocket import accept_key, valid_key

Headers = list[tuple[bytes, bytes]]


class UpgradeRequired(ServiceError):
    """An upgrade for another WebSocket version than 13."""

    status, code = 426, "upgrade_required"


class FastUpgrade:
    """``StreamRoute``'s upgrades, for the act protocol's ``handle_websocket_upgrade``."""

    def __init__(self, route: StreamRoute):
        self.route = route

    def __call__(self, method: str, url: bytes, headers: Headers, transport: asyncio.Transport,
                 default_headers: Headers, connections: set[Any]) -> bool:
        """Take the upgrade (answered here, the socket now the stream's): True; a path that
        is no stream route: False, and nothing was written."""
        raw_path, _, query = url.partition(b"?")
        path = raw_path.decode("latin-1")
        route = self.route
        match = route.match_path(unquote(path) if "%" in path else path)
        if match is None:
            return False
        note = None if route.access is None else route.access.note()
        try:
            key = _handshake(method, headers)
            options, policy = route.admit(match, query)
        except Exception as exc:
            status, body, extra = route.refused(match, exc, note)
            head = [b"HTTP/1.1 %d %s\r\n" % (status, HTTPStatus(status).phrase.encode()), *_lines(default_headers),
                    *_lines(extra), b"content-type: application/json\r\ncontent-length: %d\r\n" % len(body),
                    b"connection: close\r\n\r\n", body]
            transport.write(b"".join(head))
            transport.close()
            return True
        protocol = StreamProtocol(transport, route.limits.max_message_bytes, connections,
                                  functools.partial(route.closed, match))
        protocol.connection, first = route.connect(match, options, policy, protocol)
        transport.write(b"".join([b"HTTP/1.1 101 Switching Protocols\r\n", *_lines(default_headers),
                                  b"upgrade: websocket\r\nconnection: Upgrade\r\nsec-websocket-accept: ",
                                  accept_key(key), b"\r\n\r\n"]))
        transport.set_protocol(protocol)
        if first is not None:
            protocol.send(first)
        return True


def _handshake(method: str, headers: Headers) -> bytes:
    """The client's ``Sec-WebSocket-Key``, once the upgrade request is one RFC 6455 accepts."""
    key = version = None
    for name, value in headers:
        if name == b"sec-websocket-key":
            key = value.strip()
        elif name == b"sec-websocket-version":
            version = value.strip()
    if method != "GET":
        raise BadRequest("a WebSocket upgrade is a GET", field="method", expected="GET", received=method[:16])
    if version != b"13":
        raise UpgradeRequired("this server speaks WebSocket version 13", field="sec-websocket-version",
                              expected="13", received=None if version is None else version[:16].decode("latin-1"),
                              headers={"Sec-WebSocket-Version": "13"})
    if key is None or not valid_key(key):
        raise BadRequest("'sec-websocket-key' is not 16 bytes in base64", field="sec-websocket-key",
                         expected="16 random bytes in base64 (24 characters)",
                         received=None if key is None else key[:64].decode("latin-1"))
    return key


def _lines(headers: Headers) -> list[bytes]:
    return [b"%s: %s\r\n" % (name, value) for name, value in headers]
