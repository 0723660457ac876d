"""Registry of custom models, the counterpart of RLlib's ``ModelCatalog.register_custom_model``.

A custom model class is built as ``cls(obs_space, action_space, num_outputs, model_config,
name, **custom_model_config)`` (RLlib's TorchModelV2 signature) and follows the base-model
contract of ``models/networks/fcnet.py``: attribute ``num_outputs`` and
``forward(obs (B, *obs_shape)) -> (out (B, num_outputs), value (B,))``, pure, so it exports.
``obs_space`` is the preprocessed space with ``.original_space`` (the raw one) when the
preprocessor changed it, as in RLlib. Built with ``num_outputs=None`` (under use_lstm /
use_attention) the model sets ``num_outputs`` to its feature width.

Names are plain strings; RLlib's dotted class paths of well-known example models are
registered as aliases so that RLlib configs resolve without importing anything by path.
A class may carry ``rllib_class_name`` to report the RLlib class it reproduces.

A class derived from ``models/networks/custom_policy.py``'s ``RecurrentCustomModel``
declares its own recurrent state and is a policy model itself (not wrapped by the catalog).
"""

from __future__ import annotations

import difflib
from typing import Any

from torch import nn

from rlserve.models.networks import (
    action_mask,
    autoregressive,
    batch_norm,
    frame_stacking,
    parametric_actions,
    rnn_model,
)

__all__ = [
    "UnknownCustomModelError",
    "get_custom_model",
    "register_custom_model",
    "registered_custom_models",
    "rllib_class_name",
    "unregister_custom_model",
]

_REGISTRY: dict[str, type[nn.Module]] = {}


class UnknownCustomModelError(ValueError):
    """``custom_model`` names nothing in the registry."""


def register_custom_model(name: str, cls: type[nn.Module]) -> None:
    """Make ``cls`` available as ``model_config["custom_model"] = name`` (replaces a previous one)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"custom model name must be a non-empty string, got {name!r}")
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        raise TypeError(f"custom model {name!r}: expected a torch.nn.Module subclass, got {cls!r}")
    _REGISTRY[name] = cls


def unregister_custom_model(name: str) -> None:
    _REGISTRY.pop(name, None)


def registered_custom_models() -> list[str]:
    _ensure_builtins()
    return sorted(_REGISTRY)


def get_custom_model(name_or_cls: str | type[nn.Module]) -> type[nn.Module]:
    """The class for a registered name; a class is returned as is (RLlib accepts both)."""
    if isinstance(name_or_cls, type):
        if not issubclass(name_or_cls, nn.Module):
            raise TypeError(f"custom_model: expected a torch.nn.Module subclass, got {name_or_cls!r}")
        return name_or_cls
    _ensure_builtins()
    try:
        return _REGISTRY[name_or_cls]
    except KeyError:
        close = difflib.get_close_matches(str(name_or_cls), list(_REGISTRY), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise UnknownCustomModelError(
            f"model_config.custom_model: {name_or_cls!r} is not registered{hint} "
            f"(registered: {sorted(_REGISTRY)}); call rlserve.models.custom.register_custom_model(name, cls) first"
        ) from None


def rllib_class_name(cls: type[Any]) -> str:
    return getattr(cls, "rllib_class_name", cls.__name__)


_builtins_loaded = False


def _ensure_builtins() -> None:
    # Registered at the first lookup, each name only where the user registered none.
    global _builtins_loaded
    if _builtins_loaded:
        return
    _builtins_loaded = True

    builtins = (
        ("action_mask", action_mask, action_mask.ActionMaskModel),
        ("rnn_model", rnn_model, rnn_model.TorchRNNModel),
        ("frame_stacking", frame_stacking, frame_stacking.TorchFrameStackingCartPoleModel),
        ("batch_norm", batch_norm, batch_norm.TorchBatchNormModel),
        ("parametric_actions", parametric_actions, parametric_actions.TorchParametricActionsModel),
        ("autoregressive_model", autoregressive, autoregressive.AutoregressiveActionModel),
    )
    for short_name, module, cls in builtins:
        for name in (short_name, *module.RLLIB_PATHS):
            _REGISTRY.setdefault(name, cls)
