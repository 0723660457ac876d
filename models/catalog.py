"""The model catalog: RLlib's ``ModelCatalog.get_model_v2`` choice, built in torch.

``build_model(obs_space, action_space, model_config)`` returns a module following the
uniform contract of ``models/interface.py`` (``forward(*inputs) -> (dist_inputs, value,
*state_out)`` and ``signature()``):

    raw obs space -> preprocessor -> model obs space (flat Box with ``original_space``,
    or the raw space under NoPreprocessor)
    base model:   custom_model from the registry, else by the model obs space:
                  original Dict/Tuple holding a Box with ndim >= 2 -> ComplexInputNetwork
                  1-D Box -> FullyConnectedNetwork; 3-D Box -> VisionNetwork;
                  anything else (top-level MultiBinary, 2-D Box) -> ComplexInputNetwork
    wrapper:      use_lstm -> LSTMWrapper, use_attention -> AttentionWrapper,
                  else FeedForwardPolicy. Wrapped bases are built with num_outputs=None.
    Q-model:      model_config["q_model"] (DQNConfig's settings, models/q_config.py) ->
                  the base by the same rule, wrapped as DQN's Q-model (DQNModel), served
                  through HeadedPolicy: dist inputs = Q-values.
    action head:  a base with ``dist_head`` (e.g. the autoregressive example model) is
                  served through HeadedPolicy (dist inputs = what the head returns).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any, cast

import gymnasium.spaces as gs
import torch
from torch import nn

from rlserve.models.config import merge_model_config
from rlserve.models.custom import get_custom_model, rllib_class_name
from rlserve.models.distributions import model_output_width
from rlserve.models.networks.complex_input import (
    ComplexInputNetwork,
    components_for,
    preprocessor_leaf_shape,
)
from rlserve.models.networks.custom_policy import declares_signature
from rlserve.models.networks.fcnet import FullyConnectedNetwork
from rlserve.models.networks.policy import FeedForwardPolicy, HeadedPolicy
from rlserve.models.networks.q_model import DQNModel
from rlserve.models.networks.visionnet import VisionNetwork
from rlserve.models.preprocessors import get_preprocessor
from rlserve.models.q_config import q_model_config, q_num_outputs

__all__ = ["build_base_model", "build_model", "describe_model", "select_base_class"]

# use_* flag -> (module, class) of the wrapper; imported lazily (they are optional extras).
_WRAPPERS = {
    "use_lstm": ("rlserve.models.networks.lstm", "LSTMWrapper"),
    "use_attention": ("rlserve.models.networks.gtrxl", "AttentionWrapper"),
}


def _has_image_leaf(space: gs.Space) -> bool:
    if isinstance(space, gs.Tuple):
        return any(_has_image_leaf(s) for s in space.spaces)
    if isinstance(space, gs.Dict):
        return any(_has_image_leaf(s) for s in space.spaces.values())
    return isinstance(space, gs.Box) and len(space.shape) >= 2


def select_base_class(model_space: gs.Space, original_space: gs.Space) -> type[nn.Module]:
    """RLlib's default-model rule for the (preprocessed) model obs space."""
    if isinstance(original_space, gs.Tuple | gs.Dict) and _has_image_leaf(original_space):
        return ComplexInputNetwork
    if isinstance(model_space, gs.Box) and len(model_space.shape) == 1:
        return FullyConnectedNetwork
    if isinstance(model_space, gs.Box) and len(model_space.shape) == 3:
        return VisionNetwork
    return ComplexInputNetwork


def _wrapper_flag(config: Mapping[str, Any]) -> str | None:
    flags = [flag for flag in _WRAPPERS if config.get(flag)]
    if len(flags) > 1:
        raise ValueError("model_config: only one of 'use_lstm' or 'use_attention' may be true")
    return flags[0] if flags else None


def _base_class(model_space: gs.Space, original_space: gs.Space, config: Mapping[str, Any]) -> type[nn.Module]:
    if config.get("custom_model"):
        return get_custom_model(config["custom_model"])
    return select_base_class(model_space, original_space)


def build_base_model(
    prep: Any, action_space: gs.Space, config: Mapping[str, Any], num_outputs: int | None
) -> nn.Module:
    """The base model (base-model contract) for a preprocessor's model obs space."""
    model_space = prep.observation_space
    cls = _base_class(model_space, prep.original_space, config)
    if config.get("custom_model"):
        model = cls(
            model_space, action_space, num_outputs, config, "model", **dict(config.get("custom_model_config") or {})
        )
        _check_custom_model(model, prep.output_shape, num_outputs)
        return model
    if cls is ComplexInputNetwork:
        components = components_for(prep.original_space, preprocessor_leaf_shape(config))
        return ComplexInputNetwork(prep.output_shape, num_outputs, config, components)
    return cls(prep.output_shape, num_outputs, config)


