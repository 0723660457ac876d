"""Training-side torch modules whose ``state_dict()`` keys and math equal RLlib's catalog.

The trained weights are later loaded into ``rlserve.models.catalog.build_model`` (and into RLlib
itself), so parameter names, shapes and the forward pass must match RLlib's old-stack
``FullyConnectedNetwork`` and its ``LSTMWrapper`` exactly; only the initialisation is ours.
"""

from __future__ import annotations

import torch
from torch import nn

_ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU, "swish": nn.SiLU, "silu": nn.SiLU}


class SlimFC(nn.Module):
    """Linear (+ activation) under ``_model`` so keys read ``<name>._model.0.weight``."""

    def __init__(self, d_in: int, d_out: int, activation: str | None = None, std: float = 1.0):
        super().__init__()
        layers: list[nn.Module] = [nn.Linear(d_in, d_out)]
        if activation:
            layers.append(_ACTIVATIONS[activation]())
        self._model = nn.Sequential(*layers)
        _normc_(layers[0], std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._model(x)


def _normc_(linear: nn.Linear, std: float) -> None:
    # Rows of N(0,1) rescaled to L2 norm ``std``: small heads keep the first policy near uniform.
    with torch.no_grad():
        w = torch.randn_like(linear.weight)
        linear.weight.copy_(w * std / w.norm(dim=1, keepdim=True))
        linear.bias.zero_()


class FCPolicy(nn.Module):
    """RLlib FCNet, ``vf_share_layers=True``: hidden tanh stack, logits and value heads.

    forward(obs (B, D)) -> (logits (B, A), value (B,)).
    """

    def __init__(self, obs_dim: int, n_actions: int | None, hiddens: list[int], activation: str):
        super().__init__()
        layers, d = [], obs_dim
        for h in hiddens:
            layers.append(SlimFC(d, h, activation))
            d = h
        self._hidden_layers = nn.Sequential(*layers)
        self.features_dim = d
        if n_actions is not None:
            self._logits = SlimFC(d, n_actions, std=0.01)
        # RLlib builds this head even when the model is wrapped (num_outputs=None); the
        # LSTM wrapper then replaces it under the same name with one reading the LSTM output.
        self._value_branch = SlimFC(d, 1, std=0.01)

    def features(self, obs: torch.Tensor) -> torch.Tensor:
        return self._hidden_layers(obs)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        feats = self.features(obs)
        return self._logits(feats), self._value_branch(feats).squeeze(-1)

    def initial_state(self, batch: int) -> tuple[torch.Tensor, ...]:
        return ()

    def sequence(
        self, obs: torch.Tensor, state: tuple[torch.Tensor, ...], starts: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, ...]]:
        """The recurrent training interface for a memoryless model: obs (B, T, D)."""
        logits, value = self.forward(obs)
        return logits, value, ()


class LSTMPolicy(FCPolicy):
    """RLlib ``FullyConnectedNetwork_as_LSTMWrapper`` without prev action/reward inputs.

    RLlib's wrapper subclasses the wrapped model, so the FCNet hidden layers sit at the top
    level and ``_value_branch`` (cell -> 1) overrides the FCNet's head of the same name.
    """

    def __init__(self, obs_dim: int, n_actions: int, hiddens: list[int], activation: str, cell: int):
        super().__init__(obs_dim, None, hiddens, activation)
        self.cell_size = cell
        self.lstm = nn.LSTM(self.features_dim, cell, batch_first=True)
        self._logits_branch = SlimFC(cell, n_actions, std=0.01)
        self._value_branch = SlimFC(cell, 1, std=0.01)

    def initial_state(self, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        zeros = torch.zeros(batch, self.cell_size)
        return zeros, zeros.clone()

    def forward(  # type: ignore[override]
        self, obs: torch.Tensor, h: torch.Tensor, c: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The catalog calling convention: obs (B, D), h/c (B, cell) -> logits, value, h, c."""
        logits, value, (h, c) = self.sequence(obs.unsqueeze(1), (h, c), None)
        return logits[:, 0], value[:, 0], h, c

    def sequence(
        self,
        obs: torch.Tensor,
        state: tuple[torch.Tensor, torch.Tensor],
        starts: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """obs (B, T, D), state (B, cell) x2, starts (B, T) 1.0 where an episode begins.

        The state is zeroed at every episode start inside the window (the server does the
        same by feeding initial state rows), so windows may span episode boundaries.
        Returns logits (B, T, A), value (B, T) and the state after the last step.
        """
        feats = self.features(obs)
        h, c = state
        if starts is None:
            out, (h1, c1) = self.lstm(feats, (h.unsqueeze(0), c.unsqueeze(0)))
            h, c = h1[0], c1[0]
        else:
            outs = []
            for t in range(obs.shape[1]):
                keep = (1.0 - starts[:, t]).unsqueeze(-1)
                o, (h1, c1) = self.lstm(feats[:, t : t + 1], ((h * keep).unsqueeze(0), (c * keep).unsqueeze(0)))
                h, c = h1[0], c1[0]
                outs.append(o)
            out = torch.cat(outs, dim=1)
        return self._logits_branch(out), self._value_branch(out).squeeze(-1), (h, c)
