"""Serving an RLlib checkpoint directly: exported in this process, then loaded as a bundle.

``rlserve serve --checkpoint DIR`` and checkpoint directories found in the repository come
through here. The export is the one ``rlserve export CHECKPOINT`` does (spaces, model
config, filter statistics, action settings all read from the checkpoint; runtimes verified
against eager torch), kept in the export cache (``export_cache``) so the next start of the
same checkpoint loads it instead. Exporting needs torch (the ``[torch]`` extra); serving
exported bundles, kept ones included, does not.
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

from rlserve.models.checkpoint import CheckpointError
from rlserve.models.export.bundle import MANIFEST_NAME, Bundle, BundleError, load_bundle
from rlserve.models.export.names import NAME_RULE, name_problem
from rlserve.models.export.policy_set_export import checkpoint_policy_ids
from rlserve.models.newstack import is_new_stack
from rlserve.models.newstack.layout import CTOR_FILE, RL_MODULE_DIR
from rlserve.service.errors import BundleInvalid, quoted
from rlserve.service.serving import export_cache
from rlserve.service.settings import Settings

log = logging.getLogger("rlserve.checkpoints")

CHECKPOINT_MARKER = "rllib_checkpoint.json"


def is_checkpoint(path: Path) -> bool:
    """An RLlib checkpoint directory, not a bundle: an old-stack algorithm or policy directory,
    or a new-stack algorithm, ``rl_module`` or module directory (``class_and_ctor_args.pkl``)."""
    try:
        return path.is_dir() and ((path / CHECKPOINT_MARKER).is_file() or is_new_stack(path))
    except OSError:  # e.g. a name past NAME_MAX: not a checkpoint (the bundle loader says why)
        return False


def not_servable(path: Path) -> str | None:
    """Why ``rlserve serve --checkpoint`` cannot serve the directory ``path`` as one model,
    told from its files before anything loads (None when it may be): no RLlib checkpoint is
    there (a folder above one, usually), or a checkpoint of several policies."""
    if is_checkpoint(path):
        several = several_policies(path, str(path))
        return None if several is None else f"expected an RLlib checkpoint of one policy, received {several}"
    if not path.is_dir() or (path / MANIFEST_NAME).is_file():
        return None  # an archive or a bundle: --checkpoint serves those too
    below = _checkpoints_below(path)
    hint = (f"; the folder below, {str(below[0])!r}, looks like one: pass it" if len(below) == 1 else
            f"; these folders below look like one: {', '.join(repr(str(p)) for p in below)}" if below else
            f" ({CHECKPOINT_MARKER} or {CTOR_FILE}), nor any folder below it")
    return f"expected an RLlib checkpoint directory, received {str(path)!r}: no RLlib checkpoint is there{hint}"


def _checkpoints_below(path: Path, depth: int = 2, most: int = 3) -> list[Path]:
    """The checkpoint directories in the ``depth`` levels under ``path`` (hidden ones skipped)."""
    found: list[Path] = []
    level = [path]
    for _ in range(depth):
        try:
            children = sorted(c for folder in level for c in folder.iterdir()
                              if c.is_dir() and not c.name.startswith("."))
        except OSError:
            break
        found += [c for c in children if is_checkpoint(c)]
        level = [c for c in children if not is_checkpoint(c)]
    return found[:most]


def several_policies(path: Path, shown: str) -> str | None:
    """For a checkpoint of several policies (modules), named ``shown``: what it holds and how
    ``rlserve serve`` serves them, as a policy set or one by one by its own directory (serve
    takes no --policy-id or --module-id); else None."""
    try:
        ids = checkpoint_policy_ids(path)
    except CheckpointError:
        return None
    if len(ids) < 2:
        return None
    below = ("policies" if not is_new_stack(path) else
             RL_MODULE_DIR.as_posix() if (path / RL_MODULE_DIR).is_dir() else "")
    one = "/".join(p for p in (shown.rstrip("/"), below, ids[0]) if p)
    return (f"{shown!r}, which holds {len(ids)} policies ({', '.join(ids)}): serve them together as a policy set, "
            f"--policy-set NAME={shown} with an agent mapping (--map AGENT=POLICY, --mapping FILE or "
            f"--default-policy POLICY), or one of them with --checkpoint NAME={one}")


def parse_checkpoint_arg(value: str) -> tuple[str | None, Path]:
    """``NAME=PATH`` or ``PATH`` (the model is then named after the directory)."""
    name, sep, path = value.partition("=")
    if sep and name and "/" not in name:
        return name, Path(path)
    return None, Path(value)


def cache_root(settings: Settings) -> Path:
    return settings.export_cache or export_cache.default_root()


def cached_export(spec: str, settings: Settings) -> Path | None:
    """The kept export of the ``--checkpoint`` argument ``spec`` (``[NAME=]PATH``), if any."""
    name, path = parse_checkpoint_arg(spec)
    try:
        return export_cache.lookup(cache_root(settings), export_cache.export_key(path, _model_name(path, name), None))
    except OSError:
        return None


def bundle_from_checkpoint(path: Path, name: str | None = None, policy_id: str | None = None, *,
                           cache: Path | None = None) -> Bundle:
    """The bundle of the checkpoint at ``path``: its kept export in ``cache`` (made now if
    there is none), or without a cache a temporary export that lives as long as the bundle."""
    model_name = _model_name(path, name)
    problem = name_problem(model_name)
    if problem is not None:  # refused before an export that could only make an unreachable model
        raise BundleInvalid(f"cannot serve the RLlib checkpoint {quoted(path.name)}: its model's name would be "
                            f"{problem}; name it with NAME=DIR, NAME {NAME_RULE}",
                            field="name", expected=NAME_RULE, received=model_name)
    if cache is not None:
        kept = _from_cache(path, model_name, policy_id, cache)
        if kept is not None:
            return kept
    tmp = tempfile.TemporaryDirectory(prefix="rlserve-checkpoint-")
    try:
        out = Path(tmp.name) / "bundle"
        _export(path, out, model_name, policy_id)
        bundle = _load(path, out)
    except BaseException:
        tmp.cleanup()
        raise
    bundle._tmp = tmp  # removed with the bundle
    return bundle


def _model_name(path: Path, name: str | None) -> str:
    return name or path.resolve().name


def _from_cache(path: Path, model_name: str, policy_id: str | None, cache: Path) -> Bundle | None:
    """The kept export (exported now when missing), or None when the cache cannot be used."""
    try:
        key = export_cache.export_key(path, model_name, policy_id)
        entry = export_cache.exported(cache, key, lambda out: _export(path, out, model_name, policy_id))
    except OSError as exc:  # an unwritable cache (a read-only home): export as if there were none
        log.warning("checkpoint exports are not kept (%s: %s); set RLSERVE_EXPORT_CACHE to a writable "
                    "directory", type(exc).__name__, exc.strerror or exc)
        return None
    try:
        return load_bundle(entry)
    except BundleError as exc:  # changed or damaged since it was kept: export it again
        log.warning("the kept export of %s no longer loads (%s); exporting it again", path.name, exc)
        export_cache.forget(cache, key)
        return _load(path, export_cache.exported(cache, key, lambda out: _export(path, out, model_name, policy_id)))


def _export(path: Path, out: Path, model_name: str, policy_id: str | None) -> None:
    """Export the checkpoint at ``path`` to a verified bundle at ``out``; ``BundleInvalid`` if it cannot be."""
    try:  # every module that needs torch (or onnx): serving exported bundles does not
        from rlserve.models.export.from_checkpoint import export_checkpoint
        from rlserve.models.export.from_rlmodule import RLModuleExportError
        from rlserve.models.rllib_import import WeightImportError
        from rlserve.models.rlmodules.catalog import RLModuleWeightError
    except ImportError as exc:
        raise BundleInvalid(
            f"serving an RLlib checkpoint needs torch to export it ({exc.name} is not installed): "
            "install rlserve[torch], or export it elsewhere with `rlserve export CHECKPOINT --out BUNDLE` "
            "and serve the bundle", field="path", expected="an installed torch", received=path.name,
        ) from None

    several = several_policies(path, path.name) if policy_id is None else None
    if several is not None:
        raise BundleInvalid(f"cannot serve the RLlib checkpoint {several}", field="path",
                            expected="an RLlib checkpoint of one policy", received=path.name)
    log.info("exporting the RLlib checkpoint %s (kept for the next start)", path)
    try:
        export_checkpoint(path, out, policy_id=policy_id, name=model_name, formats=("onnx",))
    except (CheckpointError, WeightImportError, RLModuleExportError, RLModuleWeightError, BundleError,
            OSError) as exc:
        raise _refused(path, exc) from exc


def _load(path: Path, out: Path) -> Bundle:
    try:
        return load_bundle(out)
    except (BundleError, OSError) as exc:
        raise _refused(path, exc) from exc


def _refused(path: Path, exc: Exception) -> BundleInvalid:
    return BundleInvalid(f"cannot serve the RLlib checkpoint {path.name!r}: {exc}", field="path",
                         expected="an RLlib checkpoint directory (old stack: rllib_checkpoint.json; new stack: "
                         "class_and_ctor_args.pkl)", received=path.name)
