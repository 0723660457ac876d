"""``rlserve export`` and ``rlserve inspect``.

    rlserve export CHECKPOINT --out DIR [--policy-id/--module-id ID] [--archive] [--force]
    rlserve export --spec case.json --weights weights.npz --out DIR [--archive]
    rlserve export --obs-space obs.json --action-space act.json --config model.json \\
                   --weights weights.npz [--filter filter.json] --out DIR

An RLlib checkpoint (algorithm or policy directory, or its policy_state file; given as
CHECKPOINT or as --weights) supplies the spaces, model config, filter statistics,
normalize_actions/clip_actions and weights; the other flags override what it says. A
new-API-stack checkpoint (RLModule: the algorithm directory, learner_group/learner/rl_module
or one module's directory) is detected from its files (``cli_newstack.py``).
    rlserve export CHECKPOINT --out DIR --mapping mapping.json   (a policy set: models/export/set_cli.py)
    rlserve inspect BUNDLE [--json] [--no-verify]

Bad input (missing file, invalid JSON, space or config, weights that do not fit) exits 2
with one line saying what is wrong; an export whose runtimes disagree with eager torch
exits 1. ``inspect`` never imports torch.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from rlserve.models.checkpoint import CheckpointError, read_checkpoint
from rlserve.models.checkpoint.policy import LegacyCheckpointError
from rlserve.models.config import merge_model_config
from rlserve.models.export.bundle import load_bundle, pack_bundle
from rlserve.models.export.cli_newstack import export_new_stack
from rlserve.models.export.cli_traced import export_traced_modelv2
from rlserve.models.export.collections_paused import fewer_collections
from rlserve.models.export.describe import describe_action_dist
from rlserve.models.export.errors import BundleError
from rlserve.models.export.out_folder import OutFolderError, replacing
from rlserve.models.export.report import format_manifest
from rlserve.models.export.set_cli import add_set_arguments, export_set, format_policy_set, wants_set
from rlserve.models.extras import TORCH_EXTRA, missing
from rlserve.models.filters import filter_from_state
from rlserve.models.multiagent.mapping_flags import SetInputError
from rlserve.models.multiagent.policy_set import POLICY_SET_MANIFEST, is_policy_set
from rlserve.models.newstack import is_new_stack
from rlserve.models.spaces import space_from_json

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2


class InputError(ValueError):
    """The command line or a file it names is unusable (exit status 2)."""


# --------------------------------------------------------------------------- export

def _export_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rlserve export", description="Export an RLlib policy to a verified bundle.")
    src = p.add_argument_group("what to export")
    src.add_argument("checkpoint", nargs="?", type=Path, help="an RLlib checkpoint: the algorithm directory "
                     "(rllib_checkpoint.json, policies/<id>/), a policy directory or its policy_state.pkl/.msgpck; "
                     "read without ray and without running pickled code")
    src.add_argument("--policy-id", "--module-id", dest="policy_id",
                     help="which policy (old stack) or RLModule (new stack) of a checkpoint that holds several "
                     "(the ids are listed when needed)")
    src.add_argument("--spec", type=Path, help="one JSON file with observation_space, action_space, "
                     "model_config (or model_config_overrides) and optionally action_dist (a fixture case.json)")
    src.add_argument("--obs-space", type=Path, help="observation space JSON (rlserve.models.spaces schema)")
    src.add_argument("--action-space", type=Path, help="action space JSON")
    src.add_argument("--config", type=Path, help="model config JSON (overrides of MODEL_DEFAULTS or a full config)")
    src.add_argument("--weights", type=Path, help="RLlib state_dict as .npz (names as RLlib's), or an RLlib checkpoint "
                     "(algorithm or policy directory, policy_state.pkl; read without running pickled code)")
    src.add_argument("--filter", type=Path, help="frozen filter state JSON (rlserve.models.filters MeanStdFilter or "
                     '{"type": "NoFilter"}); overrides the checkpoint\'s statistics')
    src.add_argument("--normalize-actions", action=argparse.BooleanOptionalAction, default=None,
                     help="serve Box actions unsquashed to the bounds by default (default: the checkpoint's "
                     "normalize_actions, else off)")
    src.add_argument("--clip-actions", action=argparse.BooleanOptionalAction, default=None,
                     help="serve Box actions clipped to the bounds by default (default: the checkpoint's "
                     "clip_actions, else off)")
    src.add_argument("--trust-code", action="store_true",
                     help="a module class that is not one of RLlib's defaults (a custom RLModule) is restored with "
                     "RLlib's own loader and traced: this IMPORTS AND RUNS the checkpoint's code, so only use it on "
                     "checkpoints you trust, in an environment where ray and the module's package import")
    src.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                     help="with --trust-code: import this Python module first (one that registers the checkpoint's "
                     "custom ModelV2 with ModelCatalog.register_custom_model); repeatable")
    out = p.add_argument_group("output")
    out.add_argument("--out", type=Path, required=True, help="bundle directory to create (must not exist or be empty, "
                     "unless --force)")
    out.add_argument("--force", action="store_true", help="replace the rlserve export already at --out (a folder "
                     "that is not one is never replaced)")
    out.add_argument("--archive", action="store_true", help="also write DIR.rlsb, a single-file archive")
    out.add_argument("--formats", default="onnx,torchscript", help="comma-separated: onnx,torchscript")
    out.add_argument("--name", help="bundle name (default: the --out directory name)")
    out.add_argument("--version", help="bundle version (default: 1)")
    out.add_argument("--deterministic", action="store_true", help="serve the mode by default (explore=false; "
                     "default: the checkpoint's explore setting, else sampling)")
    out.add_argument("--quiet", action="store_true", help="no progress on stderr")
    out.add_argument("--traceback", action="store_true", help="show the full traceback when the export fails")
    add_set_arguments(p)
    return p


@dataclass
class ExportSpec:
    obs_space: Any
    action_space: Any
    model_config: dict[str, Any]
    rllib_dist: dict[str, Any] | None


def export_main(argv: list[str]) -> int:
    args = _export_parser().parse_args(argv)
    lacking = missing(TORCH_EXTRA)
    if lacking:  # every export runs the model in eager torch and writes ONNX
        print("rlserve export: error: exporting needs the [torch] extra (pip install 'rlserve[torch]'); not "
              f"installed: {', '.join(lacking)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    progress = Progress(sys.stderr, enabled=not args.quiet)
    try:
        with replacing(args.out, args.force), fewer_collections():  # reading, building and tracing
            if not wants_set(args):
                return _export(args, progress)
            written = export_set(args, progress)
        progress.done()
        print(f"wrote {written}")
        return EXIT_OK
    except (InputError, SetInputError, OutFolderError, OSError) as exc:
        progress.done()
        print(f"rlserve export: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except Exception as exc:  # the exporter or a runtime failed: not the user's input
        progress.done()
        if args.traceback:
            raise
        summary = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        print(f"rlserve export: export failed: {type(exc).__name__}: {summary} "
              "(--traceback shows the details)", file=sys.stderr)
        return EXIT_FAILED


def _export(args: argparse.Namespace, progress: Progress) -> int:
    if args.checkpoint is not None and is_new_stack(args.checkpoint):
        bundle = export_new_stack(args, progress, InputError)
        return _finish(args, bundle, progress)
    formats = tuple(f.strip() for f in args.formats.split(",") if f.strip())
    checkpoint = _read_checkpoint(args, progress)
    if checkpoint is not None and _model_is_code(checkpoint, args):
        return _finish(args, export_traced_modelv2(args, checkpoint, formats, progress, InputError), progress)
    spec = _read_spec(args, checkpoint)
    filter_state = _choose_filter(args, checkpoint)
    progress("building the model")
    model = _build_model(spec, *_read_weights(args, checkpoint))
    from rlserve.models.export.exporter import export_bundle

    try:
        dist = describe_action_dist(spec.action_space, spec.model_config, spec.rllib_dist)
        bundle = export_bundle(
            model, obs_space=spec.obs_space, action_space=spec.action_space, model_config=spec.model_config,
            out_dir=args.out, formats=formats, filter_state=filter_state, name=args.name or args.out.name,
            version=args.version, progress=progress, explore=_explore(args, checkpoint), action_dist=dist,
            normalize_actions=_setting(args.normalize_actions, checkpoint, "normalize_actions"),
            clip_actions=_setting(args.clip_actions, checkpoint, "clip_actions"),
            source=checkpoint.source_json() if checkpoint is not None else None,
        )
    except BundleError:
        raise  # a runtime disagrees with eager torch: an export failure, exit 1
    except ValueError as exc:
        raise InputError(str(exc)) from exc
    return _finish(args, bundle, progress)


def _model_is_code(checkpoint: Any, args: argparse.Namespace) -> bool:
    """An old-stack policy whose custom_model rlserve's registry does not know: with
    --trust-code it is traced; without, the refusal says what to run."""
    from rlserve.models.custom import get_custom_model

    name = checkpoint.model_config.get("custom_model")
    if not name:
        return False
    try:
        get_custom_model(name)
        return False
    except ValueError as exc:
        if not args.trust_code:
            raise InputError(f"CHECKPOINT: model.custom_model {name!r} is a ModelV2 class of the user's, which "
                             "rlserve does not know; export it by tracing, with `rlserve export CHECKPOINT "
                             "--trust-code [--import MODULE] --out DIR` run where ray and the class import (it "
                             "imports and runs the checkpoint's code), or register an equivalent model with "
                             f"rlserve (docs/custom_models.md) ({exc})") from None
        return True


def _finish(args: argparse.Namespace, bundle: Any, progress: Progress) -> int:
    """Pack the archive when asked and say where the bundle is."""
    archive = None
    if args.archive:
        progress("packing the archive")
        archive = pack_bundle(bundle.root, args.out.with_name(args.out.name + ".rlsb"))
    progress.done()
    print(f"wrote {bundle.root}" + (f" and {archive}" if archive else ""))
    return EXIT_OK


def _read_json(path: Path, what: str) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise InputError(f"{what}: file {str(path)!r} does not exist") from exc
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"{what}: {str(path)!r} is not valid JSON: {exc}") from exc


def _read_checkpoint(args: argparse.Namespace, progress: Progress) -> Any:
    """The RLlib checkpoint named by CHECKPOINT, or by --weights when that is not an .npz.

    With --weights naming a pre-2.0 checkpoint (weights only, no policy spec) and the
    spaces given by flags, only the weights are read (the old flag form).
    """
    path, what = (args.checkpoint, "CHECKPOINT") if args.checkpoint is not None else (args.weights, "--weights")
    if path is None:
        raise InputError(
            "give an RLlib CHECKPOINT, or --weights with the spaces (--spec or --obs-space/--action-space)"
        )
    if args.checkpoint is None and (path.suffix == ".npz" or not path.exists()):
        return None  # the old flag form with an .npz (a missing path is reported with the weights)
    progress(f"reading the checkpoint {path}")
    try:
        return read_checkpoint(path, args.policy_id)
    except LegacyCheckpointError as exc:
        if args.checkpoint is None and _spaces_given(args):
            return None  # weights only; read_weights_file reads them
        raise InputError(f"{what}: {exc}") from exc
    except CheckpointError as exc:
        raise InputError(f"{what}: {exc}") from exc


def _spaces_given(args: argparse.Namespace) -> bool:
    return args.spec is not None or (args.obs_space is not None and args.action_space is not None)


def _read_spec(args: argparse.Namespace, checkpoint: Any = None) -> ExportSpec:
    """Spaces, model config and action distribution: from --spec, else from the
    --obs-space/--action-space/--config flags over what the checkpoint says."""
    separate = [args.obs_space, args.action_space, args.config]
    rllib_dist = None
    if args.spec is not None:
        if any(x is not None for x in separate):
            raise InputError("give either --spec or --obs-space/--action-space/--config, not both")
        doc = _read_json(args.spec, "--spec")
        if not isinstance(doc, Mapping):
            raise InputError(f"--spec: expected a JSON object, got {type(doc).__name__}")
        nodes = {k: doc.get(k) for k in ("observation_space", "action_space")}
        if any(v is None for v in nodes.values()) and checkpoint is None:
            missing = next(k for k, v in nodes.items() if v is None)
            raise InputError(f"--spec: missing {missing!r}")
        overrides = doc.get("model_config", doc.get("model_config_overrides", {}))
        rllib_dist = doc.get("action_dist")
    else:
        if checkpoint is None and (args.obs_space is None or args.action_space is None):
            raise InputError("--obs-space and --action-space are required without --spec or a checkpoint")
        nodes = {"observation_space": _read_json(args.obs_space, "--obs-space") if args.obs_space else None,
                 "action_space": _read_json(args.action_space, "--action-space") if args.action_space else None}
        overrides = _read_json(args.config, "--config") if args.config else {}
    spaces = {}
    for key, node in nodes.items():
        if node is None:
            spaces[key] = getattr(checkpoint, key)
            continue
        try:
            spaces[key] = space_from_json(node)
        except ValueError as exc:
            raise InputError(f"{key}: {exc}") from exc
    if not isinstance(overrides, Mapping):
        raise InputError(f"model config: expected a JSON object, got {type(overrides).__name__}")
    config = {**(checkpoint.model_config if checkpoint is not None else {}), **overrides}
    try:
        config = merge_model_config(config, spaces["action_space"])
    except ValueError as exc:
        raise InputError(f"model config: {exc}") from exc
    return ExportSpec(spaces["observation_space"], spaces["action_space"], config, rllib_dist)


def _read_filter(path: Path) -> dict[str, Any] | None:
    """Validate the filter state by rebuilding the filter; store what it serialises to.

    A ``NoFilter`` state is stored as no filter at all.
    """
    data = _read_json(path, "--filter")
    if not isinstance(data, Mapping):
        raise InputError(f"--filter: expected a JSON object (a filter state_dict), got {type(data).__name__}")
    try:
        state = dict(filter_from_state(data).state_dict())
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(f"--filter: {str(path)!r} is not a filter state: {exc}") from exc
    return None if state.get("type") == "NoFilter" else state


def _choose_filter(args: argparse.Namespace, checkpoint: Any) -> dict[str, Any] | None:
    """--filter, else the checkpoint's statistics; a filter the checkpoint's config names
    but does not hold is an error (serving without it would answer differently)."""
    if args.filter is not None:
        return _read_filter(args.filter)
    if checkpoint is None:
        return None
    if checkpoint.filter_missing:
        raise InputError(
            f"{checkpoint.filter_missing}. Pass --filter FILE with the statistics (a MeanStdFilter state "
            'JSON, see docs/export.md), or --filter with {"type": "NoFilter"} to export without the filter'
        )
    return checkpoint.filter_state


def _read_weights(args: argparse.Namespace, checkpoint: Any) -> tuple[Mapping[str, Any], str]:
    """(RLlib-named weights, the flag they came from, for messages)."""
    from rlserve.models.rllib_import import read_weights_file

    if args.weights is None:
        return checkpoint.weights, "CHECKPOINT"
    if checkpoint is not None and args.checkpoint is None:
        return checkpoint.weights, "--weights"  # --weights was the checkpoint read above
    if not args.weights.exists():
        raise InputError(f"--weights: file {str(args.weights)!r} does not exist")
    try:
        return read_weights_file(args.weights, args.policy_id), "--weights"
    except ValueError as exc:
        raise InputError(f"--weights: {exc}") from exc


def _setting(flag: bool | None, checkpoint: Any, name: str) -> bool:
    if flag is not None:
        return flag
    return bool(getattr(checkpoint, name)) if checkpoint is not None else False


def _explore(args: argparse.Namespace, checkpoint: Any) -> bool:
    if args.deterministic:
        return False
    return checkpoint.explore if checkpoint is not None else True


def _build_model(spec: ExportSpec, weights: Mapping[str, Any], what: str):
    from rlserve.models.catalog import build_model
    from rlserve.models.rllib_import import load_rllib_weights

    try:
        model = build_model(spec.obs_space, spec.action_space, spec.model_config)
    except (ValueError, NotImplementedError) as exc:
        raise InputError(f"cannot build the model: {exc}") from exc
    try:
        load_rllib_weights(model, weights)
    except ValueError as exc:
        raise InputError(f"{what}: {exc}") from exc
    return model.eval()


# --------------------------------------------------------------------------- progress

class Progress:
    """Export progress on stderr: one rewritten line on a terminal, plain lines otherwise."""

    def __init__(self, stream: TextIO, enabled: bool = True) -> None:
        self.stream, self.enabled = stream, enabled
        self.tty = enabled and stream.isatty()
        self.start = time.monotonic()
        self._open = False

    def __call__(self, message: str) -> None:
        if not self.enabled:
            return
        line = f"[{time.monotonic() - self.start:6.1f}s] {message}"
        if self.tty:
            self.stream.write("\r\033[K" + line)
            self._open = True
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def done(self) -> None:
        if self._open:
            self.stream.write("\n")
            self.stream.flush()
            self._open = False


# --------------------------------------------------------------------------- inspect

def _inspect_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rlserve inspect", description="Print a bundle's manifest readably.")
    p.add_argument("bundle", type=Path, help="bundle directory or .rlsb archive")
    p.add_argument("--json", action="store_true", help="print the manifest JSON as stored")
    p.add_argument("--no-verify", action="store_true", help="skip the checksum verification")
    return p


def inspect_main(argv: list[str]) -> int:
    args = _inspect_parser().parse_args(argv)

    if is_policy_set(args.bundle):
        try:
            text = ((args.bundle / POLICY_SET_MANIFEST).read_text(encoding="utf-8").rstrip() if args.json
                    else format_policy_set(args.bundle, verified=not args.no_verify))
        except BundleError as exc:
            print(f"rlserve inspect: error: {args.bundle}: {exc}", file=sys.stderr)
            return EXIT_BAD_INPUT
        print(text)
        return EXIT_OK

    try:
        bundle = load_bundle(args.bundle, verify_checksums=not args.no_verify)
    except BundleError as exc:
        # The bundle's messages name files inside it; say which bundle they are about.
        print(f"rlserve inspect: error: {args.bundle}: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    with bundle:  # an archive's unpacked copy goes when we are done
        if args.json:
            print(json.dumps(bundle.manifest.data, indent=2))
        else:
            print(format_manifest(bundle, verified=not args.no_verify))
    return EXIT_OK
