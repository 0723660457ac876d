"""``rlserve serve``: its flags, the checks that refuse a start, then one server process
(``rlserve.service.server``) or the supervisor of ``--workers N`` (``rlserve.service.workers``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import NoReturn

from rlserve.models.multiagent.mapping_flags import SetInputError, mapping_from_args
from rlserve.service.server import STARTUP_REFUSED, configure_logging, one_line, serve
from rlserve.service.startup import StartRefused, check_start, listening_socket, load_settings
from rlserve.service.workers import run_workers


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
            return run_workers(settings, sock)
        return serve(settings, [sock], announce=True)
    except Exception as exc:  # a failure that is no refusal of the input: one line unless asked for more
        if args.traceback or settings.log_level == "debug":
            raise
        print(f"rlserve serve: the start failed: {one_line(exc)} (--traceback shows the details)", file=sys.stderr)
        return 1
    finally:
        sock.close()
