"""Export a contract model to a verified bundle: ONNX + TorchScript + manifest + reference.

    model ─► reference inputs (B=3) ─► eager outputs
          ─► model.onnx (dynamo exporter) ─► ONNX Runtime at B=1, 3, 64 == eager?
          ─► model_policy.onnx (model.onnx without the value head) ─► the same check
          ─► model.ts   (jit.trace)      ─► TorchScript at B=1, 3, 64 == eager?
          ─► reference.npz + manifest.json (sha256 of everything) ─► load_bundle()

A bundle whose runtimes disagree with the eager model is never written: the files are
built in a staging directory beside ``out_dir`` and renamed into place only at the end.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from rlserve.models.export.bundle import (
    FORMAT,
    FORMAT_VERSION,
    Bundle,
    BundleError,
    load_bundle,
    write_manifest,
)
from rlserve.models.export.collections_paused import fewer_collections
from rlserve.models.export.describe import describe_action_dist, describe_preprocessor
from rlserve.models.export.names import check_name
from rlserve.models.export.onnx import export_onnx, onnx_runner, prune_onnx
from rlserve.models.export.reference import make_reference_inputs
from rlserve.models.export.torchscript import export_torchscript, torchscript_runner
from rlserve.models.export.verify import MAX_RTOL, RULE, compare_outputs
from rlserve.models.interface import ModelSignature
from rlserve.models.spaces import space_to_json

FORMATS = ("onnx", "torchscript")
_FILES = {"onnx": "model.onnx", "torchscript": "model.ts"}
POLICY_ONNX_FILE = "model_policy.onnx"  # the ONNX graph without the value head
REFERENCE_FILE = "reference.npz"
REFERENCE_BATCH = 3  # > 1: torch.export specialises batch sizes 0 and 1
CHECK_BATCHES = (1, 64)  # extra batch sizes every runtime must get right
# Export-time agreement with eager torch: |a - e| <= ATOL + RTOL |e| + MAX_RTOL max|e| per
# output (rlserve.models.export.verify; docs/export.md says why). MAX_RTOL, float32 rounding relative
# to the output's largest magnitude, covers what an elementwise RTOL did (|e| <= max|e|), so
# RTOL is 0; ATOL only matters for outputs whose values are all below ~0.03. The manifest
# records all three, and the server re-checks the reference with them on its own CPU.
RTOL = 0.0
ATOL = 1e-6

Progress = Callable[[str], None]


def export_bundle(
    model: torch.nn.Module,
    *,
    obs_space: Any,
    action_space: Any,
    model_config: Mapping[str, Any],
    out_dir: str | Path,
    formats: Sequence[str] = FORMATS,
    filter_state: Mapping[str, Any] | None = None,
    name: str | None = None,
    version: str | None = None,
    reference_batch: Mapping[str, np.ndarray] | None = None,
    progress: Progress | None = None,
    explore: bool = True,
    action_dist: Mapping[str, Any] | None = None,
    preprocessor: Mapping[str, Any] | None = None,
    normalize_actions: bool = False,
    clip_actions: bool = False,
    source: Mapping[str, Any] | None = None,
    connectors: Mapping[str, Any] | None = None,
    make_inputs: Callable[[int, int], dict[str, np.ndarray]] | None = None,
) -> Bundle:
    """Export ``model`` (the uniform contract of ``rlserve.models.interface``) to ``out_dir``.

    ``reference_batch`` maps input name -> (B, ...) array (default: drawn from the spaces).
    ``action_dist``/``preprocessor`` override the descriptions derived from the spaces and
    config (for custom models whose dist is not the catalog's). ``out_dir`` must not exist
    or be empty. Raises ``BundleError`` if a runtime disagrees with the eager model.
    ``normalize_actions``/``clip_actions`` record RLlib's settings of the same names: what
    the server does to an action before handing it to the environment by default
    (unsquash to the Box bounds, else clip to them). ``source`` records provenance (e.g.
    the RLlib checkpoint's policy id and ray version). ``connectors`` records a new-stack
    module's connector layout (``rlserve.models.connectors.plan``); ``make_inputs(batch,
    seed)`` then draws the reference and check inputs (the default draws them from the
    spaces through the old stack's preprocessor).
    """
    say = progress or (lambda _msg: None)
    formats = _check_formats(formats)
    out_dir = Path(out_dir)
    _check_out_dir(out_dir)
    model = model.eval()
    signature: ModelSignature = cast(Any, model).signature()  # nn.Module's stubs lack it
    say("describing spaces, preprocessor and action distribution")
    action_dist = action_dist or describe_action_dist(action_space, model_config)
    if int(action_dist.get("num_outputs", -1)) != signature.num_outputs:
        raise ValueError(
            f"action distribution {action_dist.get('class')!r} needs num_outputs="
            f"{action_dist.get('num_outputs')}, but the model produces {signature.num_outputs}"
        )
    _check_filter(filter_state, signature)
    preprocessor = preprocessor or describe_preprocessor(obs_space, model_config)
    if [int(d) for d in preprocessor.get("output_shape", signature.obs_shape)] != list(signature.obs_shape):
        raise ValueError(
            f"the preprocessor outputs shape {preprocessor['output_shape']} but the model takes "
            f"observations of shape {list(signature.obs_shape)}"
        )
    manifest = _manifest_body(
        signature, obs_space, action_space, model_config, filter_state, name, version, explore,
        action_dist, preprocessor,
    )
    for key in ("name", "version"):  # refused now, not by the load_bundle after the export
        check_name(manifest[key], key, "export")
    manifest["normalize_actions"] = bool(normalize_actions)
    manifest["clip_actions"] = bool(clip_actions)
    if source is not None:
        manifest["source"] = _jsonable(dict(source))
    if connectors is not None:
        manifest["connectors"] = _jsonable(dict(connectors))
    if make_inputs is None:
        def make_inputs(batch: int, seed: int) -> dict[str, np.ndarray]:
            return make_reference_inputs(signature, obs_space, action_space, model_config, filter_state, batch,
                                         seed=seed)
    reference = dict(reference_batch) if reference_batch is not None else make_inputs(REFERENCE_BATCH, 0)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.partial-", dir=out_dir.parent))
    # mkdtemp makes the directory 0700; a bundle is shared data (other users, a container's
    # non-root user), so give it the permissions a plain mkdir would have had.
    umask = os.umask(0)
    os.umask(umask)
    stage.chmod(0o777 & ~umask)
    try:
        with fewer_collections():  # tracing makes millions of short-lived objects
            _build(model, signature, formats, reference, stage, manifest, say,
                   checks=[make_inputs(b, b) for b in CHECK_BATCHES])
        say("writing manifest")
        files = [*(_FILES[f] for f in formats), REFERENCE_FILE]
        files += [info["policy_file"] for info in manifest["runtimes"].values() if "policy_file" in info]
        write_manifest(stage, manifest, files)
        _move_into_place(stage, out_dir)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return load_bundle(out_dir)


def _check_filter(filter_state: Mapping[str, Any] | None, signature: ModelSignature) -> None:
    shape = None if filter_state is None else filter_state.get("shape")
    if shape is not None and tuple(shape) != tuple(signature.obs_shape):
        raise ValueError(
            f"filter_state: the filter's shape {list(shape)} differs from the model's observation "
            f"shape {list(signature.obs_shape)} (the filter runs on the preprocessed observation)"
        )


def _check_formats(formats: Sequence[str]) -> tuple[str, ...]:
    formats = tuple(dict.fromkeys(formats))
    unknown = [f for f in formats if f not in FORMATS]
    if unknown or not formats:
        raise ValueError(f"formats: expected a non-empty subset of {list(FORMATS)}, got {list(formats)}")
    return formats


def _check_out_dir(out_dir: Path) -> None:
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise ValueError(f"out_dir {str(out_dir)!r} exists and is not an empty directory")


def _move_into_place(stage: Path, out_dir: Path) -> None:
    if out_dir.is_dir():
        out_dir.rmdir()  # empty (checked before export); rename needs the name free
    stage.rename(out_dir)


def _manifest_body(
    signature: ModelSignature, obs_space: Any, action_space: Any, model_config: Mapping[str, Any],
    filter_state: Mapping[str, Any] | None, name: str | None, version: str | None, explore: bool,
    action_dist: Mapping[str, Any], preprocessor: Mapping[str, Any],
) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "name": name or "policy",
        "version": str(version) if version is not None else "1",
        "created_at": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "observation_space": space_to_json(obs_space),
        "action_space": space_to_json(action_space),
        "model_config": _jsonable(dict(model_config)),
        "action_dist": _jsonable(dict(action_dist)),
        "num_outputs": signature.num_outputs,
        "preprocessor": _jsonable(dict(preprocessor)),
        "filter": _jsonable(dict(filter_state)) if filter_state is not None else None,
        "signature": {
            **_jsonable(signature.to_json()),
            "input_names": signature.input_names,
            "output_names": signature.output_names,
        },
        "explore": bool(explore),
        "producer": {"python": platform.python_version(), "numpy": np.__version__, "torch": torch.__version__},
        "runtimes": {},
        "reference": {},
    }


def _jsonable(value: Any) -> Any:
    """Tuples to lists, numpy scalars to Python, classes to dotted paths (custom_model)."""
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.generic | np.ndarray):
        return _jsonable(value.tolist())
    if isinstance(value, type):
        return f"{value.__module__}.{value.__qualname__}"
    if value is None or isinstance(value, bool | int | float | str):
        return value
    raise BundleError(f"cannot store {type(value).__name__} {value!r} in a JSON manifest")


# --------------------------------------------------------------------------- build + verify

def _build(
    model: torch.nn.Module, signature: ModelSignature, formats: tuple[str, ...],
    reference: dict[str, np.ndarray], stage: Path, manifest: dict[str, Any], say: Progress,
    checks: list[dict[str, np.ndarray]],
) -> None:
    _check_reference_names(reference, signature)
    say("running the eager model on the reference inputs")
    expected = eager_outputs(model, signature, reference)
    batches = [(reference, expected)] + [(c, eager_outputs(model, signature, c)) for c in checks]
    example = _tensors(reference, signature)
    worst: dict[str, float] = {}
    for fmt in formats:
        path = stage / _FILES[fmt]
        say(f"exporting {fmt} ({path.name})")
        if fmt == "onnx":
            info = export_onnx(model, example, signature, path)
            run = onnx_runner(path)
        else:
            info = export_torchscript(model, example, path)
            run = torchscript_runner(path, signature.input_names, signature.output_names)
        say(f"verifying {fmt} against eager torch at batch sizes {[len(b['obs']) for b, _ in batches]}")
        worst[fmt] = _verify_runtime(fmt, run, batches)
        manifest["runtimes"][fmt] = {"file": path.name, **info}
        if fmt == "onnx":
            manifest["runtimes"][fmt]["policy_file"] = _export_policy_graph(path, signature, batches, say)
    # One dict: numpy's stubs would match separate ** unpackings against allow_pickle.
    arrays: dict[str, Any] = {f"inputs/{k}": v for k, v in reference.items()}
    arrays.update({f"outputs/{k}": v for k, v in expected.items()})
    np.savez(stage / REFERENCE_FILE, **arrays)
    manifest["reference"] = {
        "file": REFERENCE_FILE,
        "batch_size": int(len(reference["obs"])),
        "rtol": RTOL,
        "atol": ATOL,
        "max_rtol": MAX_RTOL,
        "tolerance_rule": RULE,
        "max_abs_diff": worst,
        "checked_batch_sizes": sorted({len(b["obs"]) for b, _ in batches}),
    }


def _export_policy_graph(
    path: Path, signature: ModelSignature, batches: list[tuple[dict[str, np.ndarray], dict[str, np.ndarray]]],
    say: Progress,
) -> str:
    """Write the acting graph (``path`` without the value head) beside it and verify it
    against eager torch like the full graph; the server runs it for batches that do not
    ask for the value."""
    out = path.parent / POLICY_ONNX_FILE
    say(f"pruning the value head into {out.name}")
    prune_onnx(path, out, signature)
    policy_batches = [(inputs, {k: v for k, v in expected.items() if k in signature.policy_output_names})
                      for inputs, expected in batches]
    _verify_runtime("onnx policy graph", onnx_runner(out), policy_batches)
    return out.name


def _check_reference_names(reference: Mapping[str, np.ndarray], signature: ModelSignature) -> None:
    if sorted(reference) != sorted(signature.input_names):
        raise ValueError(f"reference_batch: expected inputs {signature.input_names}, got {sorted(reference)}")
    sizes = {k: np.shape(v)[0] if np.ndim(v) else None for k, v in reference.items()}
    if len(set(sizes.values())) != 1 or sizes["obs"] in (None, 0, 1):
        raise ValueError(f"reference_batch: every input needs the same batch size >= 2, got {sizes}")


def _tensors(inputs: Mapping[str, np.ndarray], signature: ModelSignature) -> tuple[torch.Tensor, ...]:
    return tuple(torch.from_numpy(np.ascontiguousarray(inputs[n], dtype=np.float32)) for n in signature.input_names)


def eager_outputs(
    model: torch.nn.Module, signature: ModelSignature, inputs: Mapping[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """Run the eager model; check the output count and batch sizes against the signature."""
    with torch.no_grad():
        outs = model(*_tensors(inputs, signature))
    outs = (outs,) if isinstance(outs, torch.Tensor) else tuple(outs)
    if len(outs) != len(signature.output_names):
        raise ValueError(f"model returned {len(outs)} outputs; its signature names {signature.output_names}")
    result = {n: o.detach().numpy().astype(np.float32) for n, o in zip(signature.output_names, outs, strict=True)}
    batch = len(inputs["obs"])
    for n, arr in result.items():
        if arr.ndim == 0 or arr.shape[0] != batch:
            raise ValueError(f"model output {n!r} has shape {arr.shape}; expected a leading batch of {batch}")
    return result


def _verify_runtime(
    fmt: str, run: Callable[[dict[str, np.ndarray]], Mapping[str, np.ndarray]],
    batches: list[tuple[dict[str, np.ndarray], dict[str, np.ndarray]]],
) -> float:
    worst = 0.0
    for inputs, expected in batches:
        what = f"{fmt} export at batch size {len(inputs['obs'])} vs eager torch"
        diffs = compare_outputs(run(inputs), expected, RTOL, ATOL, what=what, max_rtol=MAX_RTOL)
        worst = max(worst, *diffs.values())
    return worst
