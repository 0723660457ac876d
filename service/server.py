"""One server process of ``rlserve serve`` (the command: ``rlserve.service.serve_command``):
the app under uvicorn, on one event loop; ``--workers N`` runs N such processes on one
port (``rlserve.service.workers``).

Shutdown: SIGTERM makes /readyz answer 503 at once; after ``RLSERVE_SHUTDOWN_DRAIN_S``
(default 0) uvicorn stops accepting, answers what is in flight, and the app closes its
batchers and the session store. A second SIGTERM, or SIGINT, skips the drain.
"""

from __future__ import annotations

import gc
import logging
import signal
import socket
import sys
import time
from types import FrameType
from typing import Any

from rlserve.service.errors import bound_log_lines
from rlserve.service.settings import Settings

# The exit status of a start that was refused: invalid settings or flags, a missing extra or
# path, an unreachable session store (service/startup.py), or a --checkpoint that does not
# load (a supervisor of --workers stops and returns it too).
STARTUP_REFUSED = 2


def http_address(sock: socket.socket) -> str:
    """``http://host:port`` of a bound socket (the port it got, for --port 0)."""
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def configure_logging(settings: Settings) -> None:
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    bound_log_lines()  # a client's long string is logged by its length, as in error bodies


def settle_heap() -> None:
    """The garbage collector's settings for serving, once the app and its models are loaded.

    Everything allocated so far (frameworks, models) lives for the whole process; moving it
    out of the collector's view keeps full collections from scanning it on the hot path
    (measured: ~10 us per request and the tail latency spikes). A young-generation collection
    runs every 700 container allocations by default; a multi-agent request allocates dicts
    and lists per agent, so one ran every few requests. 20,000 makes them ~30x rarer, each
    still short (scripts/bench_agents_inprocess.py: 8-agent requests 5-10% less CPU per row).
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 10, 10)


def serve(settings: Settings, sockets: list[socket.socket] | None = None, *, announce: bool = False) -> int:
    """Run one server process until it stops: on ``sockets`` when they were bound already
    (by ``serve_main``, or a supervisor of workers), else on the settings' host and port.
    ``announce``: log the address once it serves, as uvicorn does for a port it binds."""
    configure_logging(settings)
    import uvicorn

    from rlserve.service.app import create_app

    app = create_app(settings)
    # A checkpoint named on the command line is what the user asked to serve: one that does
    # not load stops the start (a repository's bundles that fail are listed, not fatal).
    asked = {**{spec: "--checkpoint" for spec in settings.checkpoints},
             **{spec: "--policy-set" for spec in settings.policy_sets}}
    failed = {spec: why for spec, why in app.state.registry.failures.items() if spec in asked}
    if failed:
        for spec, why in failed.items():
            print(f"rlserve serve: {asked[spec]} {spec}: {' '.join(why.split())}", file=sys.stderr)
        return STARTUP_REFUSED
    settle_heap()
    http: Any = "auto"
    if settings.act_protocol and app.raw_act is not None:
        from rlserve.service.act.protocol import act_protocol_class

        http = act_protocol_class(app.raw_act, app.state.access_log, app.stream_upgrade) or "auto"
    # Streams are taken by the act protocol (``stream/upgrade.py``); without it, websockets'
    # sans-I/O protocol and the ASGI app (it stops reading a socket whose messages the app
    # has not received: the stream's backpressure), a message held to the body limit (larger:
    # close 1009), no per-message compression (CPU per step; docs/api.md "Streams").
    config = uvicorn.Config(app, host=settings.host, port=settings.port, log_level=settings.log_level,
                            access_log=False, workers=1, lifespan="on", http=http, ws="websockets-sansio",
                            ws_max_size=settings.max_body_bytes, ws_per_message_deflate=False)
    bound_log_lines("uvicorn", "uvicorn.error", "uvicorn.access")  # the handlers uvicorn.Config installed
    server = _draining_server(uvicorn.Server)(config, app, settings.shutdown_drain_s, announce)
    if sockets is None:
        server.run()
    else:
        server.run(sockets=sockets)
    return 0


def _draining_server(base: type) -> type:
    class DrainingServer(base):
        """uvicorn's server, with a drain before its graceful shutdown: on the first SIGTERM
        /readyz answers 503 (so load balancers stop sending) while requests are still
        answered for ``drain_s`` seconds; then uvicorn stops accepting and finishes."""

        def __init__(self, config: Any, app: Any, drain_s: float, announce: bool):
            super().__init__(config)
            self._app = app
            self._drain_s = drain_s
            self._drain_until: float | None = None
            self._announce = announce

        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets=sockets)
            if sockets and self._announce and self.started:  # uvicorn says it only for a port it bound
                logging.getLogger("uvicorn.error").info("Uvicorn running on %s (Press CTRL+C to quit)",
                                                        http_address(sockets[0]))

        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            self._app.state.draining = True
            if sig == signal.SIGTERM and self._drain_s > 0 and self._drain_until is None:
                self._drain_until = time.monotonic() + self._drain_s
                return
            super().handle_exit(sig, frame)

        async def on_tick(self, counter: int) -> bool:
            if self._drain_until is not None and time.monotonic() >= self._drain_until:
                self.should_exit = True
            return await super().on_tick(counter)

    return DrainingServer
