"""GTrXL building blocks with RLlib 2.60's exact maths and parameter names.

The attribute names (``_qkv_layer``, ``_fan_in_layer._w_r``, ``_model.0.weight``, ...) are
RLlib's so a state_dict exported by RLlib loads without renaming. Shapes use B = batch,
T = new time steps, Tau = memory length, D = attention dim, H = heads, d = head dim.
"""

from __future__ import annotations

import torch
from torch import nn

from rlserve.models.networks.common import SlimFC


def sinusoid_inverse_freq(dim: int) -> torch.Tensor:
    """``1 / 10000^(arange(0, dim, 2) / dim)`` in float32, as RLlib computes it."""
    return 1.0 / (10000.0 ** (torch.arange(0, dim, 2.0) / dim))


class RelativePositionEmbedding(nn.Module):
    """Sinusoid encoding of relative positions ``n-1 .. 0`` as ``[sin | cos]`` (concatenated)."""

    inverse_freq: torch.Tensor  # a registered buffer; declared so type checkers know it

    def __init__(self, dim: int) -> None:
        super().__init__()
        # A buffer (not a parameter) so RLlib's stored copy loads into it; ours is identical.
        self.register_buffer("inverse_freq", sinusoid_inverse_freq(dim))

    def forward(self, length: int) -> torch.Tensor:
        """-> ``(length, dim)``; row 0 encodes the farthest position."""
        positions = torch.arange(
            length - 1, -1, -1.0, dtype=self.inverse_freq.dtype, device=self.inverse_freq.device
        )
        angles = positions[:, None] * self.inverse_freq[None, :]
        return torch.cat([torch.sin(angles), torch.cos(angles)], dim=-1)


def rel_shift(x: torch.Tensor) -> torch.Tensor:
    """Transformer-XL's relative shift on ``(B, T, Tau+T, H)`` scores (pad, fold, drop a row).

    Written with static pad/reshape/slice so it traces and exports; for T = 1 it is the identity.
    """
    b, t, k, h = x.shape
    padded = nn.functional.pad(x, (0, 0, 1, 0))  # one zero column in front of the key axis
    folded = padded.reshape(b, k + 1, t, h)[:, 1:]
    return folded.reshape(b, t, k, h)


