"""RLlib's model config: ``MODEL_DEFAULTS`` (ray 2.60, old API stack) and its validation.

``merge_model_config(overrides)`` is the one entry point: a deep copy of the defaults with
the overrides applied, deprecated keys mapped or rejected, and every key the catalog reads
type-checked. Errors are ``ConfigError`` (a ``ValueError``) naming the key, what was
expected and what was received; an unknown key suggests the closest known one.

This module is torch-free: the server validates configs without building a network.
"""

from __future__ import annotations

import copy
import difflib
import numbers
import warnings
from collections.abc import Callable, Mapping
from typing import Any

from rlserve.models.config_error import ConfigError
from rlserve.models.q_config import q_model_config

__all__ = [
    "ACTIVATIONS",
    "DEPRECATED_VALUE",
    "MODEL_DEFAULTS",
    "ConfigError",
    "canonical_activation",
    "merge_model_config",
    "validate_model_config",
]

# RLlib marks keys that are kept only to detect old configs with this sentinel.
DEPRECATED_VALUE = -1

MODEL_DEFAULTS: dict[str, Any] = {
    # FullyConnectedNetwork
    "fcnet_hiddens": [256, 256],
    "fcnet_activation": "tanh",
    "fcnet_weights_initializer": None,
    "fcnet_weights_initializer_config": None,
    "fcnet_bias_initializer": None,
    "fcnet_bias_initializer_config": None,
    # VisionNetwork (None: the catalog picks default filters by image shape)
    "conv_filters": None,
    "conv_activation": "relu",
    "conv_kernel_initializer": None,
    "conv_kernel_initializer_config": None,
    "conv_bias_initializer": None,
    "conv_bias_initializer_config": None,
    "conv_transpose_kernel_initializer": None,
    "conv_transpose_kernel_initializer_config": None,
    "conv_transpose_bias_initializer": None,
    "conv_transpose_bias_initializer_config": None,
    # Final FC stack (ComplexInputNetwork, VisionNet, FCNet)
    "post_fcnet_hiddens": [],
    "post_fcnet_activation": "relu",
    "post_fcnet_weights_initializer": None,
    "post_fcnet_weights_initializer_config": None,
    "post_fcnet_bias_initializer": None,
    "post_fcnet_bias_initializer_config": None,
    "free_log_std": False,
    # Read by new-stack modules only; the old-stack DiagGaussian ignores it.
    "log_std_clip_param": 20.0,
    "no_final_linear": False,
    "vf_share_layers": True,
    # LSTM wrapper
    "use_lstm": False,
    "max_seq_len": 20,
    "lstm_cell_size": 256,
    "lstm_use_prev_action": False,
    "lstm_use_prev_reward": False,
    # Ignored by the old-stack torch LSTM (it keeps torch's default init).
    "lstm_weights_initializer": None,
    "lstm_weights_initializer_config": None,
    "lstm_bias_initializer": None,
    "lstm_bias_initializer_config": None,
    "_time_major": False,
    # Attention (GTrXL) wrapper
    "use_attention": False,
    "attention_num_transformer_units": 1,
    "attention_dim": 64,
    "attention_num_heads": 1,
    "attention_head_dim": 32,
    "attention_memory_inference": 50,
    "attention_memory_training": 50,
    "attention_position_wise_mlp_dim": 32,
    "attention_init_gru_gate_bias": 2.0,
    "attention_use_n_prev_actions": 0,
    "attention_use_n_prev_rewards": 0,
    # Atari
    "framestack": True,
    "dim": 84,
    "grayscale": False,
    "zero_mean": True,
    # Custom models
    "custom_model": None,
    "custom_model_config": {},
    "custom_action_dist": None,
    "custom_preprocessor": None,
    # RLModule-only options
    "encoder_latent_dim": None,
    "always_check_shapes": False,
    # Deprecated keys
    "lstm_use_prev_action_reward": DEPRECATED_VALUE,
    "_use_default_native_models": DEPRECATED_VALUE,
    # Experimental flags
    "_disable_preprocessor_api": False,
    "_disable_action_flattening": False,
}

