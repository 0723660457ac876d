"""``rlserve export CHECKPOINT --trust-code`` for an old-stack policy whose ModelV2 is the user's.

The checkpoint is read as data first (spaces, config, filter, action settings); only the
model comes from running its code (``rlserve.models.traced.modelv2``). ``--import`` names
the user's modules that register the class with RLlib's ``ModelCatalog``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from rlserve.models.export.errors import BundleError
from rlserve.models.traced import TraceError

__all__ = ["export_traced_modelv2"]


def export_traced_modelv2(args: argparse.Namespace, checkpoint: Any, formats: tuple[str, ...],
                          progress: Callable[[str], None], input_error: type[ValueError]) -> Any:
    """The traced bundle; ``input_error`` is the CLI's bad-input exception (exit 2)."""
    from rlserve.models.traced.modelv2 import export_traced_policy

    given = [f"--{name.replace('_', '-')}" for name in ("spec", "obs_space", "action_space", "config", "weights")
             if getattr(args, name) is not None]
    if given:
        raise input_error(f"{', '.join(given)}: not used with --trust-code (the policy is restored from CHECKPOINT)")
    if checkpoint.filter_missing:
        raise input_error(checkpoint.filter_missing)
    try:
        return export_traced_policy(
            checkpoint, args.out, imports=args.imports, formats=formats, name=args.name or args.out.name,
            version=args.version, progress=progress, explore=False if args.deterministic else None,
            normalize_actions=args.normalize_actions, clip_actions=args.clip_actions,
        )
    except BundleError:
        raise  # a runtime disagrees with the eager model: an export failure, exit 1
    except (TraceError, ValueError) as exc:
        raise input_error(str(exc)) from exc
