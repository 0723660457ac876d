"""Self-describing policy bundles: manifest, checksums, load and verification (torch-free).

A bundle is a flat directory (or a ``*.rlsb`` archive of one, see ``archive.py``)::

    manifest.json    what the policy is: spaces, model config, action distribution,
                     preprocessor, frozen filter, model signature, runtime files, versions,
                     sha256 of every other file, and ``manifest_sha256`` over its own body
    model.onnx       ONNX graph (inputs/outputs named as in the signature, dynamic batch)
    model_policy.onnx  the ONNX graph without the value head (``runtimes.onnx.policy_file``;
                     absent in bundles written before it existed)
    model.ts         TorchScript module (same positional contract)
    reference.npz    reference inputs and the eager model's outputs for them

Loading never unpickles: JSON for the manifest, ``np.load(allow_pickle=False)`` for the
reference, and the runtime files are only checksummed here (a runtime loads them later).
The server calls ``verify_reference`` with its own runtime before it serves a bundle.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import tarfile
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from rlserve.models.export.archive import (
    MANIFEST_NAME,
    MAX_UNPACKED_BYTES,
    check_plain_name,
    unpack_bundle,
)
from rlserve.models.export.errors import BundleError
from rlserve.models.export.manifest import Manifest, RuntimeInfo
from rlserve.models.export.names import check_name
from rlserve.models.export.verify import MAX_RTOL, compare_outputs
from rlserve.models.interface import ModelSignature

__all__ = [
    "FORMAT_VERSION",
    "MANIFEST_NAME",
    "Bundle",
    "BundleError",
    "Manifest",
    "RuntimeInfo",
    "load_bundle",
    "manifest_digest",
    "pack_bundle",
    "sha256_file",
    "unpack_bundle",
    "verify_reference",
    "write_manifest",
]

FORMAT = "rlserve-bundle"
FORMAT_VERSION = 1
_REQUIRED: dict[str, type | tuple[type, ...]] = {
    "format": str,
    "format_version": int,
    "name": str,
    "version": str,
    "created_at": str,
    "observation_space": dict,
    "action_space": dict,
    "model_config": dict,
    "action_dist": dict,
    "num_outputs": int,
    "preprocessor": dict,
    "signature": dict,
    "runtimes": dict,
    "reference": dict,
    "explore": bool,
    "files": dict,
    "manifest_sha256": str,
}


# --------------------------------------------------------------------------- checksums

def sha256_file(path: str | os.PathLike[str]) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def manifest_digest(data: Mapping[str, Any]) -> str:
    """sha256 of the manifest body in canonical JSON, ``manifest_sha256`` itself excluded.

    Canonical = sorted keys, no whitespace, ASCII; so re-indenting the file keeps the
    digest, while changing any value breaks it.
    """
    body = {k: v for k, v in data.items() if k != "manifest_sha256"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def write_manifest(bundle_dir: str | os.PathLike[str], data: Mapping[str, Any], files: list[str]) -> dict[str, Any]:
    """Checksum ``files`` (plain names inside ``bundle_dir``) and write ``manifest.json``.

    Returns the manifest as written, with ``files`` and ``manifest_sha256`` filled in.
    """
    root = Path(bundle_dir)
    manifest = dict(data)
    manifest["files"] = {
        check_plain_name(name): {"sha256": sha256_file(root / name), "bytes": (root / name).stat().st_size}
        for name in sorted(files)
    }
    manifest["manifest_sha256"] = manifest_digest(manifest)
    text = json.dumps(manifest, indent=2, sort_keys=False, allow_nan=False) + "\n"
    (root / MANIFEST_NAME).write_text(text, encoding="utf-8")
    return manifest


class Scratch(Protocol):
    """What a bundle owns on disk and deletes at ``close()``: a ``TemporaryDirectory``, or a
    folder shared with other bundles that goes with the last of them."""

    def cleanup(self) -> None: ...


@dataclass
class Bundle:
    """A loaded (and, unless asked otherwise, checksum-verified) bundle directory."""

    root: Path
    manifest: Manifest
    source: Path | None = None  # the archive it was unpacked from, if any
    # Keeps the extraction directory of an archive (or an export) alive as long as the bundle.
    _tmp: Scratch | None = field(default=None, repr=False)

    def close(self) -> None:
        """Delete the directory an archive was unpacked into; the bundle is unusable after.

        A bundle loaded from a directory owns nothing: its files are never touched.
        """
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> Bundle:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def path(self, name: str) -> Path:
        if name not in self.manifest.files:
            raise BundleError(f"{name!r} is not a file of this bundle; it has {sorted(self.manifest.files)}")
        return self.root / name

    def runtime_path(self, kind: str) -> Path:
        """Path of the runtime file for ``kind`` ('onnx' or 'torchscript')."""
        runtimes = self.manifest.runtimes
        if kind not in runtimes:
            raise BundleError(f"bundle {self.manifest.name!r} has no {kind!r} runtime; it has {sorted(runtimes)}")
        return self.path(runtimes[kind].file)

    def policy_path(self, kind: str) -> Path | None:
        """Path of the runtime's graph without the value head, if the bundle has one."""
        runtimes = self.manifest.runtimes
        name = runtimes[kind].info.get("policy_file") if kind in runtimes else None
        return None if name is None else self.path(name)

    def reference(self) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """(inputs, expected outputs) keyed by the signature's input/output names."""
        path = self.path(self.manifest.reference["file"])
        try:
            with np.load(path, allow_pickle=False) as z:
                arrays = {k: z[k] for k in z.files}
        except (OSError, ValueError) as exc:
            raise BundleError(f"{path.name}: unreadable reference file: {exc}") from exc
        inputs = _strip(arrays, "inputs/")
        outputs = _strip(arrays, "outputs/")
        _expect_names("reference inputs", inputs, self.manifest.input_names)
        _expect_names("reference outputs", outputs, self.manifest.output_names)
        return inputs, outputs


