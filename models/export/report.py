"""A bundle's manifest as readable text, for ``rlserve inspect`` (torch-free)."""

from __future__ import annotations

import json
from typing import Any

from rlserve.models.config import MODEL_DEFAULTS
from rlserve.models.export.bundle import Bundle
from rlserve.models.newstack.config import DEFAULT_MODEL_CONFIG
from rlserve.models.spaces import space_from_json

_SEP = "-" * 72
_IMAGE_PREPROCESSOR = "GenericPixelPreprocessor"


def format_manifest(bundle: Bundle, verified: bool = True) -> str:
    m = bundle.manifest
    sections = [
        _header(bundle, verified),
        _spaces(m.data),
        _preprocessing(m.data),
        _dist(m.data),
        _config_diff(m.model_config, new_stack=m.connectors is not None),
        _signature(m.data["signature"], one_hot=(m.connectors or {}).get("prev_action_encoding") == "one_hot"),
        _runtimes(m.data),
        _files(m.files),
        _reference(m.reference),
    ]
    return f"\n{_SEP}\n".join(sections)


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(", ", ": "))


def _header(bundle: Bundle, verified: bool) -> str:
    m = bundle.manifest
    check = "all sha256 checksums verified" if verified else "checksums NOT verified (--no-verify)"
    return "\n".join([
        f"bundle      {m.name} (version {m.version})",
        f"path        {bundle.source or bundle.root}",
        f"format      {m.data['format']} v{m.format_version}, created {m.created_at}",
        f"explore     {str(m.explore).lower()} (default for requests that do not say)",
        f"actions     normalize_actions={str(m.normalize_actions).lower()} clip_actions={str(m.clip_actions).lower()}",
        f"stack       {_stack(m.source)}",
        *([f"source      {_compact(m.source)}"] if m.source else []),
        f"integrity   {check}",
    ])


def _stack(source: dict[str, Any] | None) -> str:
    """Which RLlib stack (and, for the new one, which module) the bundle came from."""
    if not source or source.get("kind") != "rllib_checkpoint":
        return "not exported from an RLlib checkpoint"
    if source.get("stack") == "new":
        module_class = str(source.get("module_class") or "?").rpartition(".")[2]
        algorithm = str(source.get("algorithm") or "?").rpartition(".")[2]
        return (f"RLlib new API stack (RLModule): module {source.get('module_id')!r} {module_class}, "
                f"algorithm {algorithm}{_traced(source)}")
    policy_class = source.get("policy_class") or ""
    return f"RLlib old API stack (ModelV2/Policy): policy {source.get('policy_id')!r} {policy_class}{_traced(source)}"


def _traced(source: dict[str, Any]) -> str:
    """A module class of the user's, exported by tracing it (``--trust-code``)."""
    if source.get("exported_by") != "tracing":
        return ""
    dist = str(source.get("action_dist_class") or "").rpartition(".")[2]
    folded = ", its constructor in the graph" if source.get("dist_inputs") == "the distribution's parameters" else ""
    return f"; traced (--trust-code){f', distribution class {dist}{folded}' if dist else ''}"


def _spaces(data: dict[str, Any]) -> str:
    lines = []
    for key, label in (("observation_space", "observation space"), ("action_space", "action space")):
        lines.append(f"{label}: {space_from_json(data[key])!r}")
        lines.append(f"  json: {_compact(data[key])}")
    return "\n".join(lines)


def _preprocessing(data: dict[str, Any]) -> str:
    prep = data["preprocessor"]
    shape = tuple(prep.get("output_shape", ()))
    connectors = data.get("connectors")
    if connectors is not None:
        return _connectors(connectors, shape)
    line = f"preprocessor: {prep.get('class')} -> {shape} {prep.get('output_dtype', '')}"
    # dim/grayscale/zero_mean only mean something to an image leaf; the manifest records
    # them for every preprocessor.
    if _IMAGE_PREPROCESSOR in json.dumps(prep):
        line += "  (image options: " + " ".join(f"{k}={v}" for k, v in (prep.get("options") or {}).items()) + ")"
    lines = [line]
    filt = data.get("filter")
    if filt is None:
        lines.append("filter: none")
    else:
        summary = {k: v for k, v in filt.items() if not isinstance(v, list | dict)}
        lines.append(f"filter: frozen {filt.get('type', filt.get('class', 'MeanStdFilter'))} {_compact(summary)}")
    return "\n".join(lines)


def _connectors(connectors: dict[str, Any], shape: tuple[int, ...]) -> str:
    user = connectors.get("user_connectors") or []
    lines = [f"connectors (RLlib env-to-module, in order): {', '.join(user) if user else 'none'}",
             f"  on the server: {', '.join(s['class'] for s in connectors.get('server', [])) or 'none'} -> {shape}",
             f"  in the graph:  {', '.join(s['class'] for s in connectors.get('graph', [])) or 'none'} -> "
             f"module input {tuple(connectors.get('module_obs_shape', ()))}"]
    if connectors.get("module_obs_space"):
        lines.append("  the module reads the observation's structure: the graph rebuilds it from the row")
    if connectors.get("observation_mask_key"):
        lines.append(f"  the module masks with the observation's {connectors['observation_mask_key']!r}: "
                     "so does the server")
    for stage in [*connectors.get("server", []), *connectors.get("graph", [])]:
        if stage["class"] == "MeanStdFilter":
            filt = stage["filter"]
            lines.append(f"  MeanStdFilter frozen: num_pushes={filt.get('num_pushes')} clip={filt.get('clip')}")
    return "\n".join(lines)


