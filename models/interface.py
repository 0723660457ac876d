"""The uniform policy-model contract that export and serving rely on (torch-free).

Every model the catalog builds (feedforward, LSTM-wrapped, attention-wrapped, custom) is
a ``torch.nn.Module`` whose ``forward`` takes positional tensors in the order of
``ModelSignature.input_names`` and returns a tuple in the order of ``output_names``:

    inputs : obs            (B, *obs_flat_shape) float32   the preprocessed, filtered obs
             state_in_<i>   (B, *state[i].shape)  float32   one per state tensor
             prev_actions   LSTM: (B, A) / attention: (B, n, A) float32, flattened raw
                            actions (Discrete = 1 column holding the index, MultiDiscrete =
                            k columns, Box = prod(shape) columns); the model one-hot encodes
                            in the graph.                    only if the model uses them
             prev_rewards   LSTM: (B,) / attention: (B, n) float32   only if used
    outputs: dist_inputs    (B, num_outputs) float32
             value          (B,) float32
             state_out_<i>  (B, *state[i].shape) float32    the state for the next step
             <extra>        (B, *extra.shape) float32        named extra outputs of a model
                            with an action head (``OutputSpec``): ``model_out`` (RLlib's
                            model output, before the head) and what the head declares,
                            e.g. a Q-model's ``advantages``/``state_value``

The model exposes ``signature() -> ModelSignature``. The server keeps ``state_out`` per
session and feeds it back as ``state_in``; an episode start feeds ``initial_value`` rows.
For attention, ``state_in`` is the (B, M, D) memory and the *model* returns the rolled
memory (B, M, D) so the server never manipulates tensors per model kind.

This module must not import torch: manifests and the server read it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class StateSpec:
    """One recurrent/attention state tensor kept per session (per row, without batch)."""

    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"
    initial_value: float = 0.0


@dataclass(frozen=True)
class OutputSpec:
    """An extra named graph output (per row, without batch); the server ignores it unless asked."""

    name: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class PrevSpec:
    """How many previous actions/rewards the model reads, and the flat action width."""

    n_prev_actions: int = 0  # 0: not used; LSTM uses 1 with a (B, A) input
    n_prev_rewards: int = 0
    action_width: int = 0  # A: columns of one flattened action
    # LSTM feeds a single step (B, A)/(B,); attention a window (B, n, A)/(B, n).
    windowed: bool = False


@dataclass(frozen=True)
class ModelSignature:
    obs_shape: tuple[int, ...]
    num_outputs: int
    state: tuple[StateSpec, ...] = ()
    prev: PrevSpec = field(default_factory=PrevSpec)
    # Trajectory views the model reads, RLlib's view requirements by name, e.g.
    # {"prev_n_obs": {"data_col": "obs", "shift": "-2:0"}}. How they reach the graph is
    # the state and prev layout above; this documents it in the manifest.
    views: dict[str, dict[str, Any]] = field(default_factory=dict)
    extras: tuple[OutputSpec, ...] = ()

    @property
    def is_recurrent(self) -> bool:
        return bool(self.state)

    @property
    def uses_prev_actions(self) -> bool:
        return self.prev.n_prev_actions > 0

    @property
    def uses_prev_rewards(self) -> bool:
        return self.prev.n_prev_rewards > 0

    @property
    def input_names(self) -> list[str]:
        names = ["obs"] + [f"state_in_{i}" for i in range(len(self.state))]
        if self.uses_prev_actions:
            names.append("prev_actions")
        if self.uses_prev_rewards:
            names.append("prev_rewards")
        return names

    @property
    def output_names(self) -> list[str]:
        states = [f"state_out_{i}" for i in range(len(self.state))]
        return ["dist_inputs", "value", *states, *(e.name for e in self.extras)]

    @property
    def policy_output_names(self) -> list[str]:
        """The outputs acting needs: ``output_names`` without the value head (what a
        bundle's pruned policy graph computes)."""
        return [name for name in self.output_names if name != "value"]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ModelSignature:
        return cls(
            obs_shape=tuple(data["obs_shape"]),
            num_outputs=int(data["num_outputs"]),
            state=tuple(
                StateSpec(s["name"], tuple(s["shape"]), s.get("dtype", "float32"), s.get("initial_value", 0.0))
                for s in data.get("state", ())
            ),
            prev=PrevSpec(**data.get("prev", {})),
            views={str(k): dict(v) for k, v in data.get("views", {}).items()},
            extras=tuple(OutputSpec(e["name"], tuple(e["shape"])) for e in data.get("extras", ())),
        )