def _strip(arrays: Mapping[str, np.ndarray], prefix: str) -> dict[str, np.ndarray]:
    return {k[len(prefix):]: v for k, v in arrays.items() if k.startswith(prefix)}


def _expect_names(what: str, got: Mapping[str, Any], expected: list[str]) -> None:
    if sorted(got) != sorted(expected):
        raise BundleError(f"{what}: expected {expected}, found {sorted(got)}")


# --------------------------------------------------------------------------- loading

def load_bundle(
    path_or_archive: str | os.PathLike[str],
    *,
    verify_checksums: bool = True,
    max_unpacked_bytes: int = MAX_UNPACKED_BYTES,
) -> Bundle:
    """Load a bundle directory or ``*.rlsb`` archive; raises ``BundleError`` when unusable.

    An archive is unpacked (safely, at most ``max_unpacked_bytes``, see ``archive.py``)
    into a temporary directory owned by the ``Bundle``: ``Bundle.close()`` deletes it (so
    does garbage collection, eventually). With ``verify_checksums`` the manifest digest and
    every file's sha256 are checked. Messages name files inside the bundle, never the
    directory it was unpacked into.
    """
    path = Path(path_or_archive)
    if path.is_dir():
        return _load_dir(path, verify_checksums, tmp=None)
    if not path.exists():
        raise BundleError(f"bundle {str(path)!r} does not exist")
    tmp = tempfile.TemporaryDirectory(prefix="rlsb-")
    try:
        unpack_bundle(path, tmp.name, max_unpacked_bytes=max_unpacked_bytes)
        bundle = _load_dir(Path(tmp.name), verify_checksums, tmp=tmp)
    except BaseException:
        tmp.cleanup()
        raise
    bundle.source = path
    return bundle


def _load_dir(root: Path, verify: bool, tmp: tempfile.TemporaryDirectory | None) -> Bundle:
    data = _read_manifest(root)
    _check_structure(data)
    if verify:
        _check_digests(data, root)
    return Bundle(root=root, manifest=Manifest(data), _tmp=tmp)


