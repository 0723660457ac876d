"""The new stack's model config: RLlib 2.60's ``DefaultModelConfig`` and what it shapes (torch-free).

A new-stack checkpoint stores only the overrides of the model config (plus what the
algorithm adds itself, e.g. PPO's ``vf_share_layers=False`` or DQN's ``dueling``); RLlib's
catalog merges them over ``DefaultModelConfig`` (``Catalog.__init__``: ``defaults | stored``).
``effective_model_config`` does the same with the defaults of the RLlib version these modules
were checked against, so the architecture does not depend on a later RLlib's defaults.

Initializer settings only matter for training (the weights come from the checkpoint);
``max_seq_len`` only for training sequences; ``lstm_use_prev_action/reward`` are ignored by
the new stack's LSTM encoder (previous actions and rewards reach a module through the
``PrevActionsPrevRewards`` connector); ``fusionnet_*`` shape SAC's Q-networks, which acting
does not use. They are kept in the manifest as stored.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from rlserve.models.checkpoint.errors import CheckpointError

__all__ = ["DEFAULT_MODEL_CONFIG", "effective_model_config"]

# ray.rllib.core.rl_module.default_model_config.DefaultModelConfig (ray 2.60) as a dict.
DEFAULT_MODEL_CONFIG: dict[str, Any] = {
    "fcnet_hiddens": [256, 256],
    "fcnet_activation": "tanh",
    "fcnet_kernel_initializer": None,
    "fcnet_kernel_initializer_kwargs": None,
    "fcnet_bias_initializer": None,
    "fcnet_bias_initializer_kwargs": None,
    "fcnet_use_layernorm": False,
    "conv_filters": None,
    "conv_activation": "relu",
    "conv_kernel_initializer": None,
    "conv_kernel_initializer_kwargs": None,
    "conv_bias_initializer": None,
    "conv_bias_initializer_kwargs": None,
    "head_fcnet_hiddens": [],
    "head_fcnet_activation": "relu",
    "head_fcnet_kernel_initializer": None,
    "head_fcnet_kernel_initializer_kwargs": None,
    "head_fcnet_bias_initializer": None,
    "head_fcnet_bias_initializer_kwargs": None,
    "head_fcnet_use_layernorm": False,
    "free_log_std": False,
    "log_std_clip_param": 20.0,
    "vf_share_layers": True,
    "use_lstm": False,
    "max_seq_len": 20,
    "lstm_cell_size": 256,
    "lstm_use_prev_action": False,
    "lstm_use_prev_reward": False,
    "lstm_kernel_initializer": None,
    "lstm_kernel_initializer_kwargs": None,
    "lstm_bias_initializer": None,
    "lstm_bias_initializer_kwargs": None,
    "fusionnet_hiddens": [256, 256],
    "fusionnet_activation": "tanh",
    "fusionnet_kernel_initializer": None,
    "fusionnet_kernel_initializer_kwargs": None,
    "fusionnet_bias_initializer": None,
    "fusionnet_bias_initializer_kwargs": None,
}

_LAYER_LISTS = ("fcnet_hiddens", "head_fcnet_hiddens", "fusionnet_hiddens")
_FLAGS = ("fcnet_use_layernorm", "head_fcnet_use_layernorm", "free_log_std", "vf_share_layers", "use_lstm")


def effective_model_config(stored: Mapping[str, Any], where: str) -> dict[str, Any]:
    """``DEFAULT_MODEL_CONFIG`` updated with the checkpoint's stored overrides, checked.

    Values are plain data already (the reader turned tuples into lists); a layer list
    that is not a list of positive integers, or a flag that is not a bool, is refused with
    the key named. Keys RLlib's defaults lack (an algorithm's own, such as DQN's
    ``dueling``) are kept.
    """
    config = copy.deepcopy(DEFAULT_MODEL_CONFIG)
    config.update(copy.deepcopy(dict(stored)))
    for key in _LAYER_LISTS:
        value = config[key]
        if not isinstance(value, list) or not all(isinstance(n, int) and not isinstance(n, bool) and n > 0
                                                  for n in value):
            raise CheckpointError(f"{where}: model_config[{key!r}] must be a list of positive layer sizes, "
                                  f"got {value!r}")
    for key in _FLAGS:
        if not isinstance(config[key], bool):
            raise CheckpointError(f"{where}: model_config[{key!r}] must be true or false, got {config[key]!r}")
    if not isinstance(config["lstm_cell_size"], int) or config["lstm_cell_size"] <= 0:
        raise CheckpointError(f"{where}: model_config['lstm_cell_size'] must be a positive integer, "
                              f"got {config['lstm_cell_size']!r}")
    return config
