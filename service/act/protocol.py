"""Act requests answered inside uvicorn's HTTP protocol, without an ASGI task each.

uvicorn runs every request as an asyncio task that receives ASGI messages and sends two
more (head, body), each written to the socket on its own. For a policy step that costs
as much as the step itself: a task, a suspension while the request waits for its batch,
a wake-up, and two ``write`` calls. ``rlserve serve`` therefore hands uvicorn (through its
documented ``http=`` option) a subclass of its httptools protocol that takes
``POST .../act`` requests (and those of the handler's other fast routes, such as the Open
Inference Protocol's ``POST .../infer``) out of the ASGI path once their body is complete:
it gives the body to the route (``ActService.act_nowait`` for act) and writes the response
in one ``write`` from the batch's completion callback. Parsing, keep-alive, pipelining,
flow control and graceful shutdown stay uvicorn's; every other request (and requests this
class does not take, see ``_takes``) goes through the ASGI app unchanged, and the
in-process ASGI handler (``rlserve.service.act.asgi.RawActHandler``) serves the same routes
when the app runs under another server. Both call the same routes and format errors the
same way.

This relies on uvicorn's ``HttpToolsProtocol`` internals (its per-request ``cycle`` and
the ``_start_asgi_task`` hook); ``act_protocol_class`` returns None, and the ASGI path is
used, when they are not there.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from rlserve.service.access_log import ACCESS_KEY, AccessLog, current_note
from rlserve.service.act.asgi import JSON_HEADERS, FastRoute, Headers, RawActHandler
from rlserve.service.errors import ServiceError, as_service_error, body_too_large

log = logging.getLogger("rlserve.act_protocol")

# A WebSocket upgrade taken over: (method, url, headers, transport, default headers, the
# server's open connections) -> True once the upgrade was answered and the socket is taken.
Upgrade = Callable[[str, bytes, list, Any, list, set], bool]

# What ActProtocol uses of uvicorn's protocol and of its per-request cycle.
_PROTOCOL_NAMES = ("_start_asgi_task", "on_body", "on_message_complete", "cycle", "server_state", "transport",
                   "flow", "limit_concurrency", "handle_websocket_upgrade", "headers", "connections")
_CYCLE_NAMES = ("body", "more_body", "response_started", "response_complete", "keep_alive", "disconnected",
                "on_response", "waiting_for_100_continue", "message_event", "scope")


def act_protocol_class(handler: RawActHandler, access_log: AccessLog | None = None,
                       upgrade: Upgrade | None = None) -> type | None:
    """A uvicorn HTTP protocol class serving act requests through ``handler``'s service,
    or None when httptools or the uvicorn internals it builds on are missing. Requests it
    answers are written to ``access_log`` (when on): they never reach the ASGI app's.
    ``upgrade`` (the streams' ``FastUpgrade``) is offered every WebSocket upgrade first."""
    try:
        from uvicorn.protocols.http.httptools_impl import (
            STATUS_LINE,
            HttpToolsProtocol,
            RequestResponseCycle,
        )
    except ImportError:  # no httptools: uvicorn's h11 protocol and the ASGI path
        return None
    protocol_names = HttpToolsProtocol.__init__.__code__.co_names + tuple(vars(HttpToolsProtocol))
    cycle_names = RequestResponseCycle.__init__.__code__.co_names
    if not (all(n in protocol_names for n in _PROTOCOL_NAMES) and all(n in cycle_names for n in _CYCLE_NAMES)):
        log.warning("uvicorn's HttpToolsProtocol changed; act requests use the ASGI path")
        return None

    metrics = handler.metrics
    max_body = handler.max_body_bytes
    access = access_log if access_log is not None and access_log.enabled else None

    class ActProtocol(HttpToolsProtocol):
        """uvicorn's httptools protocol, with act requests answered from batch callbacks."""

        _act_pending: Any = None  # the cycle whose body is still arriving
        _act_route: Any = None  # its (route, path match)

        def handle_websocket_upgrade(self) -> None:
            if upgrade is not None and upgrade(self.scope["method"], self.url, self.headers, self.transport,
                                               self.server_state.default_headers, self.connections):
                self.connections.discard(self)  # the socket is the stream's now
                return
            super().handle_websocket_upgrade()

        def _start_asgi_task(self, cycle: Any, app: Any) -> None:
            match = self._takes(cycle)
            if match is None:
                super()._start_asgi_task(cycle, app)
                return
            if access is not None:  # the latency counts from the end of the headers
                cycle.scope[ACCESS_KEY] = access.note(match[1])
            if cycle.more_body:  # the body is still arriving: on_message_complete submits
                self._act_pending, self._act_route = cycle, match
            else:  # a pipelined request, complete while it waited for its turn
                self._submit(cycle, match)

        def _takes(self, cycle: Any) -> Any:
            """(route, match) for a request this protocol answers itself, else None.
            ``Expect: 100-continue`` and a concurrency limit stay with uvicorn's ASGI path."""
            if cycle.waiting_for_100_continue or self.limit_concurrency is not None:
                return None
            return handler.match(cycle.scope)

        def on_body(self, body: bytes) -> None:
            super().on_body(body)
            cycle = self._act_pending
            if cycle is None or cycle is not self.cycle:
                return
            if len(cycle.body) > max_body:
                self._act_pending = None
                cycle.keep_alive = False  # the rest of the body is not read
                self._reply(cycle, self._act_route[0], body_too_large(len(cycle.body), max_body))
            else:
                # uvicorn pauses reading above its high-water mark until the app receives;
                # here nothing receives, the body is wanted whole.
                self.flow.resume_reading()

        def on_message_complete(self) -> None:
            super().on_message_complete()
            cycle = self._act_pending
            if cycle is not None and cycle is self.cycle:
                self._act_pending = None
                self._submit(cycle, self._act_route)

        def _submit(self, cycle: Any, found: Any) -> None:
            body = bytes(cycle.body)
            cycle.body = bytearray()
            route, match = found

            def reply(payload: bytes | None, error: ServiceError | None, headers: Headers = JSON_HEADERS) -> None:
                self._reply(cycle, route, error, payload, headers)

            # The service notes the request's rows in the access log's note (when on).
            token = None if access is None else current_note.set(cycle.scope[ACCESS_KEY])
            try:
                route.submit(match, cycle.scope, body, reply)
            except Exception as exc:  # never let one request take the worker down
                self._reply(cycle, route, as_service_error(exc, log, "act failed"))
            finally:
                if token is not None:
                    current_note.reset(token)

        def _reply(self, cycle: Any, route: FastRoute, error: ServiceError | None, payload: bytes | None = None,
                   headers: Headers = JSON_HEADERS) -> None:
            """Write the whole response in one call and hand the connection back to uvicorn."""
            if cycle.response_complete:
                return
            if error is None:
                assert payload is not None
                status = 200
            else:
                status, payload, extra = route.error_reply(error, metrics)
                headers = JSON_HEADERS + extra
            parts = [STATUS_LINE[status]]
            for name, value in self.server_state.default_headers:
                parts.append(b"%s: %s\r\n" % (name, value))
            for name, value in headers:
                parts.append(b"%s: %s\r\n" % (name, value))
            parts.append(b"content-length: %d\r\n" % len(payload))
            if not cycle.keep_alive:
                parts.append(b"connection: close\r\n")
            parts.append(b"\r\n")
            parts.append(payload)
            cycle.response_started = cycle.response_complete = True
            if access is not None and (status >= 400 or not access.refused_only):
                access.record_fast("POST", cycle.scope["path"], status, cycle.scope[ACCESS_KEY])
            if cycle.disconnected:  # the client left while the request was queued
                return
            self.transport.write(b"".join(parts))
            if not cycle.keep_alive:
                self.transport.close()
            cycle.message_event.set()
            cycle.on_response()

    return ActProtocol