def _read_manifest(root: Path) -> dict[str, Any]:
    path = root / MANIFEST_NAME
    if not path.is_file() or path.is_symlink():
        raise BundleError(f"no {MANIFEST_NAME} (is this a bundle directory?)")
    try:
        data = json.loads(path.read_text(encoding="utf-8"), parse_constant=_refuse_constant)
    except (UnicodeDecodeError, json.JSONDecodeError, ValueError) as exc:
        raise BundleError(f"{MANIFEST_NAME}: not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise BundleError(f"{MANIFEST_NAME}: expected a JSON object, got {type(data).__name__}")
    try:  # JSON's "\ud800" escape: not text; a name, version or id holding it cannot be logged (Parquet)
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as exc:
        raise BundleError(f"{MANIFEST_NAME}: a string holds a lone surrogate escape "
                          f"({exc.object[exc.start]!r}); expected valid Unicode text") from None
    return data


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"non-standard JSON constant {name}")


def _check_structure(data: dict[str, Any]) -> None:
    where = MANIFEST_NAME
    if data.get("format") != FORMAT:
        raise BundleError(f"{where}: 'format' is {data.get('format')!r}, expected {FORMAT!r}")
    version = data.get("format_version")
    if not isinstance(version, int) or version > FORMAT_VERSION or version < 1:
        raise BundleError(
            f"{where}: format_version {version!r} is not supported (this rlserve reads 1..{FORMAT_VERSION})"
        )
    for key, typ in _REQUIRED.items():
        if key not in data:
            raise BundleError(f"{where}: missing required field {key!r}")
        if not isinstance(data[key], typ) or (typ is int and isinstance(data[key], bool)):
            raise BundleError(f"{where}: field {key!r} should be {_type_name(typ)}, got {type(data[key]).__name__}")
    for key in ("name", "version"):  # how the model is addressed: see names.py
        check_name(data[key], key, where)
    for name in data["files"]:
        check_plain_name(name, f"{where}: listed file")
    for key in ("normalize_actions", "clip_actions"):
        if key in data and not isinstance(data[key], bool):
            raise BundleError(f"{where}: field {key!r} should be bool, got {type(data[key]).__name__}")
    if "connectors" in data and not isinstance(data["connectors"], dict):
        raise BundleError(f"{where}: field 'connectors' should be dict, got {type(data['connectors']).__name__}")
    _check_signature(data, where)
    _check_file_refs(data, where)


def _type_name(typ: type | tuple[type, ...]) -> str:
    return " or ".join(t.__name__ for t in typ) if isinstance(typ, tuple) else typ.__name__


def _check_signature(data: dict[str, Any], where: str) -> None:
    try:
        sig = ModelSignature.from_json(data["signature"])
    except (KeyError, TypeError, ValueError) as exc:
        raise BundleError(f"{where}: invalid signature: {exc!r}") from exc
    for key, expected in (("input_names", sig.input_names), ("output_names", sig.output_names)):
        if data["signature"].get(key) != expected:
            raise BundleError(
                f"{where}: signature.{key} is {data['signature'].get(key)!r}, "
                f"but the state/prev layout implies {expected}"
            )
    if sig.num_outputs != data["num_outputs"]:
        raise BundleError(f"{where}: signature.num_outputs {sig.num_outputs} != num_outputs {data['num_outputs']}")


def _check_file_refs(data: dict[str, Any], where: str) -> None:
    refs = [(f"runtimes.{k}.file", v.get("file") if isinstance(v, dict) else None) for k, v in data["runtimes"].items()]
    refs += [(f"runtimes.{k}.policy_file", v["policy_file"]) for k, v in data["runtimes"].items()
             if isinstance(v, dict) and "policy_file" in v]
    refs.append(("reference.file", data["reference"].get("file")))
    if not data["runtimes"]:
        raise BundleError(f"{where}: 'runtimes' is empty; a bundle needs at least one model file")
    for what, name in refs:
        if name not in data["files"]:
            raise BundleError(f"{where}: {what} {name!r} is not among the checksummed files {sorted(data['files'])}")