def _dist(data: dict[str, Any]) -> str:
    dist = data["action_dist"]
    lines = [f"action distribution: {dist.get('class')}  num_outputs={data['num_outputs']}"]
    kwargs = {k: v for k, v in (dist.get("kwargs") or {}).items() if k != "child_distributions"}
    if kwargs:
        lines.append(f"  kwargs: {_compact(kwargs)}")
    for i, child in enumerate((dist.get("kwargs") or {}).get("child_distributions", [])):
        lines.append(f"  child {i}: {child.get('class')} num_outputs={child.get('num_outputs')}")
    return "\n".join(lines)


def _config_diff(config: dict[str, Any], new_stack: bool = False) -> str:
    if new_stack:
        defaults, label = DEFAULT_MODEL_CONFIG, "DefaultModelConfig"
    else:
        defaults, label = MODEL_DEFAULTS, "MODEL_DEFAULTS"
    changed = {k: v for k, v in config.items() if defaults.get(k, object()) != v}
    if not changed:
        return f"model config: {label} (no changes)"
    lines = [f"model config (keys that differ from {label}):"]
    for key in sorted(changed):
        default = defaults.get(key, "<not a default key>")
        lines.append(f"  {key} = {_compact(changed[key])}   (default {_compact(default)})")
    return "\n".join(lines)


def _signature(sig: dict[str, Any], one_hot: bool = False) -> str:
    obs = tuple(sig["obs_shape"])
    prev = sig.get("prev", {})
    window = lambda n: f"{n}, " if prev.get("windowed") else ""  # noqa: E731
    shapes = {"obs": f"(B, {', '.join(map(str, obs))})"}
    for i, s in enumerate(sig.get("state", [])):
        dims = ", ".join(map(str, s["shape"]))
        shapes[f"state_in_{i}"] = (
            f"(B, {dims})  {s['name']}, {s.get('dtype', 'float32')}, initial {s.get('initial_value', 0.0)}"
        )
        shapes[f"state_out_{i}"] = f"(B, {dims})"
    shapes["prev_actions"] = f"(B, {window(prev.get('n_prev_actions'))}{prev.get('action_width')}) flattened actions"
    if one_hot:
        shapes["prev_actions"] = f"(B, {prev.get('n_prev_actions')}, {prev.get('action_width')}) one-hot actions"
    shapes["prev_rewards"] = f"(B, {prev.get('n_prev_rewards')})" if prev.get("windowed") else "(B,)"
    shapes["dist_inputs"] = f"(B, {sig['num_outputs']})"
    shapes["value"] = "(B,)"
    lines = ["model signature (B = batch, dynamic):", "  inputs:"]
    lines += [f"    {n:<13} {shapes.get(n, '')}" for n in sig["input_names"]]
    lines.append("  outputs:")
    lines += [f"    {n:<13} {shapes.get(n, '')}" for n in sig["output_names"]]
    kind = "recurrent/attention state per session" if sig.get("state") else "stateless"
    lines.append(
        f"  {kind}; prev actions: {prev.get('n_prev_actions', 0)}, prev rewards: {prev.get('n_prev_rewards', 0)}"
    )
    return "\n".join(lines)


def _runtimes(data: dict[str, Any]) -> str:
    lines = ["runtimes:"]
    for kind, info in data["runtimes"].items():
        details = ", ".join(f"{k}={v}" for k, v in info.items() if k != "file")
        lines.append(f"  {kind:<12} {info['file']:<14} {details}")
    producer = data.get("producer") or {}
    if producer:
        lines.append("exported with: " + ", ".join(f"{k} {v}" for k, v in producer.items()))
    return "\n".join(lines)


def _files(files: dict[str, dict[str, Any]]) -> str:
    lines = ["files:"]
    for name, entry in sorted(files.items()):
        lines.append(f"  {name:<14} {entry.get('bytes', '?'):>10} bytes  sha256 {entry.get('sha256')}")
    return "\n".join(lines)


def _reference(ref: dict[str, Any]) -> str:
    diffs = ", ".join(f"{k} {v:.2g}" for k, v in (ref.get("max_abs_diff") or {}).items())
    # max_rtol: the float32 rounding allowed relative to each output's largest value
    # (docs/export.md); without it (older bundles) the rule is atol + rtol*|eager|.
    scaled = "" if ref.get("max_rtol") is None else " + max_rtol*max|eager|"
    bounds = f"atol={ref.get('atol')} rtol={ref.get('rtol')}" + (
        "" if ref.get("max_rtol") is None else f" max_rtol={ref['max_rtol']:.3g}")
    return "\n".join([
        f"reference: {ref.get('file')} (batch {ref.get('batch_size')}), checked at export for batch sizes "
        f"{ref.get('checked_batch_sizes')}: passed",
        f"  tolerance: |runtime - eager| <= atol + rtol*|eager|{scaled}, with {bounds}",
        f"  largest difference seen (within that tolerance): {diffs or 'n/a'}",
    ])
