"""Small, seeded bundles for the service tests, built with the real catalog and exporter.

Tests may use torch to *build* bundles; serving them must not need it (see
``test_svc_torch_free.py``). Every builder returns the bundle directory; ``shared`` exports
each bundle once per test run, for every xdist worker.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import gymnasium.spaces as gs
import numpy as np

OBS = gs.Box(-1.0, 1.0, (4,), np.float32)

SPECS: dict[str, dict[str, Any]] = {
    # Feedforward, Discrete(3): both runtimes, so runtime choice can be tested.
    "mlp": {"obs": OBS, "act": gs.Discrete(3), "config": {"fcnet_hiddens": [16, 16]},
            "formats": ["onnx", "torchscript"]},
    # A separate value tower (RLlib's PPO setting): its pruned policy graph drops a whole MLP.
    "vf_tower": {"obs": OBS, "act": gs.Discrete(3),
                 "config": {"fcnet_hiddens": [16, 16], "vf_share_layers": False}},
    # LSTM reading the previous (Box) action and reward.
    "lstm": {"obs": OBS, "act": gs.Box(-1.0, 1.0, (2,), np.float32),
             "config": {"fcnet_hiddens": [16], "use_lstm": True, "lstm_cell_size": 8,
                        "lstm_use_prev_action": True, "lstm_use_prev_reward": True}},
    # GTrXL with a window of 2 previous (Discrete) actions and rewards.
    "gtrxl": {"obs": OBS, "act": gs.Discrete(3),
              "config": {"fcnet_hiddens": [16], "use_attention": True, "attention_dim": 8,
                         "attention_num_transformer_units": 1, "attention_num_heads": 2,
                         "attention_head_dim": 4, "attention_memory_inference": 3,
                         "attention_position_wise_mlp_dim": 8, "attention_use_n_prev_actions": 2,
                         "attention_use_n_prev_rewards": 2}},
    # Dict observation carrying an action mask (RLlib's convention), MultiDiscrete actions.
    "masked": {"obs": gs.Dict({"action_mask": gs.Box(0.0, 1.0, (5,), np.float32),
                               "observations": gs.Box(-1.0, 1.0, (3,), np.float32)}),
               "act": gs.MultiDiscrete([2, 3]), "config": {"fcnet_hiddens": [8]}},
    # A uint8 image (base64 transport) and a bounded float action (clip / unsquash).
    "image": {"obs": gs.Box(0, 255, (10, 10, 3), np.uint8), "act": gs.Box(-2.0, 3.0, (2,), np.float32),
              "config": {"conv_filters": [[4, [3, 3], 2], [8, [5, 5], 1]]}},
}


def build_model(name: str, seed: int = 0):
    import torch

    from rlserve.models.catalog import build_model as catalog_build

    spec = SPECS[name]
    torch.manual_seed(seed)
    return catalog_build(spec["obs"], spec["act"], spec["config"])


def export(name: str, out_dir: Path, version: str = "1", seed: int = 0) -> Path:
    import torch

    from rlserve.models.export.exporter import export_bundle

    torch.set_num_threads(1)
    spec = SPECS[name]
    model = build_model(name, seed)
    export_bundle(model, obs_space=spec["obs"], action_space=spec["act"], model_config=spec["config"],
                  out_dir=out_dir, name=name, version=version, formats=spec.get("formats", ["onnx"]))
    return out_dir


def shared(tmp_path_factory: Any, *names: str) -> Path:
    """A folder holding the bundles ``names`` (default: all of ``SPECS``), each exported once
    per test run for all its xdist workers (``run_cache``). Read only: copy a bundle to change it."""
    from run_cache import shared_folder

    for name in names or SPECS:
        folder = shared_folder(tmp_path_factory, f"svc-bundles/{name}", lambda out, name=name: export(name, out))
    return folder.parent


def copy_as_version(src: Path, dst: Path, version: str) -> Path:
    """The same bundle under another version (manifest re-hashed with the bundle writer)."""
    import shutil

    from rlserve.models.export.bundle import MANIFEST_NAME, write_manifest

    shutil.copytree(src, dst)
    data = json.loads((dst / MANIFEST_NAME).read_text())
    data["version"] = version
    write_manifest(dst, data, list(data["files"]))
    return dst


def obs_value(name: str, rng: np.random.Generator) -> Any:
    """A random JSON observation for bundle ``name``."""
    space = SPECS[name]["obs"]
    if name == "masked":
        return {"action_mask": [1, 1, 1, 1, 1], "observations": rng.uniform(-1, 1, 3).round(4).tolist()}
    if name == "image":
        return rng.integers(0, 256, space.shape).tolist()
    return rng.uniform(-1, 1, space.shape).round(4).tolist()
