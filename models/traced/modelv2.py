"""Export an old-stack policy whose ModelV2 class is the user's, by tracing it (torch, ray).

``rlserve export CHECKPOINT --trust-code`` on an old-API-stack checkpoint whose
``model.custom_model`` rlserve's own registry does not know. RLlib's ``Policy.from_checkpoint``
restores the policy (the class must be registered with ``ModelCatalog.register_custom_model``
in that process: ``--import MODULE`` imports the user's module that registers it, or the
config names the class itself), and ``ModelV2Policy`` puts its model behind the uniform
contract, one step per row as the sampler calls it:

    forward(obs, *state_in) -> (dist_inputs, value, *state_out)
        model({"obs": obs}, state_in, seq_lens=ones) ; model.value_function()

``obs`` is the preprocessed (flat) observation the bundle's server-side preprocessor makes,
the same rows RLlib's sampler feeds (``ModelV2.__call__`` restores a Dict or Tuple from it).
The action distribution is the one rlserve already serves for the policy's config (RLlib's
old-stack classes, ``describe_action_dist``); a ``custom_action_dist`` is refused, and so is
a model whose view requirements need more than the observation and its own state.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rlserve.models.checkpoint import PolicyCheckpoint
from rlserve.models.export.bundle import Bundle
from rlserve.models.export.describe import describe_action_dist, describe_preprocessor
from rlserve.models.export.exporter import export_bundle
from rlserve.models.export.reference import make_reference_inputs
from rlserve.models.interface import ModelSignature, StateSpec
from rlserve.models.traced.export import tracing
from rlserve.models.traced.loader import TraceError, import_user_modules, require_rllib
from rlserve.models.traced.sequence import check_sequence

__all__ = ["ModelV2Policy", "export_traced_policy"]

Progress = Callable[[str], None]
_ALLOWED_VIEWS = {"obs", "state_in", "seq_lens", "infos", "eps_id", "env_id", "agent_index", "t", "unroll_id",
                  "actions", "rewards", "terminateds", "truncateds", "new_obs", "action_dist_inputs",
                  "action_logp", "action_prob", "vf_preds", "values_bootstrapped", "advantages", "value_targets"}


class ModelV2Policy(nn.Module):
    def __init__(self, model: Any, obs_shape: Sequence[int], num_outputs: int, initial_state: list[torch.Tensor]):
        super().__init__()
        self.model = model
        self.obs_shape = tuple(int(d) for d in obs_shape)
        self.num_outputs = int(num_outputs)
        self._state_shapes = [tuple(int(d) for d in s.shape) for s in initial_state]
        self._fills = [float(s.reshape(-1)[0]) if s.numel() and bool(torch.all(s == s.reshape(-1)[0])) else None
                       for s in initial_state]
        if any(fill is None for fill in self._fills):
            raise TraceError("get_initial_state() is not one number everywhere in each tensor; a session starts "
                             "every state tensor from one value")

    def signature(self) -> ModelSignature:
        states = tuple(StateSpec(f"state_{i}", shape, initial_value=fill or 0.0)
                       for i, (shape, fill) in enumerate(zip(self._state_shapes, self._fills, strict=True)))
        return ModelSignature(obs_shape=self.obs_shape, num_outputs=self.num_outputs, state=states)

    def forward(self, obs: torch.Tensor, *state: torch.Tensor) -> tuple[torch.Tensor, ...]:
        seq_lens = torch.ones(obs.shape[0], dtype=torch.int32) if state else None
        dist_inputs, state_out = self.model({"obs": obs}, list(state), seq_lens)
        value = self.model.value_function().reshape(obs.shape[0])
        return (dist_inputs, value, *state_out)


def _restore(ckpt: PolicyCheckpoint, imports: Sequence[str]) -> Any:
    require_rllib(str(ckpt.model_config.get("custom_model")))
    import_user_modules(imports)
    from ray.rllib.policy.policy import Policy

    try:
        return Policy.from_checkpoint(str(ckpt.files.policy_state.parent))
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        hint = (" (is it registered? --import the module that calls ModelCatalog.register_custom_model)"
                if "custom" in first.lower() or isinstance(exc, KeyError | ValueError) else "")
        raise TraceError(f"RLlib could not restore the policy: {type(exc).__name__}: {first}{hint}") from None


def _check_views(model: Any, label: str) -> None:
    views = getattr(model, "view_requirements", {})
    needed = [name for name, view in views.items() if name not in _ALLOWED_VIEWS and not name.startswith("state_")
              and getattr(view, "used_for_compute_actions", True)]
    if needed:
        raise TraceError(f"{label} reads {sorted(needed)} beyond its observation and state; a traced ModelV2 is "
                         "served with the observation and its own state only")


def export_traced_policy(
    ckpt: PolicyCheckpoint, out_dir: str | Path, *, imports: Sequence[str] = (),
    formats: tuple[str, ...] = ("onnx", "torchscript"), name: str | None = None, version: str | None = None,
    progress: Progress | None = None, explore: bool | None = None, normalize_actions: bool | None = None,
    clip_actions: bool | None = None,
) -> Bundle:
    """Trace the policy's custom ModelV2 into a verified bundle at ``out_dir``."""
    say = progress or (lambda _msg: None)
    config = dict(ckpt.model_config)
    label = str(config.get("custom_model"))
    if config.get("custom_action_dist"):
        raise TraceError(f"custom_action_dist {config['custom_action_dist']!r}: a traced ModelV2 is served with "
                         "RLlib's built-in action distributions only")
    say(f"restoring the policy with RLlib (--trust-code: running the checkpoint's code for {label})")
    policy = _restore(ckpt, imports)
    model = policy.model
    _check_views(model, label)
    model.eval()
    preprocessor = describe_preprocessor(ckpt.observation_space, config)
    dist = describe_action_dist(ckpt.action_space, config)
    initial = [torch.as_tensor(s, dtype=torch.float32) for s in model.get_initial_state()]
    wrapped = ModelV2Policy(model, preprocessor["output_shape"], int(model.num_outputs), initial).eval()
    say("tracing the model into ONNX and TorchScript")
    source = {**ckpt.source_json(), "exported_by": "tracing", "model_class": type(model).__module__ + "."
              + type(model).__qualname__}
    with tracing(label):
        bundle = export_bundle(
            wrapped, obs_space=ckpt.observation_space, action_space=ckpt.action_space, model_config=config,
            out_dir=out_dir, formats=formats, filter_state=ckpt.filter_state, name=name or ckpt.policy_id or
            Path(out_dir).name, version=version, progress=say, explore=ckpt.explore if explore is None else explore,
            action_dist=dist, preprocessor=preprocessor,
            normalize_actions=ckpt.normalize_actions if normalize_actions is None else normalize_actions,
            clip_actions=ckpt.clip_actions if clip_actions is None else clip_actions, source=source,
        )
    if wrapped.signature().state:
        say("stepping the runtimes through a sequence with their state carried")
        def make_inputs(batch: int, seed: int) -> dict[str, Any]:
            return make_reference_inputs(wrapped.signature(), ckpt.observation_space, ckpt.action_space, config,
                                         ckpt.filter_state, batch, seed=seed)
        check_sequence(bundle, wrapped, make_inputs)
    return bundle
