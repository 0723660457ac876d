"""The policy-set half of ``rlserve export`` and ``rlserve inspect``.

    rlserve export CHECKPOINT --out DIR --mapping mapping.json
    rlserve export CHECKPOINT --out DIR --map player_0=p0 --map 'red_*=p0' --default-policy p1
    rlserve export --bundle p0=BUNDLE --bundle p1=BUNDLE.rlsb --map 'red_*=p0' --out DIR

An agent mapping (a file, ``--map`` rules, ``--default-policy``) makes the export a policy
set: every policy of a multi-policy checkpoint (old stack: ``policies/<policy_id>/``; new
stack: every module of its MultiRLModule), or the bundles listed with ``--bundle``.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rlserve.models.checkpoint import CheckpointError
from rlserve.models.export.errors import BundleError
from rlserve.models.export.from_rlmodule import RLModuleExportError
from rlserve.models.export.policy_set_export import export_policy_set, policy_set_from_bundles
from rlserve.models.export.report import format_manifest
from rlserve.models.multiagent.mapping import MappingError
from rlserve.models.multiagent.mapping_flags import SetInputError, flag_pair, mapping_from_args
from rlserve.models.multiagent.policy_set import load_policy_set, member_name
from rlserve.models.traced import TraceError


def add_set_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("multi-agent: a policy set (policies served under one name, agents mapped)")
    group.add_argument("--mapping", type=Path, help='agent-to-policy mapping JSON: {"agents": {"player_0": "p0"}, '
                       '"patterns": [["red_*", "p0"]], "default": "p1"}')
    group.add_argument("--map", action="append", default=[], metavar="AGENT=POLICY",
                       help="one rule: an agent id, or a glob pattern such as 'red_*', and its policy id (repeatable; "
                       "added after the --mapping file's rules)")
    group.add_argument("--default-policy", metavar="POLICY", help="the policy of every agent no rule names")
    group.add_argument("--bundle", action="append", default=[], metavar="POLICY=PATH",
                       help="a member policy from an exported bundle (directory or .rlsb), instead of a checkpoint")


def wants_set(args: argparse.Namespace) -> bool:
    return bool(args.mapping or args.map or args.default_policy or args.bundle)


def export_set(args: argparse.Namespace, progress: Any) -> str:
    """Export the set the flags describe; returns what was written (for the last line)."""
    mapping = mapping_from_args(args)
    if args.out.exists() and any(args.out.iterdir()):
        raise SetInputError(f"--out: {str(args.out)!r} exists and is not empty")
    if args.bundle:
        if args.checkpoint is not None:
            raise SetInputError("give either a CHECKPOINT or --bundle POLICY=PATH members, not both")
        bundles = dict(flag_pair(b, "--bundle", "POLICY=PATH") for b in args.bundle)
        missing = [path for path in bundles.values() if not Path(path).exists()]
        if missing:
            raise SetInputError(f"--bundle: {missing[0]!r} does not exist")
        progress("copying the member bundles")
        try:
            policy_set = policy_set_from_bundles({k: Path(v) for k, v in bundles.items()}, args.out, mapping,
                                                 name=args.name, version=args.version)
        except (BundleError, MappingError) as exc:  # a listed bundle that does not load is the user's input
            raise SetInputError(f"--bundle: {exc}") from exc
    else:
        if args.checkpoint is None:
            raise SetInputError("a policy set needs a multi-policy CHECKPOINT or --bundle POLICY=PATH members")
        from rlserve.models.rllib_import import WeightImportError
        from rlserve.models.rlmodules.catalog import RLModuleWeightError

        formats = tuple(f.strip() for f in args.formats.split(",") if f.strip())
        try:
            policy_set = export_policy_set(args.checkpoint, args.out, mapping, name=args.name, version=args.version,
                                           only=[args.policy_id] if args.policy_id else None, formats=formats,
                                           progress=progress, trust_code=args.trust_code)
        except (CheckpointError, MappingError, WeightImportError, RLModuleExportError, RLModuleWeightError,
                TraceError) as exc:
            raise SetInputError(f"CHECKPOINT: {exc}") from exc
    with policy_set:
        return f"policy set {policy_set.name!r} with policies {policy_set.policy_ids} at {args.out}"


def format_policy_set(path: Path, verified: bool) -> str:
    """``rlserve inspect`` of a set: its header, the mapping's rules, then each member."""
    with load_policy_set(path, verify_checksums=verified) as policy_set:
        check = "all members' sha256 checksums verified" if verified else "checksums NOT verified (--no-verify)"
        lines = [
            f"policy set  {policy_set.name} (version {policy_set.version})",
            f"path        {path}",
            f"created     {policy_set.data['created_at']}",
            f"integrity   {check}",
            "mapping     " + policy_set.mapping.describe(),
            "policies    " + ", ".join(f"{pid} (served as {member_name(policy_set.name, pid)})"
                                       for pid in policy_set.policy_ids),
        ]
        members = [f"member {pid}\n{format_manifest(bundle, verified)}" for pid, bundle in policy_set.bundles.items()]
        return "\n\n".join(["\n".join(lines), *members])
