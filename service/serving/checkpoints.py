"""Serving an RLlib checkpoint directly: exported in this process, then loaded as a bundle.

``rlserve serve --checkpoint DIR`` and checkpoint directories found in the repository come
through here. The export is the one ``rlserve export CHECKPOINT`` does (spaces, model
config, filter statistics, action settings all read from the checkpoint; runtimes verified
against eager torch), written to a temporary directory that lives as long as the bundle.
It needs torch (the ``[torch]`` extra); serving exported bundles does not.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from rlserve.models.export.bundle import Bundle, BundleError, load_bundle
from rlserve.service.errors import BundleInvalid

CHECKPOINT_MARKER = "rllib_checkpoint.json"


def is_checkpoint(path: Path) -> bool:
    """An RLlib checkpoint directory, not a bundle: an old-stack algorithm or policy directory,
    or a new-stack algorithm, ``rl_module`` or module directory (``class_and_ctor_args.pkl``)."""
    from rlserve.models.newstack import is_new_stack

    try:
        return path.is_dir() and ((path / CHECKPOINT_MARKER).is_file() or is_new_stack(path))
    except OSError:  # e.g. a name past NAME_MAX: not a checkpoint (the bundle loader says why)
        return False


def parse_checkpoint_arg(value: str) -> tuple[str | None, Path]:
    """``NAME=PATH`` or ``PATH`` (the model is then named after the directory)."""
    name, sep, path = value.partition("=")
    if sep and name and "/" not in name:
        return name, Path(path)
    return None, Path(value)


def bundle_from_checkpoint(path: Path, name: str | None = None, policy_id: str | None = None) -> Bundle:
    """Export the checkpoint at ``path`` to a temporary bundle and load it (verified)."""
    try:
        from rlserve.models.export.from_checkpoint import export_checkpoint
    except ImportError as exc:  # torch (or onnx) missing: serving exported bundles does not need them
        raise BundleInvalid(
            f"serving an RLlib checkpoint needs torch to export it ({exc.name} is not installed): "
            "install rlserve[torch], or export it elsewhere with `rlserve export CHECKPOINT --out BUNDLE` "
            "and serve the bundle", field="checkpoint", expected="an installed torch", received=path.name,
        ) from None
    from rlserve.models.checkpoint import CheckpointError
    from rlserve.models.export.from_rlmodule import RLModuleExportError
    from rlserve.models.rllib_import import WeightImportError
    from rlserve.models.rlmodules.catalog import RLModuleWeightError

    model_name = name or path.resolve().name
    tmp = tempfile.TemporaryDirectory(prefix="rlserve-checkpoint-")
    try:
        out = Path(tmp.name) / "bundle"
        export_checkpoint(path, out, policy_id=policy_id, name=model_name, formats=("onnx",))
        bundle = load_bundle(out)
    except (CheckpointError, WeightImportError, RLModuleExportError, RLModuleWeightError, BundleError,
            OSError) as exc:
        tmp.cleanup()
        raise BundleInvalid(f"cannot serve the RLlib checkpoint {path.name!r}: {exc}", field="checkpoint",
                            expected="an RLlib checkpoint directory (old stack: rllib_checkpoint.json; "
                            "new stack: class_and_ctor_args.pkl)", received=path.name) from exc
    except BaseException:
        tmp.cleanup()
        raise
    bundle._tmp = tmp  # removed with the bundle
    return bundle
