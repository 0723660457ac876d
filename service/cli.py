"""`rlserve` command line: a thin dispatcher; each subcommand lives with its feature.

Subcommands import lazily so `rlserve serve` on an ONNX-only image never imports torch.
"""

from __future__ import annotations

import difflib
import importlib
import os
import sys
from importlib import metadata

_COMMANDS: dict[str, tuple[str, str, str]] = {
    # name: (module, function, one-line help)
    "serve": ("rlserve.service.serve_command", "serve_main", "run the HTTP service on a model repository"),
    "export": ("rlserve.models.export.cli", "export_main", "export an RLlib policy to a bundle"),
    "inspect": ("rlserve.models.export.cli", "inspect_main", "print a bundle's manifest"),
    "demo": ("rlserve.client.demo", "demo_main", "play episodes against a running service"),
    "experience": ("rlserve.service.evaluation.cli", "experience_main",
                   "summarise, convert or evaluate a candidate on an experience log"),
}
EXIT_USAGE = 2


def _usage() -> str:
    lines = ["usage: rlserve <command> [options]", "       rlserve --version", "", "commands:"]
    lines += [f"  {name:<8} {help_}" for name, (_, _, help_) in _COMMANDS.items()]
    lines += ["", "`rlserve <command> --help` shows a command's options."]
    return "\n".join(lines)


def version() -> str:
    """The installed distribution's version (what `pip show rlserve` says)."""
    try:
        return metadata.version("rlserve")
    except metadata.PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (not installed)"


def _unknown(name: str) -> str:
    """One line for a command that does not exist, with the closest one when there is one."""
    close = difflib.get_close_matches(name, list(_COMMANDS), n=1, cutoff=0.5)
    hint = f"did you mean `rlserve {close[0]}`?" if close else f"the commands are {', '.join(_COMMANDS)}"
    return f"rlserve: unknown command {name!r}: {hint} (`rlserve --help` lists them)"


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(_usage())
        return 0
    if args[0] in ("-V", "--version"):
        print(f"rlserve {version()}")
        return 0
    name, rest = args[0], args[1:]
    if name not in _COMMANDS:
        print(_unknown(name), file=sys.stderr)
        return EXIT_USAGE
    module_name, func_name, _ = _COMMANDS[name]
    func = getattr(importlib.import_module(module_name), func_name)
    try:
        return int(func(rest) or 0)
    except BrokenPipeError:
        # `rlserve inspect B | head` closed our stdout: not an error worth a traceback.
        # Point stdout at devnull so the interpreter's final flush does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
