"""Export one RLModule of a new-stack checkpoint to a verified bundle (needs torch).

    ModuleCheckpoint ─► connector layout (server stages | graph stages, plan.py)
                     ─► action distribution (newstack/dists.py)
                     ─► RLModulePolicy (rlmodules/) with RLlib's weights
                     ─► export_bundle: ONNX + TorchScript, verified against eager torch

The bundle takes the environment's raw observations (the env-to-module pipeline's input
space) and its actions (unsquashed or clipped for the environment as the module-to-env
pipeline's ``NormalizeAndClipActions`` says). Reference inputs are real observations of the
environment's space run through the server stages, random state, and one-hot previous
actions, so the graph is checked on what it will see.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from gymnasium import spaces as gs

from rlserve.models.connectors import ConnectorPipeline, ConnectorPlanError, plan_connectors
from rlserve.models.export.bundle import Bundle
from rlserve.models.newstack import ModuleCheckpoint
from rlserve.models.newstack.dists import module_action_dist

__all__ = ["RLModuleExportError", "connector_preprocessor", "env_spaces", "export_rlmodule", "input_maker"]

Progress = Callable[[str], None]


class RLModuleExportError(ValueError):
    """The module or its connectors cannot be served as a bundle (the message says why)."""


def env_spaces(ckpt: ModuleCheckpoint) -> tuple[gs.Space, gs.Space]:
    plan = ckpt.connectors
    obs = plan.env_observation_space if plan.env_observation_space is not None else ckpt.observation_space
    act = plan.env_action_space if plan.env_action_space is not None else ckpt.action_space
    return obs, act


def connector_preprocessor(layout: Any) -> dict[str, Any]:
    """The manifest's ``preprocessor``: the server stages' output (the model's obs input)."""
    return {"class": "RLlibConnectors", "output_shape": list(layout.obs_shape), "output_dtype": "float32",
            "size": int(np.prod(layout.obs_shape)), "options": {}, "layout": [],
            "stages": [s["class"] for s in layout.server]}


def input_maker(signature: Any, obs_space: gs.Space, connectors: dict[str, Any]) -> Callable[[int, int], dict]:
    pipeline = ConnectorPipeline.from_json(connectors, obs_space)

    def make(batch: int, seed: int) -> dict[str, np.ndarray]:
        space = obs_space
        space.seed(seed)
        rng = np.random.default_rng(seed)
        inputs = {"obs": pipeline.transform_batch([space.sample() for _ in range(batch)]).astype(np.float32)}
        for i, spec in enumerate(signature.state):
            inputs[f"state_in_{i}"] = (0.5 * rng.standard_normal((batch, *spec.shape))).astype(np.float32)
        prev = signature.prev
        if prev.n_prev_actions:
            picks = rng.integers(0, prev.action_width, (batch, prev.n_prev_actions))
            inputs["prev_actions"] = np.eye(prev.action_width, dtype=np.float32)[picks]
        if prev.n_prev_rewards:
            inputs["prev_rewards"] = rng.standard_normal((batch, prev.n_prev_rewards)).astype(np.float32)
        return inputs

    return make


def export_rlmodule(
    ckpt: ModuleCheckpoint, out_dir: str | Path, *, formats: tuple[str, ...] = ("onnx", "torchscript"),
    name: str | None = None, version: str | None = None, progress: Progress | None = None,
    explore: bool | None = None, normalize_actions: bool | None = None, clip_actions: bool | None = None,
) -> Bundle:
    """Export ``ckpt`` to ``out_dir``. Raises ``RLModuleExportError`` for what a bundle cannot
    reproduce, ``RLModuleWeightError`` when the weights do not fit, ``BundleError`` when a
    runtime disagrees with eager torch."""
    import copy

    from rlserve.models.export.exporter import export_bundle
    from rlserve.models.rlmodules.catalog import build_rlmodule_policy, load_rlmodule_weights

    say = progress or (lambda _msg: None)
    obs_space, action_space = env_spaces(ckpt)
    try:
        layout = plan_connectors([(s.name, s.params) for s in ckpt.connectors.env_to_module], obs_space,
                                 action_space, ckpt.observation_space)
        dist = module_action_dist(ckpt.kind, ckpt.action_space, ckpt.model_config, ckpt.env_steps_sampled)
        say(f"building {ckpt.module_class.rpartition('.')[2]} ({ckpt.kind}) for module {ckpt.module_id!r}")
        connectors = {**layout.to_json(), "normalize_actions": ckpt.normalize_actions,
                      "clip_actions": ckpt.clip_actions}
        model = build_rlmodule_policy(ckpt.kind, tuple(ckpt.observation_space.shape or ()), ckpt.model_config, dist,
                                      connectors, layout.prev["action_width"])
    except (ConnectorPlanError, ValueError) as exc:
        raise RLModuleExportError(f"module {ckpt.module_id!r} ({ckpt.module_class}): {exc}") from None
    load_rlmodule_weights(model, ckpt.weights, ckpt.kind)
    model.eval()
    return export_bundle(
        model, obs_space=obs_space, action_space=action_space, model_config=ckpt.model_config, out_dir=out_dir,
        formats=formats, name=name or ckpt.module_id, version=version, progress=say,
        explore=ckpt.explore if explore is None else explore, action_dist=dist.to_json(),
        preprocessor=connector_preprocessor(layout),
        normalize_actions=ckpt.normalize_actions if normalize_actions is None else normalize_actions,
        clip_actions=ckpt.clip_actions if clip_actions is None else clip_actions,
        source=ckpt.source_json(), connectors=connectors,
        make_inputs=input_maker(model.signature(), copy.deepcopy(obs_space), connectors),
    )
