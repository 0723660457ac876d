"""``rlserve serve``: run the service with uvicorn (one event loop per process; ``--workers
N`` runs N such processes on one port, ``rlserve.service.workers``).

Shutdown: SIGTERM makes /readyz answer 503 at once; after ``RLSERVE_SHUTDOWN_DRAIN_S``
(default 0) uvicorn stops accepting, answers what is in flight, and the app closes its
batchers and the session store. A second SIGTERM, or SIGINT, skips the drain.
"""

from __future__ import annotations

import argparse
import gc
import logging
import signal
import socket
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

from rlserve.service.errors import bound_log_lines
from rlserve.service.settings import Settings
from rlserve.service.startup import StartRefused, check_start, listening_socket, load_settings

# The exit status of a start that was refused: invalid settings or flags, a missing extra or
# path, an unreachable session store (service/startup.py), or a --checkpoint that does not
# load (a supervisor of --workers stops and returns it too).
STARTUP_REFUSED = 2


def _parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="rlserve serve",
        description="Serve every bundle of a model repository, or RLlib checkpoints, over HTTP. Options "
                    "override the RLSERVE_* environment variables. Without --repository and --checkpoint the "
                    "embedded default models are served; with either, only what they name.")
    parser.add_argument("--repository", type=Path, help="directory of bundles (dirs or .rlsb archives)")
    parser.add_argument("--checkpoint", action="append", metavar="[NAME=]DIR",
                        help="an RLlib checkpoint directory to export and serve (repeatable; needs torch, unless "
                             "its export is cached from an earlier start); the model is named NAME, else after "
                             "the directory")
    parser.add_argument("--policy-set", action="append", metavar="[NAME=]DIR",
                        help="a policy set to serve (multi-agent, repeatable): a set directory, or a multi-policy "
                             "RLlib checkpoint with --mapping/--map/--default-policy (needs torch)")
    parser.add_argument("--mapping", type=Path,
                        help="agent-to-policy mapping JSON for --policy-set (replaces a set's own)")
    parser.add_argument("--map", action="append", default=[], metavar="AGENT=POLICY",
                        help="one mapping rule (an agent id or a glob such as 'red_*'), after --mapping's (repeatable)")
    parser.add_argument("--default-policy", metavar="POLICY", help="the policy of every agent no rule names")
    parser.add_argument("--host", help="bind address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port (default 8000; 0 picks a free one)")
    parser.add_argument("--grpc-port", type=int, help="also serve the Open Inference Protocol over gRPC on this "
                                                      "port (needs the [grpc] extra; Triton's default is 8001)")
    parser.add_argument("--log-level", choices=["debug", "info", "warning", "error", "critical"])
    parser.add_argument("--workers", type=int, help="processes serving the port (default 1); sessions then "
                                                    "need RLSERVE_SESSION_STORE")
    parser.add_argument("--traceback", action="store_true",
                        help="show the full traceback when the start fails (so does --log-level debug)")
    parser.add_argument("--device", help="auto (default: CUDA when the runtime can use it), cpu, cuda or cuda:N")
    return parser


class OneLineParser(argparse.ArgumentParser):
    """argparse, with a usage mistake said in one line (argparse prints the usage too)."""

    def error(self, message: str) -> NoReturn:
        self.exit(STARTUP_REFUSED, f"{self.prog}: {message} (`{self.prog} --help` lists the options)\n")


def serve_main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    overrides = {k: v for k, v in {"repository": args.repository, "host": args.host, "port": args.port,
                                   "log_level": args.log_level, "checkpoints": args.checkpoint,
                                   "workers": args.workers, "grpc_port": args.grpc_port,
                                   "device": args.device, "policy_sets": args.policy_set}.items()
                 if v is not None}
    try:
        if args.mapping is not None or args.map or args.default_policy is not None:
            from rlserve.models.export.set_cli import SetInputError, mapping_from_args

            try:
                overrides["agent_mapping"] = mapping_from_args(args).to_json()
            except SetInputError as exc:
                print(f"rlserve serve: {' '.join(str(exc).split())}", file=sys.stderr)
                return STARTUP_REFUSED
        settings = load_settings(overrides)
        check_start(settings, given=overrides)
        sock = listening_socket(settings, given=overrides)
    except StartRefused as exc:
        for line in exc.lines:
            print(f"rlserve serve: {line}", file=sys.stderr)
        return STARTUP_REFUSED
    configure_logging(settings)
    try:
        if settings.workers > 1:
            from rlserve.service.workers import run_workers

            return run_workers(settings, sock)
        return serve(settings, [sock], announce=True)
    except Exception as exc:  # a failure that is no refusal of the input: one line unless asked for more
        if args.traceback or settings.log_level == "debug":
            raise
        print(f"rlserve serve: the start failed: {one_line(exc)} (--traceback shows the details)", file=sys.stderr)
        return 1
    finally:
        sock.close()


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

        http = act_protocol_class(app.raw_act, app.state.access_log) or "auto"
    config = uvicorn.Config(app, host=settings.host, port=settings.port, log_level=settings.log_level,
                            access_log=False, workers=1, lifespan="on", http=http)
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
