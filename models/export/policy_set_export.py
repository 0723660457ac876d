"""A policy set from a multi-policy RLlib checkpoint or from bundles (needs torch for the first).

    export_policy_set("path/to/checkpoint", "out/team", mapping, name="team")
    policy_set_from_bundles({"p0": Path("a"), "p1": Path("b.rlsb")}, "out/team", mapping, name="team")

Each policy of the checkpoint (old stack: ``policies/<policy_id>/``; new stack: each module
of its MultiRLModule, ``learner_group/learner/rl_module/<module_id>/``) is exported exactly as
``rlserve export CHECKPOINT --policy-id ID`` would (spaces, model config, filter or
connectors, action settings from its own files; every runtime verified against eager torch)
into ``policies/<policy_id>/``, named ``<name>.<policy_id>``; then the set's manifest is
written (``rlserve.models.multiagent.policy_set``). Any other source of policies takes the
same two steps: export each, then ``write_policy_set``.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from rlserve.models.checkpoint import CheckpointError
from rlserve.models.checkpoint.files import policy_ids
from rlserve.models.export.from_checkpoint import export_checkpoint
from rlserve.models.multiagent.mapping import AgentMapping
from rlserve.models.multiagent.policy_set import (
    MEMBERS_DIR,
    PolicySet,
    add_member,
    check_policy_id,
    member_name,
    write_policy_set,
)
from rlserve.models.newstack import checkpoint_module_ids, is_new_stack

__all__ = ["checkpoint_policy_ids", "export_policy_set", "policy_set_from_bundles"]


def export_policy_set(
    checkpoint: str | Path,
    out_dir: str | Path,
    mapping: AgentMapping,
    *,
    name: str | None = None,
    version: str | None = None,
    only: Sequence[str] | None = None,
    formats: Sequence[str] = ("onnx", "torchscript"),
    progress: Callable[[str], None] | None = None,
    trust_code: bool = False,
) -> PolicySet:
    """Export every policy of the checkpoint (or those in ``only``) and write the set.

    ``trust_code``: members whose module class is the user's are traced
    (``rlserve.models.traced``); then only the policies the mapping names are exported, so
    a MultiRLModule's shared encoder (a module no agent acts with) is reached through its
    members, not exported as a policy of its own."""
    checkpoint, out = Path(checkpoint), Path(out_dir)
    available = checkpoint_policy_ids(checkpoint)
    chosen = list(only) if only else available
    if trust_code and not only:
        chosen = [p for p in available if p in mapping.policy_ids()] or available
    missing = sorted(set(chosen) - set(available))
    if missing:
        raise CheckpointError(f"{checkpoint}: no policies {missing} under policies/; available: {available}")
    set_name = name or out.name
    mapping.check_policies(chosen)
    members = {}
    for policy_id in chosen:
        check_policy_id(policy_id)
        relative = f"{MEMBERS_DIR}/{policy_id}"
        if progress is not None:
            progress(f"exporting policy {policy_id!r}")
        export_checkpoint(checkpoint, out / relative, policy_id=policy_id, formats=formats,
                          name=member_name(set_name, policy_id), version=version, progress=progress,
                          trust_code=trust_code)
        members[policy_id] = relative
    return write_policy_set(out, name=set_name, version=version, mapping=mapping, members=members,
                            source={"kind": "rllib_checkpoint", "path": checkpoint.name, "policies": available,
                                    "stack": "new" if is_new_stack(checkpoint) else "old"})


def checkpoint_policy_ids(checkpoint: Path) -> list[str]:
    """The policies of a checkpoint of either stack: the old stack's ``policies/<policy_id>/``,
    the new stack's module ids. Raises ``CheckpointError`` where there are none."""
    if is_new_stack(checkpoint):
        available = checkpoint_module_ids(checkpoint)
        if not available:
            raise CheckpointError(f"{checkpoint}: no RLModule here (expected learner_group/learner/rl_module/"
                                  "<module_id>/): not a multi-module algorithm checkpoint")
        return available
    available = policy_ids(checkpoint)
    if not available:
        raise CheckpointError(f"{checkpoint}: no policies/<policy_id>/ here: not a multi-policy algorithm checkpoint")
    return available


def policy_set_from_bundles(bundles: Mapping[str, Path], out_dir: str | Path, mapping: AgentMapping, *,
                            name: str | None = None, version: str | None = None) -> PolicySet:
    """A set of bundles the user lists (policy id -> bundle directory or archive), copied in."""
    out = Path(out_dir)
    mapping.check_policies(bundles)
    out.mkdir(parents=True, exist_ok=True)
    try:
        members = {policy_id: add_member(out, policy_id, Path(path)) for policy_id, path in bundles.items()}
        return write_policy_set(out, name=name or out.name, version=version, mapping=mapping, members=members,
                                source={"kind": "bundles"})
    except BaseException:
        shutil.rmtree(out / MEMBERS_DIR, ignore_errors=True)
        raise