# What RLlib's torch ``get_activation_fn`` accepts by lower-case name; it also accepts
# any ``torch.nn`` attribute by its exact name, listed separately below.
ACTIVATIONS: dict[str | None, str | None] = {
    None: None,
    "linear": None,
    "tanh": "tanh",
    "relu": "relu",
    "swish": "silu",
    "silu": "silu",
    "elu": "elu",
}
_TORCH_NN_ACTIVATIONS = (
    "CELU", "ELU", "GELU", "GLU", "Hardshrink", "Hardsigmoid", "Hardswish", "Hardtanh",
    "LeakyReLU", "LogSigmoid", "Mish", "PReLU", "ReLU", "ReLU6", "RReLU", "SELU", "SiLU",
    "Sigmoid", "Softplus", "Softshrink", "Softsign", "Tanh", "Tanhshrink",
)
_TORCH_ALIASES = {"Tanh": "tanh", "ReLU": "relu", "SiLU": "silu", "ELU": "elu"}

# Keys of older RLlib releases, with where their meaning lives now.
_RENAMED = {
    "custom_options": "custom_model_config",
}


# rlserve's own model config keys, kept only when given (RLlib's configs never hold them):
# "q_model" holds DQN's Q-head settings (models/q_config.py).
EXTENSION_KEYS = ("q_model",)


def canonical_activation(name: Any, key: str = "activation") -> str | None:
    """Map an activation descriptor to the name networks build from.

    Returns ``None`` (no activation), one of ``tanh``/``relu``/``silu``/``elu``, or
    another ``torch.nn`` class name such as ``"GELU"`` (build ``getattr(nn, name)()``).
    Lookup order as RLlib's torch ``get_activation_fn``: ``linear``/None first, then an
    exact ``torch.nn`` name, then the lower-case aliases.
    """
    if name is None:
        return None
    if not isinstance(name, str):
        raise ConfigError(key, _activation_choices(), name)
    if name.lower() == "linear":
        return None
    if name in _TORCH_NN_ACTIVATIONS:
        # The same torch modules as the lower-case aliases: one spelling for networks.
        return _TORCH_ALIASES.get(name, name)
    lowered = name.lower()
    if lowered in ACTIVATIONS:
        return ACTIVATIONS[lowered]
    raise ConfigError(key, _activation_choices(), name)


def _activation_choices() -> str:
    return "one of " + ", ".join(repr(k) for k in ACTIVATIONS) + " or a torch.nn activation name"


# --------------------------------------------------------------------------- checks

