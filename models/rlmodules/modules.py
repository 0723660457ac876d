"""RLlib's default RLModules (torch), with RLlib's attribute names so its state dicts load as they are.

Every module here answers one step: ``forward(obs, states) -> (dist_inputs, value,
states_out)``, ``states`` being the flat list ``state_specs`` names (empty unless the
encoder is an LSTM). ``value`` is ``compute_values`` where the module has it (PPO) and NaN
rows where RLlib's module has no state-value function (DQN, SAC).

- ``ActorCriticModule`` (``DefaultPPOTorchRLModule``; APPO and IMPALA use it too): ``encoder``
  holds ``actor_encoder`` and ``critic_encoder`` (or one shared ``encoder`` with
  vf_share_layers), ``pi`` and ``vf`` heads of ``head_fcnet_*``. The state of separate LSTM
  encoders is ``actor/h, actor/c, critic/h, critic/c``.
- ``DQNModule`` (``DefaultDQNTorchRLModule``): ``encoder``, ``af`` and, dueling, ``vf``;
  ``Q = (A - mean(A)) + V`` (dueling) or ``A``. dist_inputs are the Q-values.
- ``SACPolicyModule`` (``DefaultSACTorchRLModule``): only what acting uses, ``pi_encoder``
  and ``pi`` (the Q-networks stay in the checkpoint).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from rlserve.models.rlmodules.encoders import CNNEncoder, LSTMEncoder, MLPEncoder, build_encoder
from rlserve.models.rlmodules.layers import FreeLogStdMLPHead, MLPHead

__all__ = ["ActorCriticModule", "DQNModule", "RLModuleNet", "SACPolicyModule"]

StateSpecs = tuple[tuple[str, tuple[int, ...]], ...]
Encoder = MLPEncoder | CNNEncoder | LSTMEncoder


class RLModuleNet(nn.Module):
    """What the modules below share: one step, and the names and shapes of their state."""

    state_specs: StateSpecs = ()


def _lstm_states(prefix: str, encoder: nn.Module) -> StateSpecs:
    if not isinstance(encoder, LSTMEncoder):
        return ()
    return ((f"{prefix}h", (1, encoder.hidden)), (f"{prefix}c", (1, encoder.hidden)))


def _run(encoder: nn.Module, obs: torch.Tensor,
         states: Sequence[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:
    if isinstance(encoder, LSTMEncoder):
        out, h, c = encoder(obs, states[0], states[1])
        return out, [h, c]
    return encoder(obs), []


def _head(latent: int, config: Mapping[str, Any], output_dim: int, *, clip_log_std: bool = False,
          layernorm: bool | None = None) -> nn.Module:
    cls = FreeLogStdMLPHead if config.get("free_log_std") else MLPHead
    return cls(latent, config["head_fcnet_hiddens"], config["head_fcnet_activation"],
               bool(config["head_fcnet_use_layernorm"]) if layernorm is None else layernorm, output_dim,
               clip_log_std=clip_log_std or cls is FreeLogStdMLPHead,
               log_std_clip_param=float(config.get("log_std_clip_param", 20.0)))


class _ActorCriticEncoder(nn.Module):
    def __init__(self, obs_shape: Sequence[int], config: Mapping[str, Any]):
        super().__init__()
        self.shared = bool(config["vf_share_layers"])
        if self.shared:
            encoder: Encoder = build_encoder(obs_shape, config)
            self.encoder = encoder
            self.state_specs = _lstm_states("", encoder)
        else:
            actor: Encoder = build_encoder(obs_shape, config)
            critic: Encoder = build_encoder(obs_shape, config)
            self.actor_encoder, self.critic_encoder = actor, critic
            self.state_specs = _lstm_states("actor/", actor) + _lstm_states("critic/", critic)
            encoder = actor
        self.latent = int(encoder.output_dim)


class ActorCriticModule(RLModuleNet):
    def __init__(self, obs_shape: Sequence[int], config: Mapping[str, Any], num_outputs: int,
                 diag_gaussian: bool):
        super().__init__()
        self.encoder = _ActorCriticEncoder(obs_shape, config)
        latent = self.encoder.latent
        self.pi = _head(latent, config, num_outputs, clip_log_std=diag_gaussian)
        self.vf = MLPHead(latent, config["head_fcnet_hiddens"], config["head_fcnet_activation"],
                          bool(config["head_fcnet_use_layernorm"]), 1)
        self.state_specs = self.encoder.state_specs

    def forward(self, obs: torch.Tensor, states: Sequence[torch.Tensor]):
        enc = self.encoder
        if enc.shared:
            latent, out = _run(enc.encoder, obs, states)
            return self.pi(latent), self.vf(latent).squeeze(-1), out
        half = len(states) // 2
        actor, actor_out = _run(enc.actor_encoder, obs, states[:half])
        critic, critic_out = _run(enc.critic_encoder, obs, states[half:])
        return self.pi(actor), self.vf(critic).squeeze(-1), actor_out + critic_out


def _no_value(x: torch.Tensor) -> torch.Tensor:
    """NaN per row: the module has no state-value function (the answer's value is null)."""
    return torch.full_like(x[:, 0], float("nan"))


class DQNModule(RLModuleNet):
    def __init__(self, obs_shape: Sequence[int], config: Mapping[str, Any], n_actions: int):
        super().__init__()
        if int(config.get("num_atoms", 1)) != 1:
            raise ValueError(f"num_atoms={config.get('num_atoms')}: distributional Q-heads are not served "
                             "(their answer is a return distribution per action)")
        encoder: Encoder = build_encoder(obs_shape, config)
        self.encoder = encoder
        self.dueling = bool(config.get("dueling", True))
        latent = int(encoder.output_dim)
        # DQNCatalog._get_head_config never passes head_fcnet_use_layernorm.
        self.af = _head(latent, {**config, "free_log_std": False}, n_actions, layernorm=False)
        if self.dueling:
            self.vf = _head(latent, {**config, "free_log_std": False}, 1, layernorm=False)
        self.state_specs = _lstm_states("", encoder)

    def forward(self, obs: torch.Tensor, states: Sequence[torch.Tensor]):
        latent, out = _run(self.encoder, obs, states)
        advantages = self.af(latent)
        if self.dueling:
            q = (advantages - advantages.mean(dim=-1, keepdim=True)) + self.vf(latent)
        else:
            q = advantages
        return q, _no_value(q), out


class SACPolicyModule(RLModuleNet):
    def __init__(self, obs_shape: Sequence[int], config: Mapping[str, Any], num_outputs: int):
        super().__init__()
        encoder: Encoder = build_encoder(obs_shape, config)
        self.pi_encoder = encoder
        # SACCatalog builds the pi head without head_fcnet_use_layernorm.
        self.pi = _head(int(encoder.output_dim), config, num_outputs, layernorm=False)
        self.state_specs = _lstm_states("", encoder)

    def forward(self, obs: torch.Tensor, states: Sequence[torch.Tensor]):
        latent, out = _run(self.pi_encoder, obs, states)
        dist_inputs = self.pi(latent)
        return dist_inputs, _no_value(dist_inputs), out
