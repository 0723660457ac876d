"""`rlserve` command line: a thin dispatcher; each subcommand lives with its feature.

Subcommands import lazily so `rlserve serve` on an ONNX-only image never imports torch.
"""

from __future__ import annotations

import importlib
import os
import sys

_COMMANDS: dict[str, tuple[str, str, str]] = {
    # name: (module, function, one-line help)
    "serve": ("rlserve.service.server", "serve_main", "run the HTTP service on a model repository"),
    "export": ("rlserve.models.export.cli", "export_main", "export an RLlib policy to a bundle"),
    "inspect": ("rlserve.models.export.cli", "inspect_main", "print a bundle's manifest"),
    "demo": ("rlserve.client.demo", "demo_main", "play episodes against a running service"),
    "experience": ("rlserve.service.experience.cli", "experience_main", "summarise or convert an experience log"),
}


def _usage() -> str:
    lines = ["usage: rlserve <command> [options]", "", "commands:"]
    lines += [f"  {name:<8} {help_}" for name, (_, _, help_) in _COMMANDS.items()]
    lines += ["", "`rlserve <command> --help` shows a command's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(_usage())
        return 0
    name, rest = args[0], args[1:]
    if name not in _COMMANDS:
        print(f"rlserve: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
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
