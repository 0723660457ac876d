"""How a bundle becomes a serving ``Policy``: runtime, reference check, pipeline, session
store, the prepare and batch steps, and a batcher; and where bundles are found."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from rlserve.models.export.archive import ARCHIVE_SUFFIX
from rlserve.models.export.bundle import (
    MANIFEST_NAME,
    Bundle,
    BundleError,
    load_bundle,
    verify_reference,
)
from rlserve.models.export.errors import ArchiveLimitError
from rlserve.models.interface import ModelSignature
from rlserve.service.engine.batch_limits import batch_limits
from rlserve.service.engine.batcher import Batcher
from rlserve.service.engine.metrics import Metrics
from rlserve.service.engine.pipeline import Pipeline
from rlserve.service.engine.runtime import DeviceUnavailable, choose_kind, open_runtime
from rlserve.service.engine.runtime.errors import runtime_errors
from rlserve.service.errors import BundleInvalid, quoted
from rlserve.service.serving.checkpoints import bundle_from_checkpoint, cache_root, is_checkpoint
from rlserve.service.serving.consistency import check_consistency
from rlserve.service.serving.policy import Policy
from rlserve.service.sessions.base import SessionStore
from rlserve.service.sessions.redis_client import RedisSessions
from rlserve.service.sessions.redis_store import CachedSessionStore
from rlserve.service.sessions.store import SessionStore as InProcessStore
from rlserve.service.settings import Settings
from rlserve.service.step.batch import BatchStep
from rlserve.service.step.prepare import Preparer
from rlserve.service.step.windows import WindowLayout

# What a bundle's files can make loading raise (besides the runtime libraries' own types).
_REFUSED: tuple[type[Exception], ...] = (BundleError, ValueError, OSError, RuntimeError)


def build_policy(bundle: Bundle, settings: Settings, metrics: Metrics | None = None, *,
                 shown: str | None = None, store: RedisSessions | None = None) -> Policy:
    """A ready-to-serve ``Policy`` for ``bundle``; raises ``BundleInvalid`` if unusable.
    Its sessions live in ``store`` when given (Redis/Valkey), else in this process.

    ``shown`` is how errors name the bundle (its path relative to the repository, or the
    upload); the runtime's own messages have the bundle's directory replaced by it.
    Blocking (creates the runtime session, runs the reference check): call it from a
    worker thread when the event loop is serving.
    """
    manifest = bundle.manifest
    what = f"bundle {quoted(manifest.name)} version {quoted(manifest.version)}"
    shown = what if shown is None else shown
    try:
        kind = choose_kind(list(manifest.runtimes), settings.runtime)
        runtime_file = bundle.runtime_path(kind)
        try:
            runtime = open_runtime(
                kind, runtime_file, input_names=manifest.input_names,
                output_names=manifest.output_names, intra_op_threads=settings.intra_op_threads,
                device=settings.device, tensorrt=settings.onnx_tensorrt, policy_path=bundle.policy_path(kind),
                intra_op_spinning=settings.intra_op_spinning, device_cast=settings.onnx_device_cast,
            )
        except DeviceUnavailable:
            raise
        except (*_REFUSED, *runtime_errors()) as exc:
            if any(name in str(exc) for name in manifest.files):
                raise  # ONNX Runtime names the file (model.onnx or model_policy.onnx)
            # TorchScript's reader does not say which file it could not read.
            raise BundleError(f"{runtime_file.name} cannot be loaded: {exc}") from exc
        reference = bundle.reference() if settings.verify_on_load else None  # read once, used three times
        check_consistency(manifest, getattr(runtime, "declared_shapes", {}), runtime_file.name, reference=reference)
        if reference is not None:
            verify_reference(bundle, runtime.run, reference=reference)
            verify_reference(bundle, runtime.run_policy, outputs=manifest.signature.policy_output_names,
                             reference=reference)
        pipeline = Pipeline.from_manifest(manifest)
    except (*_REFUSED, *runtime_errors()) as exc:
        # A runtime names the files it could not read by their full path.
        detail = str(exc).replace(f"{bundle.root}{os.sep}", "").replace(str(bundle.root), shown)
        raise BundleInvalid(f"{what} cannot be served: {detail}", received=shown) from exc
    explore = manifest.explore if settings.default_explore is None else settings.default_explore
    sessions = _session_store(manifest.signature, manifest.name, manifest.version, settings, store)
    obs_dtype = runtime.input_dtypes.get("obs", np.dtype(np.float32))
    preparer = Preparer(pipeline, obs_dtype, default_explore=explore,
                        window_layout=WindowLayout.from_signature(manifest.signature))
    step = BatchStep(manifest.signature, runtime, pipeline, sessions, preparer.mask_layout)
    policy = Policy(bundle, runtime, pipeline, sessions, preparer, step,
                    unsquash_default=manifest.normalize_actions, clip_default=manifest.clip_actions)
    limits = batch_limits(settings, runtime.device)
    policy.batcher = Batcher(
        step.run, max_rows=limits.max_rows, max_delay_s=limits.max_delay_s,
        queue_limit=limits.queue_limit, inline_rows=limits.inline_rows, enabled=settings.batching,
        retry_after_s=settings.retry_after_s, name=policy.key,
        observer=metrics.batch_observer(manifest.name) if metrics is not None else None,
        # An external store reads before and writes after each batch; in-process, nothing waits.
        before=step.before_batch if sessions.durable else None,
        after=step.after_batch if sessions.durable else None,
    )
    return policy


def _session_store(signature: ModelSignature, name: str, version: str, settings: Settings,
                   store: RedisSessions | None) -> SessionStore:
    common: dict[str, Any] = dict(version=version, max_sessions=settings.max_sessions,
                                  idle_ttl_s=settings.session_idle_ttl_s, initial_slots=settings.initial_session_slots,
                                  tombstones=settings.session_tombstones)
    if store is not None:
        return CachedSessionStore(signature, remote=store.for_model(name),
                                  trust_cache=settings.session_cache == "trust", **common)
    refusal = None
    if settings.workers > 1:
        refusal = (f"sessions need a store shared by the {settings.workers} worker processes: set "
                   "RLSERVE_SESSION_STORE=redis://host:6379/0 (or unix:///path/to/redis.sock); stateless "
                   "requests (no session_id) work as they are")
    return InProcessStore(signature, refusal=refusal, **common)


def load_policy(path: Path, settings: Settings, metrics: Metrics | None = None, *,
                shown: str | None = None, label: str | None = None, name: str | None = None,
                store: RedisSessions | None = None) -> Policy:
    """Load the bundle directory or archive at ``path``, or export the RLlib checkpoint
    directory there (its model named ``name``, default the directory's), and build its policy.

    Errors name the bundle as ``shown`` (the path relative to the repository, or the
    upload; ``label`` is the phrase messages use, ``bundle 'shown'`` by default), never by
    ``path``; a refused archive member is the error's ``received``. An archive unpacks into
    a temporary directory owned by the policy's bundle (deleted by ``Policy.close``), to at
    most ``settings.max_unpacked_bytes``; if the policy cannot be built, it is deleted at once.
    """
    shown = path.name if shown is None else shown
    label = f"bundle {quoted(shown)}" if label is None else label
    if is_checkpoint(path):
        bundle = bundle_from_checkpoint(path, name, cache=cache_root(settings))
        try:
            return build_policy(bundle, settings, metrics, shown=shown, store=store)
        except BaseException:
            bundle.close()
            raise
    try:
        if not path.exists():
            raise BundleInvalid(f"cannot load {label}: there is no such directory or archive", received=shown)
        bundle = load_bundle(path, max_unpacked_bytes=settings.max_unpacked_bytes)
    except ArchiveLimitError as exc:
        raise BundleInvalid(
            f"cannot load {label}: {_hide(str(exc), path, shown)}",
            expected=f"an archive that unpacks to at most {exc.limit} bytes (RLSERVE_MAX_UNPACKED_BYTES)",
            received=exc.member or shown,
        ) from exc
    except (BundleError, OSError, ValueError) as exc:  # OSError: e.g. a name past NAME_MAX
        raise _refused(exc, label, path, shown) from exc
    try:
        return build_policy(bundle, settings, metrics, shown=shown, store=store)
    except BaseException:
        bundle.close()
        raise


def _refused(exc: Exception, label: str, path: Path, shown: str) -> BundleInvalid:
    """The 422 for a bundle that does not load: a refused archive member is its ``received``;
    a manifest field whose value is refused (a name, a version) its ``field``."""
    message = f"cannot load {label}: {_hide(_reason(exc), path, shown)}"
    if isinstance(exc, BundleError) and exc.field is not None:
        return BundleInvalid(message, field=exc.field, expected=exc.expected, received=exc.received)
    member = exc.member if isinstance(exc, BundleError) else None
    return BundleInvalid(message, received=member or shown)


def _reason(exc: Exception) -> str:
    # An OSError's text carries the full path it failed on; its strerror says enough.
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc)


def _hide(text: str, path: Path, shown: str) -> str:
    """``text`` with the path the server resolved replaced by the name the client gave."""
    return text.replace(str(path), shown)


def discover_bundles(root: Path) -> list[Path]:
    """Bundle directories (holding a manifest), ``*.rlsb`` archives and RLlib checkpoint
    directories (holding ``rllib_checkpoint.json``; served under the directory's name) under ``root``.

    Looks two levels deep so both ``root/<bundle>/`` and ``root/<name>/<version>/``
    layouts work; hidden entries are skipped.
    """
    found: list[Path] = []

    def walk(folder: Path, depth: int) -> None:
        for entry in sorted(folder.iterdir()):
            if entry.name.startswith("."):
                continue
            if entry.is_dir() and ((entry / MANIFEST_NAME).is_file() or is_checkpoint(entry)):
                found.append(entry)
            elif entry.is_dir() and depth > 0:
                walk(entry, depth - 1)
            elif entry.is_file() and entry.name.endswith(ARCHIVE_SUFFIX):
                found.append(entry)

    if root.is_dir():
        walk(root, 1)
    return found


def fingerprint(path: Path) -> float:
    """Changes when a bundle's files change (the latest mtime of it and its entries)."""
    try:
        stamps = [path.stat().st_mtime]
        if path.is_dir():
            stamps += [entry.stat().st_mtime for entry in path.iterdir()]
        return max(stamps)
    except OSError:
        return -1.0