def build_model(
    obs_space: gs.Space,
    action_space: gs.Space,
    model_config: Mapping[str, Any] | None = None,
    *,
    num_outputs: int | None = None,
) -> nn.Module:
    """The policy model for raw ``obs_space`` / ``action_space`` (uniform contract).

    ``num_outputs`` defaults to the action distribution's input size.
    """
    config = merge_model_config(model_config or {}, action_space)
    prep = get_preprocessor(obs_space, config)
    q = q_model_config(config)
    if q is not None:
        return HeadedPolicy(_build_q_model(prep, action_space, config, q, num_outputs), prep.output_shape)
    if num_outputs is None:
        num_outputs = model_output_width(action_space, config)
    flag = _wrapper_flag(config)
    if config.get("custom_model") and declares_signature(get_custom_model(config["custom_model"])):
        return _build_policy_model(prep, action_space, config, num_outputs, flag)
    if flag is None:
        base = build_base_model(prep, action_space, config, num_outputs)
        policy_cls = HeadedPolicy if hasattr(base, "dist_head") else FeedForwardPolicy
        return policy_cls(base, prep.output_shape)
    module_name, class_name = _WRAPPERS[flag]
    wrapper_cls = getattr(importlib.import_module(module_name), class_name)
    base = build_base_model(prep, action_space, config, None)
    return wrapper_cls(base, prep.observation_space, action_space, num_outputs, config)


def describe_model(
    obs_space: gs.Space, action_space: gs.Space, model_config: Mapping[str, Any] | None = None
) -> str:
    """RLlib's class name for this config, e.g. ``FullyConnectedNetwork_as_LSTMWrapper``."""
    config = merge_model_config(model_config or {}, action_space)
    prep = get_preprocessor(obs_space, config)
    name = rllib_class_name(_base_class(prep.observation_space, prep.original_space, config))
    if q_model_config(config) is not None:
        return f"{name}_as_DQNTorchModel"
    flag = _wrapper_flag(config)
    return name if flag is None else f"{name}_as_{_WRAPPERS[flag][1]}"


def _build_policy_model(
    prep: Any, action_space: gs.Space, config: Mapping[str, Any], num_outputs: int, flag: str | None
) -> nn.Module:
    """A custom model that declares its own state is the policy model: no wrapper around it."""
    if flag is not None:
        raise ValueError(
            f"model_config.{flag}: the custom model {config['custom_model']!r} declares its own state; "
            "it cannot also be wrapped (set use_lstm and use_attention to false)"
        )
    cls = get_custom_model(config["custom_model"])
    model = cls(prep.observation_space, action_space, num_outputs, config, "model",
                **dict(config.get("custom_model_config") or {}))
    _check_policy_model(model, num_outputs)
    return model


def _check_policy_model(model: nn.Module, num_outputs: int) -> None:
    """One zero batch through the declared signature, so a contract slip fails at build."""
    sig = cast(Any, model).signature()
    if sig.num_outputs != num_outputs:
        raise ValueError(
            f"custom model {type(model).__name__}: num_outputs {sig.num_outputs} differs from the action "
            f"distribution's {num_outputs}"
        )
    inputs = [torch.zeros((2, *sig.obs_shape))] + [torch.zeros((2, *s.shape)) for s in sig.state]
    window = (sig.prev.n_prev_actions,) if sig.prev.windowed else ()
    if sig.uses_prev_actions:
        inputs.append(torch.zeros((2, *window, sig.prev.action_width)))
    if sig.uses_prev_rewards:
        inputs.append(torch.zeros((2, sig.prev.n_prev_rewards) if sig.prev.windowed else (2,)))
    with torch.no_grad():
        outs = model(*inputs)
    expected = [(2, num_outputs), (2,)] + [(2, *s.shape) for s in sig.state]
    got = [tuple(o.shape) for o in outs] if isinstance(outs, tuple) else [type(outs).__name__]
    if got != expected:
        raise ValueError(
            f"custom model {type(model).__name__}: forward(obs, *state) returned shapes {got}; "
            f"expected {expected} (dist_inputs, value, one new state per declared state tensor)"
        )


def _build_q_model(
    prep: Any, action_space: gs.Space, config: Mapping[str, Any], q: Mapping[str, Any], num_outputs: int | None
) -> nn.Module:
    """DQN's builder (``build_q_model_and_distribution``): the base with DQN's num_outputs
    rule (and its ``no_final_linear`` side effect), then the Q-head."""
    if not isinstance(action_space, gs.Discrete):
        raise ValueError(f"q_model: DQN needs a Discrete action space, got {action_space!r}")
    default_outputs, no_final_linear = q_num_outputs(q, config, int(action_space.n))
    base_config = {**config, "no_final_linear": True} if no_final_linear else dict(config)
    net = build_base_model(prep, action_space, base_config, num_outputs or default_outputs)
    if hasattr(net, "dist_head"):
        raise ValueError(f"q_model: custom model {type(net).__name__} has its own action head (dist_head)")
    return DQNModel(net, int(action_space.n), q)


def _check_custom_model(model: nn.Module, obs_shape: tuple[int, ...], num_outputs: int | None) -> None:
    """One zero batch through a custom model, so a contract slip fails at build, not in serving."""
    width = getattr(model, "num_outputs", None)
    if not isinstance(width, int) or (num_outputs and width != num_outputs):
        raise ValueError(
            f"custom model {type(model).__name__}: num_outputs must be an int equal to {num_outputs} "
            f"(or its feature width when built with None), got {width!r}"
        )
    with torch.no_grad():
        result = model(torch.zeros((2, *obs_shape)))
    if not (isinstance(result, tuple) and len(result) == 2):
        raise ValueError(f"custom model {type(model).__name__}: forward(obs) must return (out, value)")
    out, value = result
    if tuple(out.shape) != (2, width) or tuple(value.shape) != (2,):
        raise ValueError(
            f"custom model {type(model).__name__}: forward(obs (2, *{list(obs_shape)})) returned out "
            f"{list(out.shape)} and value {list(value.shape)}; expected [2, {width}] and [2]"
        )