def _check_digests(data: dict[str, Any], root: Path) -> None:
    where = MANIFEST_NAME
    if manifest_digest(data) != data["manifest_sha256"]:
        raise BundleError(f"{where}: manifest_sha256 does not match the manifest body; the manifest was modified")
    for name, entry in data["files"].items():
        path = root / name
        if not path.is_file() or path.is_symlink():
            raise BundleError(f"listed file {name!r} is missing (or not a regular file)")
        expected = entry.get("sha256") if isinstance(entry, dict) else None
        actual = sha256_file(path)
        if actual != expected:
            raise BundleError(
                f"{name}: sha256 {actual} does not match the manifest's {expected}; the file was modified"
            )


# --------------------------------------------------------------------------- packing

def pack_bundle(bundle_dir: str | os.PathLike[str], archive_path: str | os.PathLike[str]) -> Path:
    """Write the manifest and every file it lists into a gzip'd tar at ``archive_path``.

    The bundle is loaded (and its checksums verified) first, so a broken bundle is never
    packed. The manifest comes first (unpacking needs it first), then the files in sorted
    order, with zeroed owner and time fields, so the same bundle packs to the same bytes.
    The archive appears atomically (temp + rename).
    """
    bundle = load_bundle(bundle_dir)
    archive_path = Path(archive_path)
    archive_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = archive_path.with_name(archive_path.name + ".partial")
    names = [MANIFEST_NAME, *sorted(bundle.manifest.files)]
    try:
        # No name and mtime=0 in the gzip header either, for reproducible bytes.
        with (
            open(tmp, "wb") as raw,
            gzip.GzipFile(filename="", fileobj=raw, mode="wb", mtime=0) as gz,
            tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar,
        ):
            for name in names:
                _add_file(tar, bundle.root / name, name)
        os.replace(tmp, archive_path)
    finally:
        tmp.unlink(missing_ok=True)
    return archive_path


def _add_file(tar: tarfile.TarFile, path: Path, name: str) -> None:
    info = tarfile.TarInfo(name)
    info.size = path.stat().st_size
    info.mode = 0o644
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    with open(path, "rb") as fh:
        tar.addfile(info, fh)


# --------------------------------------------------------------------------- reference check

def verify_reference(
    bundle: Bundle,
    run: Callable[[dict[str, np.ndarray]], Mapping[str, np.ndarray]],
    rtol: float | None = None,
    atol: float | None = None,
    max_rtol: float | None = None,
    outputs: list[str] | None = None,
    reference: tuple[Mapping[str, np.ndarray], Mapping[str, np.ndarray]] | None = None,
) -> dict[str, float]:
    """Run the reference inputs through ``run`` and compare with the stored outputs.

    ``run`` maps input name -> array to output name -> array (any runtime). ``rtol``,
    ``atol`` and ``max_rtol`` (float32 rounding relative to an output's largest magnitude,
    see ``rlserve.models.export.verify``) default to what the exporter verified with; a bundle
    written before ``max_rtol`` was recorded gets today's ``MAX_RTOL``, which only widens
    its old bound by that rounding term. ``outputs`` limits the check to those outputs (a
    graph that computes only some). ``reference`` is ``bundle.reference()`` when the
    caller read it already. Returns the max absolute difference per output;
    raises ``BundleError`` naming the first output that disagrees.
    """
    ref = bundle.manifest.reference
    rtol = float(ref.get("rtol", 1e-4)) if rtol is None else rtol
    atol = float(ref.get("atol", 1e-5)) if atol is None else atol
    max_rtol = float(ref.get("max_rtol", MAX_RTOL)) if max_rtol is None else max_rtol
    inputs, expected = bundle.reference() if reference is None else reference
    if outputs is not None:
        expected = {name: expected[name] for name in outputs}
    actual = run(dict(inputs))
    return compare_outputs(actual, expected, rtol, atol, what=f"bundle {bundle.manifest.name!r}",
                           max_rtol=max_rtol)
