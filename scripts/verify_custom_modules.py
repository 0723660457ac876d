"""Check recorded custom-module cases in a fresh process: each module restored alone with
``RLModule.from_checkpoint`` (no Algorithm, no EnvRunner) must give, from the recorded module
inputs (``reference.npz: fixed/connector_out``), exactly the recorded ``action_dist_inputs``
(and ``state_out_full_module`` / the module's own ``actions`` where recorded), and for
stateful modules replay the recorded episode's dist inputs from ``episode_states.npz``.

    /tmp/rayenv/bin/python scripts/verify_custom_modules.py tests/fixtures/custom-modules

Needs ray and torch; prints one line per case and exits 1 on any difference.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np


def _tree(arrays: dict[str, np.ndarray], prefix: str) -> Any:
    """The npz keys under ``prefix`` as a nested dict (or the array itself)."""
    if prefix in arrays:
        return arrays[prefix]
    out: dict[str, Any] = {}
    for key, value in arrays.items():
        if key.startswith(prefix + "/"):
            node = out
            *parents, leaf = key[len(prefix) + 1:].split("/")
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = value
    return out


def _row(value: Any, i: int) -> Any:
    import torch

    if isinstance(value, dict):
        return {k: _row(v, i) for k, v in value.items()}
    return torch.as_tensor(value[i])


def _np(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _np(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_np(v) for v in value]
    return value.detach().numpy()


def _diff(a: Any, b: Any) -> float:
    if isinstance(a, dict):
        return max((_diff(a[k], b[k]) for k in a), default=0.0)
    if isinstance(a, list | tuple):
        return max((_diff(x, y) for x, y in zip(a, b, strict=True)), default=0.0)
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a.reshape(b.shape) - b))) if b.size else 0.0


def verify(case: Path) -> dict[str, float]:
    import torch
    from ray.rllib.core.rl_module.rl_module import RLModule

    reference = json.loads((case / "reference.json").read_text())
    with np.load(case / "reference.npz") as z:
        arrays = {k: z[k] for k in z.files}
    rl_dir = case / "checkpoint" / "learner_group" / "learner" / "rl_module"
    diffs: dict[str, float] = {}
    if reference["multi_agent"]:
        module = RLModule.from_checkpoint(str(rl_dir.resolve()))
        agents = [k for k in reference["fixed"] if k.startswith("agent_")]
        inputs = {a: _tree(arrays, f"fixed/{a}/connector_out") for a in agents}
        worst = 0.0
        for i in range(len(reference["fixed"]["obs"])):
            batch = {reference["fixed"][a]["module_id"]: _row(inputs[a], i) for a in agents}
            with torch.no_grad():
                out = module.forward_inference(batch)
            for a in agents:
                mid = reference["fixed"][a]["module_id"]
                recorded = arrays[f"fixed/{a}/action_dist_inputs"][i]
                worst = max(worst, _diff(_np(out[mid]["action_dist_inputs"])[0], recorded))
        diffs["fixed.action_dist_inputs"] = worst
        return diffs
    module = RLModule.from_checkpoint(str((rl_dir / "default_policy").resolve()))
    module.eval()
    inputs = _tree(arrays, "fixed/connector_out")
    full_state = _tree(arrays, "fixed/state_out_full_module")
    worst = {"fixed.action_dist_inputs": 0.0}
    for i in range(len(arrays["fixed/action_dist_inputs"])):
        with torch.no_grad():
            out = _np(module.forward_inference(_row(inputs, i)))
        recorded = arrays["fixed/action_dist_inputs"][i]
        worst["fixed.action_dist_inputs"] = max(worst["fixed.action_dist_inputs"],
                                                _diff(out["action_dist_inputs"][0], recorded))
        if full_state:
            worst["fixed.state_out_full_module"] = max(worst.get("fixed.state_out_full_module", 0.0), _diff(
                {k: v[0] for k, v in out["state_out"].items()}, {k: v[i] for k, v in full_state.items()}))
        if "actions" in out:  # a module that samples its own actions (autoregressive)
            action = _tree(arrays, "fixed/action")
            recorded = [action[k][i] for k in sorted(action, key=int)] if isinstance(action, dict) else action[i]
            mine = [a[0] for a in out["actions"]] if isinstance(out["actions"], list) else out["actions"][0]
            worst["fixed.action"] = max(worst.get("fixed.action", 0.0), _diff(mine, recorded))
    diffs.update(worst)
    if (case / "episode_states.npz").is_file():
        with np.load(case / "episode_states.npz") as z:
            states = {k: z[k] for k in z.files}
        state = {k: torch.as_tensor(v[:1]) for k, v in _tree(states, "full_module_state_in").items()}
        worst_ep = 0.0
        for t in range(len(states["obs"])):
            with torch.no_grad():
                out = module.forward_inference({"obs": torch.as_tensor(states["connector_out"][t]), "state_in": state})
            worst_ep = max(worst_ep, _diff(_np(out["action_dist_inputs"]).reshape(-1), states["action_dist_inputs"][t]))
            state = out["state_out"]
        diffs["episode.action_dist_inputs (full module replay)"] = worst_ep
    return diffs


def main() -> int:
    root = Path(sys.argv[1])
    cases = [p for p in sorted(root.iterdir()) if (p / "reference.json").is_file()] if len(sys.argv) < 3 else [
        root / name for name in sys.argv[2:]]
    bad = 0
    for case in cases:
        diffs = verify(case)
        bad += any(v != 0.0 for v in diffs.values())
        print(f"{case.name}: " + ", ".join(f"{k} maxdiff {v}" for k, v in diffs.items()), flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
