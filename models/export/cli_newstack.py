"""``rlserve export CHECKPOINT`` for a new-API-stack (RLModule) checkpoint.

The module's spaces, model config, weights and connector pipelines all come from the
checkpoint; ``--module-id`` (or ``--policy-id``) picks the module of a checkpoint that holds
several. ``--normalize-actions``/``--clip-actions``/``--deterministic``, ``--formats``,
``--name`` and ``--version`` apply as for old-stack checkpoints; the flags that describe an
old-stack model by hand (``--spec``, ``--obs-space``, ``--action-space``, ``--config``,
``--weights``, ``--filter``) are refused: a module's architecture and connectors are read,
not given.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from rlserve.models.checkpoint import CheckpointError
from rlserve.models.export.errors import BundleError
from rlserve.models.export.from_rlmodule import RLModuleExportError, export_rlmodule
from rlserve.models.newstack import read_module_checkpoint
from rlserve.models.newstack.modules import CUSTOM_KIND
from rlserve.models.traced import TraceError

__all__ = ["export_new_stack"]

_OLD_STACK_FLAGS = ("spec", "obs_space", "action_space", "config", "weights", "filter")


def export_new_stack(args: argparse.Namespace, progress: Callable[[str], None],
                     input_error: type[ValueError]) -> Any:
    """Export the module ``args`` name; ``input_error`` is the CLI's bad-input exception (exit 2)."""
    from rlserve.models.rlmodules.catalog import RLModuleWeightError

    given = [f"--{name.replace('_', '-')}" for name in _OLD_STACK_FLAGS if getattr(args, name) is not None]
    if given:
        raise input_error(f"{', '.join(given)}: not used with a new-API-stack checkpoint (its module, spaces, "
                          "model config, connectors and weights are all read from CHECKPOINT)")
    progress(f"reading the new-API-stack checkpoint {args.checkpoint}")
    try:
        module = read_module_checkpoint(args.checkpoint, args.policy_id, trust_code=args.trust_code)
    except CheckpointError as exc:
        raise input_error(f"CHECKPOINT: {exc}") from exc
    formats = tuple(f.strip() for f in args.formats.split(",") if f.strip())
    export = export_rlmodule
    if module.kind == CUSTOM_KIND:
        from rlserve.models.traced.export import export_traced_module as export  # needs ray: imported on demand
    try:
        return export(
            module, args.out, formats=formats, name=args.name or args.out.name, version=args.version,
            progress=progress, explore=False if args.deterministic else None,
            normalize_actions=args.normalize_actions, clip_actions=args.clip_actions,
            **({"imports": args.imports} if module.kind == CUSTOM_KIND else {}),
        )
    except BundleError:
        raise  # a runtime disagrees with eager torch: an export failure, exit 1
    except (RLModuleExportError, RLModuleWeightError, CheckpointError, TraceError) as exc:
        raise input_error(str(exc)) from exc
    except ValueError as exc:  # e.g. formats, or an --out that is not empty
        raise input_error(str(exc)) from exc