_Check = Callable[[str, Any], None]


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _bool(key: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise ConfigError(key, "true or false", value)


def _positive_int(key: str, value: Any) -> None:
    if not _is_int(value) or value < 1:
        raise ConfigError(key, "a positive integer", value)


def _non_negative_int(key: str, value: Any) -> None:
    if not _is_int(value) or value < 0:
        raise ConfigError(key, "an integer >= 0", value)


def _number(key: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ConfigError(key, "a number", value)


def _layer_sizes(key: str, value: Any) -> None:
    if not isinstance(value, list | tuple) or not all(_is_int(v) and v > 0 for v in value):
        raise ConfigError(key, "a list of positive integers (layer sizes)", value)


def _activation(key: str, value: Any) -> None:
    canonical_activation(value, key)


def _optional_str(key: str, value: Any) -> None:
    if value is not None and not isinstance(value, str):
        raise ConfigError(key, "a string or null", value)


def _optional_dict(key: str, value: Any) -> None:
    if value is not None and not isinstance(value, Mapping):
        raise ConfigError(key, "an object (dict) or null", value)


def _dict(key: str, value: Any) -> None:
    if not isinstance(value, Mapping):
        raise ConfigError(key, "an object (dict)", value)


def _custom_model(key: str, value: Any) -> None:
    # A registered name, a dotted class path, or (in-process) the class itself.
    if value is not None and not isinstance(value, str | type):
        raise ConfigError(key, "a model name, a dotted class path or null", value)


def _optional_positive_int(key: str, value: Any) -> None:
    if value is not None:
        _positive_int(key, value)


def _pair(value: Any) -> bool:
    if _is_int(value):
        return value > 0
    return isinstance(value, list | tuple) and len(value) == 2 and all(_is_int(v) and v > 0 for v in value)


def _conv_filters(key: str, value: Any) -> None:
    if value is None:
        return
    expected = "null or a list of [out_channels, kernel, stride] (kernel/stride: int or [h, w])"
    if not isinstance(value, list | tuple) or not value:
        raise ConfigError(key, expected, value)
    for i, layer in enumerate(value):
        ok = (
            isinstance(layer, list | tuple)
            and len(layer) == 3
            and _is_int(layer[0])
            and layer[0] > 0
            and _pair(layer[1])
            and _pair(layer[2])
        )
        if not ok:
            raise ConfigError(f"{key}[{i}]", expected, layer)


def _deprecated_flag(key: str, value: Any) -> None:
    if value != DEPRECATED_VALUE or isinstance(value, bool):
        raise ConfigError(key, f"the deprecated marker {DEPRECATED_VALUE}", value)


def _native_models(key: str, value: Any) -> None:
    # Old configs carried the flag's former default False; anything else asked for
    # Keras-native models, which the torch old stack never had.
    if value is False or (value == DEPRECATED_VALUE and not isinstance(value, bool)):
        return
    raise ConfigError(
        key, f"unset ({DEPRECATED_VALUE})", value,
        hint="'_use_default_native_models' was removed from RLlib; drop the key",
    )


def _no_custom_preprocessor(key: str, value: Any) -> None:
    # RLlib deprecated them; a registered Python class cannot travel in a bundle, and
    # silently ignoring one would serve different inputs than training saw.
    if value is not None:
        raise ConfigError(key, "null (custom preprocessors are not supported)", value,
                          hint="preprocess in a gymnasium ObservationWrapper or inside a custom model")


def _initializer_checks() -> dict[str, _Check]:
    checks: dict[str, _Check] = {}
    for key in MODEL_DEFAULTS:
        if key.endswith("_initializer"):
            checks[key] = _optional_str
        elif key.endswith("_initializer_config"):
            checks[key] = _optional_dict
    return checks


_CHECKS: dict[str, _Check] = {
    **_initializer_checks(),
    "fcnet_hiddens": _layer_sizes,
    "post_fcnet_hiddens": _layer_sizes,
    "fcnet_activation": _activation,
    "conv_activation": _activation,
    "post_fcnet_activation": _activation,
    "conv_filters": _conv_filters,
    "log_std_clip_param": _number,
    "attention_init_gru_gate_bias": _number,
    "custom_model": _custom_model,
    "custom_model_config": _dict,
    "custom_action_dist": _optional_str,
    "custom_preprocessor": _no_custom_preprocessor,
    "encoder_latent_dim": _optional_positive_int,
    "lstm_use_prev_action_reward": _deprecated_flag,
    "_use_default_native_models": _native_models,
    **dict.fromkeys(
        ("max_seq_len", "lstm_cell_size", "attention_num_transformer_units", "attention_dim",
         "attention_num_heads", "attention_head_dim", "attention_memory_inference",
         "attention_memory_training", "attention_position_wise_mlp_dim", "dim"),
        _positive_int,
    ),
    **dict.fromkeys(("attention_use_n_prev_actions", "attention_use_n_prev_rewards"), _non_negative_int),
    **{k: _bool for k, v in MODEL_DEFAULTS.items() if isinstance(v, bool)},
}


# --------------------------------------------------------------------------- API

def _unknown_key(key: str) -> ConfigError:
    if key in _RENAMED:
        new = _RENAMED[key]
        return ConfigError(key, "a current model config key", key, received_text="a key removed from RLlib",
                           hint=f"put these options in '{new}' instead")
    close = difflib.get_close_matches(key, list(MODEL_DEFAULTS), n=1, cutoff=0.6)
    hint = f"did you mean '{close[0]}'?" if close else "see MODEL_DEFAULTS for the valid keys"
    return ConfigError(key, "a known model config key", key, received_text="an unknown key", hint=hint)


def _map_lstm_prev_action_reward(cfg: dict[str, Any], overrides: Mapping[str, Any]) -> None:
    """Old configs' ``lstm_use_prev_action_reward`` becomes the two keys that replaced it."""
    value = overrides.get("lstm_use_prev_action_reward", DEPRECATED_VALUE)
    if value == DEPRECATED_VALUE and not isinstance(value, bool):
        return
    if not isinstance(value, bool):
        raise ConfigError("lstm_use_prev_action_reward", "true or false (deprecated key)", value)
    for new in ("lstm_use_prev_action", "lstm_use_prev_reward"):
        if new in overrides and overrides[new] != value:
            raise ConfigError(
                new, f"{value} to agree with the deprecated 'lstm_use_prev_action_reward'",
                overrides[new], hint="set only 'lstm_use_prev_action' and 'lstm_use_prev_reward'",
            )
        cfg[new] = value
    cfg["lstm_use_prev_action_reward"] = DEPRECATED_VALUE
    warnings.warn(
        "model config 'lstm_use_prev_action_reward' is deprecated; use "
        "'lstm_use_prev_action' and 'lstm_use_prev_reward' (both set to "
        f"{value})",
        DeprecationWarning,
        stacklevel=3,
    )


def validate_model_config(cfg: Mapping[str, Any], action_space: Any = None) -> None:
    """Raise ``ConfigError`` for the first problem in a full model config.

    ``action_space`` (optional) enables RLlib's check that prev-action inputs are not
    combined with a Tuple/Dict action space unless action flattening is disabled.
    """
    for key in cfg:
        if key not in MODEL_DEFAULTS and key not in EXTENSION_KEYS:
            raise _unknown_key(key)
    if cfg.get("q_model") is not None:
        q_model_config(cfg)
        if cfg.get("use_lstm") or cfg.get("use_attention"):
            raise ConfigError("q_model", "no use_lstm/use_attention (DQN's Q-model is feedforward)", cfg["q_model"])
    for key, check in _CHECKS.items():
        if key in cfg:
            check(key, cfg[key])
    if cfg.get("use_lstm") and cfg.get("use_attention"):
        raise ConfigError(
            "use_attention", "false when 'use_lstm' is true", True,
            hint="only one of 'use_lstm' or 'use_attention' may be true",
        )
    if action_space is not None:
        _check_prev_actions(cfg, action_space)


def _check_prev_actions(cfg: Mapping[str, Any], action_space: Any) -> None:
    from gymnasium import spaces as gs

    uses_prev = cfg.get("lstm_use_prev_action") or cfg.get("attention_use_n_prev_actions", 0) > 0
    if uses_prev and not cfg.get("_disable_action_flattening") and isinstance(action_space, gs.Tuple | gs.Dict):
        raise ConfigError(
            "_disable_action_flattening", "true for prev-action inputs with a Tuple/Dict action space",
            cfg.get("_disable_action_flattening"),
        )


def merge_model_config(overrides: Mapping[str, Any] | None = None, action_space: Any = None) -> dict[str, Any]:
    """``MODEL_DEFAULTS`` (deep-copied) updated with ``overrides``, then validated.

    A full config as RLlib records it (deprecated keys at ``DEPRECATED_VALUE``) loads
    unchanged. ``lstm_use_prev_action_reward=True/False`` is mapped onto the two keys
    that replaced it, with a ``DeprecationWarning``.
    """
    overrides = {} if overrides is None else overrides
    if not isinstance(overrides, Mapping):
        raise ConfigError("model", "an object (dict) of model config keys", overrides)
    for key in overrides:
        if key not in MODEL_DEFAULTS and key not in EXTENSION_KEYS:
            raise _unknown_key(key)
    cfg = copy.deepcopy(MODEL_DEFAULTS)
    cfg.update(copy.deepcopy(dict(overrides)))
    _map_lstm_prev_action_reward(cfg, overrides)
    validate_model_config(cfg, action_space)
    return cfg
