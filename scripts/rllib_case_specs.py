"""The cases record_rllib_cases.py records: one ``Spec`` per case (RLlib example model,
spaces, config, batch, steps, seed, warm-up batches), the list of them, and the observation
fix-up and note the cases use. Imported by record_rllib_cases.py (ray's environment).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class Spec:
    name: str
    kind: str
    module: str  # example module under record_rllib_cases.EXAMPLES
    cls: str
    registered_as: str
    obs_space: Any
    action_space: Any
    custom_model_config: dict[str, Any] = field(default_factory=dict)
    model_overrides: dict[str, Any] = field(default_factory=dict)
    batch: int = 4
    steps: int = 5
    seed: int = 0
    # Training-mode forward passes (``is_training=True``) over random batches of this many rows
    # each, run after the perturbation and before the weights are saved: they move batch-norm
    # running statistics away from their (0, 1) start.
    warmup_batches: tuple[int, ...] = ()
    # Makes the sampled observations meaningful (e.g. a 0/1 action mask); (obs, rng, row) -> obs.
    fix_obs: Callable[[Any, Any, int], Any] | None = None
    description: str = ""
    notes: list[str] = field(default_factory=list)


def _specs() -> list[Spec]:
    from gymnasium import spaces as gs

    box = lambda n: gs.Box(-1.0, 1.0, (n,), np.float32)  # noqa: E731
    return [
        Spec(
            "custom_rnn_small", "custom_recurrent", "rnn_model", "TorchRNNModel", "rnn",
            box(4), gs.Discrete(3), {"fc_size": 16, "lstm_state_size": 8}, batch=3, steps=6, seed=101,
            description="RLlib's TorchRNNModel (fc -> LSTM -> action/value heads) on a Box(4) obs",
        ),
        Spec(
            "custom_rnn_box_action", "custom_recurrent", "rnn_model", "TorchRNNModel", "rnn",
            box(6), gs.Box(-2.0, 2.0, (2,), np.float32), {"fc_size": 12, "lstm_state_size": 5},
            batch=4, steps=5, seed=102,
            description="RLlib's TorchRNNModel with other sizes and a DiagGaussian action",
        ),
        Spec(
            "frame_stack_3", "trajectory_view", "trajectory_view_utilizing_models",
            "TorchFrameStackingCartPoleModel", "frame_stack_model", box(4), gs.Discrete(2), {"num_frames": 3},
            batch=3, steps=6, seed=201,
            description="RLlib's TorchFrameStackingCartPoleModel: last 3 obs, previous 3 actions and rewards",
        ),
        Spec(
            "frame_stack_2_wide", "trajectory_view", "trajectory_view_utilizing_models",
            "TorchFrameStackingCartPoleModel", "frame_stack_model", box(3), gs.Discrete(4), {"num_frames": 2},
            batch=2, steps=5, seed=202,
            description="RLlib's TorchFrameStackingCartPoleModel with 2 frames and 4 actions",
        ),
        Spec(
            "batch_norm_small", "batch_norm", "batch_norm_model", "TorchBatchNormModel", "bn_model",
            box(4), gs.Discrete(3), batch=5, seed=301, warmup_batches=(16, 16, 8, 32),
            description="RLlib's TorchBatchNormModel (2x [fc 256 relu, BatchNorm1d]) in inference mode after "
            "four training-mode batches",
            notes=[_WARMUP_NOTE],
        ),
        Spec(
            "batch_norm_gaussian", "batch_norm", "batch_norm_model", "TorchBatchNormModel", "bn_model",
            gs.Box(-3.0, 5.0, (7,), np.float32), gs.Box(-1.0, 1.0, (2,), np.float32), batch=4, seed=302,
            warmup_batches=(8, 24, 12),
            description="RLlib's TorchBatchNormModel on a shifted Box(7) obs with a DiagGaussian action, after "
            "three training-mode batches",
            notes=[_WARMUP_NOTE],
        ),
        Spec(
            "parametric_actions_cartpole", "parametric_actions", "parametric_actions_model",
            "TorchParametricActionsModel", "pa_model",
            gs.Dict({"action_mask": gs.Box(0, 1, (6,), np.int8), "avail_actions": gs.Box(-10.0, 10.0, (6, 2)),
                     "cart": gs.Box(-2.0, 2.0, (4,), np.float32)}),
            gs.Discrete(6), model_overrides={"fcnet_hiddens": [32, 32]}, batch=6, seed=401, fix_obs=_mask_rows,
            description="RLlib's TorchParametricActionsModel as the seeds' ParametricActionsCartPole uses it "
            "(int8 mask, 2-d embeddings, default DQN heads built but unused)",
        ),
        Spec(
            "parametric_actions_wide", "parametric_actions", "parametric_actions_model",
            "TorchParametricActionsModel", "pa_model",
            gs.Dict({"action_mask": gs.Box(0.0, 1.0, (5,), np.float32), "avail_actions": gs.Box(-1.0, 1.0, (5, 3)),
                     "cart": gs.Box(-1.0, 1.0, (3,), np.float32)}),
            gs.Discrete(5), {"true_obs_shape": [3], "action_embed_size": 3, "q_hiddens": [8], "dueling": True},
            model_overrides={"fcnet_hiddens": [16], "fcnet_activation": "relu"}, batch=5, seed=402,
            fix_obs=_mask_rows,
            description="RLlib's TorchParametricActionsModel with 3-d embeddings, a float mask and dueling "
            "DQN heads (unused by forward)",
        ),
    ]


def _mask_rows(obs: Any, rng: Any, row: int) -> Any:
    """A 0/1 action mask with at least one valid slot (every third row: exactly one)."""
    mask = obs["action_mask"]
    n = mask.shape[0]
    valid = np.zeros(n, bool) if row % 3 == 2 else rng.random(n) < 0.6
    valid[rng.integers(n)] = True
    return {**obs, "action_mask": valid.astype(mask.dtype)}


_WARMUP_NOTE = (
    "after perturb(), the model ran forward({'obs': batch, 'is_training': True}) once per entry of "
    "warmup_batches (random observations from the space), which updated the BatchNorm1d running_mean, "
    "running_var and num_batches_tracked buffers (momentum 0.1); weights.npz holds those buffers. Every io key "
    "comes from forward({'obs': obs}) with no is_training, which TorchBatchNormModel reads as False and so "
    "sets its hidden layers to eval(): the running statistics normalise, the batch's own do not"
)