def causal_mask(t: int, tau: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """``(1, T, Tau+T, 1)``: query i may see keys ``j <= Tau + i`` (all memory, never the future)."""
    keys = torch.arange(tau + t, device=device)
    limits = torch.arange(tau + 1, tau + t + 1, device=device)
    return (keys[None, :] < limits[:, None]).to(dtype)[None, :, :, None]


class RelativeMultiHeadAttention(nn.Module):
    """Transformer-XL multi-head attention over ``cat(memory, x)`` with relative positions.

    RLlib's GTrXL quirks kept: the LayerNorm normalises the memory rows too, the memory is
    never masked (zeros before an episode starts are attended to), the output projection has
    no bias but a ReLU, and masking is ``score*mask + 1e30*(mask-1)`` rather than ``-inf``.
    """

    def __init__(self, dim: int, num_heads: int, head_dim: int) -> None:
        super().__init__()
        self._num_heads = num_heads
        self._head_dim = head_dim
        inner = num_heads * head_dim
        self._qkv_layer = SlimFC(dim, 3 * inner, use_bias=False)
        self._linear_layer = SlimFC(inner, dim, use_bias=False, activation="relu")
        self._uvar = nn.Parameter(nn.init.xavier_uniform_(torch.empty(num_heads, head_dim)))
        self._vvar = nn.Parameter(nn.init.xavier_uniform_(torch.empty(num_heads, head_dim)))
        self._pos_proj = SlimFC(dim, inner, use_bias=False)
        self._rel_pos_embedding = RelativePositionEmbedding(dim)
        self._input_layernorm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
        """x ``(B, T, D)``, memory ``(B, Tau, D)`` oldest first -> ``(B, T, D)``."""
        b, t, _ = x.shape
        tau = memory.shape[1]
        h, d = self._num_heads, self._head_dim
        seq = self._input_layernorm(torch.cat([memory, x], dim=1))
        queries, keys, values = torch.chunk(self._qkv_layer(seq), 3, dim=-1)
        queries = queries[:, -t:].reshape(b, t, h, d)
        keys = keys.reshape(b, tau + t, h, d)
        values = values.reshape(b, tau + t, h, d)
        rel = self._pos_proj(self._rel_pos_embedding(tau + t)).reshape(tau + t, h, d)

        content = torch.einsum("bihd,bjhd->bijh", queries + self._uvar, keys)
        position = torch.einsum("bihd,jhd->bijh", queries + self._vvar, rel)
        score = (content + rel_shift(position)) / d**0.5
        mask = causal_mask(t, tau, score.device, score.dtype)
        weights = torch.softmax(score * mask + 1e30 * (mask - 1.0), dim=2)
        out = torch.einsum("bijh,bjhd->bihd", weights, values).reshape(b, t, h * d)
        return self._linear_layer(out)


class GRUGate(nn.Module):
    """GTrXL's gating layer: ``h`` is the skip input, ``x`` the sublayer output.

    RLlib applies the weights as ``x @ W`` (not ``W^T`` like nn.Linear) and *subtracts*
    ``_bias_z`` (init 2.0) so the gate starts close to the identity.
    """

    # Set with setattr in __init__; declared so type checkers know them.
    _w_r: nn.Parameter
    _w_z: nn.Parameter
    _w_h: nn.Parameter
    _u_r: nn.Parameter
    _u_z: nn.Parameter
    _u_h: nn.Parameter

    def __init__(self, dim: int, init_bias: float = 0.0) -> None:
        super().__init__()
        for name in ("_w_r", "_w_z", "_w_h", "_u_r", "_u_z", "_u_h"):
            setattr(self, name, nn.Parameter(nn.init.xavier_uniform_(torch.empty(dim, dim))))
        self._bias_z = nn.Parameter(torch.full((dim,), float(init_bias)))

    def forward(self, h: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        r = torch.sigmoid(x @ self._w_r + h @ self._u_r)
        z = torch.sigmoid(x @ self._w_z + h @ self._u_z - self._bias_z)
        candidate = torch.tanh(x @ self._w_h + (h * r) @ self._u_h)
        return (1.0 - z) * h + z * candidate


class PositionwiseMLP(nn.Sequential):
    """LayerNorm -> Linear(no bias)+ReLU -> Linear(no bias)+ReLU (the second ReLU is RLlib's)."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__(
            nn.LayerNorm(dim),
            SlimFC(dim, hidden, use_bias=False, activation="relu"),
            SlimFC(hidden, dim, use_bias=False, activation="relu"),
        )


class GatedAttentionSkip(nn.Module):
    """``GRU(x, MHA(x, memory))``; keys ``_layer`` / ``_fan_in_layer`` as in RLlib."""

    def __init__(self, dim: int, num_heads: int, head_dim: int, gate_bias: float) -> None:
        super().__init__()
        self._layer = RelativeMultiHeadAttention(dim, num_heads, head_dim)
        self._fan_in_layer = GRUGate(dim, gate_bias)

    def forward(self, x: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
        return self._fan_in_layer(x, self._layer(x, memory))


class GatedMLPSkip(nn.Module):
    """``GRU(x, MLP(x))``; keys ``_layer.{0,1,2}`` / ``_fan_in_layer`` as in RLlib."""

    def __init__(self, dim: int, hidden: int, gate_bias: float) -> None:
        super().__init__()
        self._layer = PositionwiseMLP(dim, hidden)
        self._fan_in_layer = GRUGate(dim, gate_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._fan_in_layer(x, self._layer(x))
