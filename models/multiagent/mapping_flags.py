"""The agent mapping a command line describes: a ``--mapping`` file's rules, then ``--map
AGENT=POLICY`` rules, then ``--default-policy`` (torch-free).

``rlserve export`` (``models/export/set_cli.py``) and ``rlserve serve`` both read it, so it
sits under both and loads no exporter.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from rlserve.models.multiagent.mapping import AgentMapping, MappingError


class SetInputError(ValueError):
    """The set's part of the command line is unusable (exit status 2)."""


def mapping_from_args(args: argparse.Namespace) -> AgentMapping:
    """The mapping the flags describe: the file's rules, then ``--map`` rules, then the default."""
    data: dict[str, Any] = {}
    if args.mapping is not None:
        try:
            data = json.loads(args.mapping.read_text(encoding="utf-8"))
        except FileNotFoundError as exc:
            raise SetInputError(f"--mapping: file {str(args.mapping)!r} does not exist") from exc
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise SetInputError(f"--mapping: {str(args.mapping)!r} is not valid JSON: {exc}") from exc
    try:
        base = AgentMapping.from_json(data) if data else None
        rules = [flag_pair(rule, "--map", "AGENT=POLICY") for rule in args.map]
        extra = AgentMapping.from_rules(rules, None) if rules else None
        agents = {**(base.agents if base else {}), **(extra.agents if extra else {})}
        patterns = [*(base.patterns if base else []), *(extra.patterns if extra else [])]
        default = args.default_policy if args.default_policy is not None else (base.default if base else None)
        return AgentMapping(agents, patterns, default)
    except MappingError as exc:
        raise SetInputError(f"mapping: {exc}") from exc


def flag_pair(value: str, flag: str, form: str) -> tuple[str, str]:
    """A repeatable flag's ``KEY=VALUE``, split at its last ``=`` (``form`` names it in a refusal)."""
    key, sep, rest = value.rpartition("=")
    if not sep or not key or not rest:
        raise SetInputError(f"{flag}: expected {form}, got {value!r}")
    return key, rest
