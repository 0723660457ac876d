"""The ``q_model`` block of a model config: DQN's Q-head settings (torch-free).

RLlib keeps these in the algorithm config (``DQNConfig().training(hiddens=..., dueling=...)``),
not in the model config; rlserve reads them from ``model_config["q_model"]`` under the same
names, so one JSON object describes a DQN policy::

    {"fcnet_hiddens": [64, 64], "q_model": {"hiddens": [256], "dueling": true}}

``epsilon`` is rlserve's own: the exploration rate a served Q-policy uses when it explores
(RLlib's EpsilonGreedy ``final_epsilon``, 0.02 by default; a request may override it).
Distributional (``num_atoms > 1``) and noisy Q-heads are refused: the first needs a
different serving contract (a return distribution per action), the second resamples its
weights at every forward pass, so its greedy action is not a function of the observation.
"""

from __future__ import annotations

import copy
import difflib
from collections.abc import Mapping
from typing import Any

from rlserve.models.config_error import ConfigError

__all__ = ["Q_MODEL_DEFAULTS", "Q_MODEL_KEY", "q_model_config", "q_num_outputs"]

Q_MODEL_KEY = "q_model"

# DQNConfig's defaults for the keys that shape the Q-model (ray 2.60, old API stack).
Q_MODEL_DEFAULTS: dict[str, Any] = {
    "hiddens": [256],
    "dueling": True,
    "num_atoms": 1,
    "noisy": False,
    "v_min": -10.0,
    "v_max": 10.0,
    "sigma0": 0.5,
    "double_q": True,
    "categorical_distribution_temperature": 1.0,
    "dueling_activation": "relu",
    "add_layer_norm": False,
    "epsilon": 0.02,
}

_DUELING_ACTIVATIONS = ("relu", "tanh", "linear")


def _key(name: str) -> str:
    return f"{Q_MODEL_KEY}.{name}"


def q_model_config(model_config: Mapping[str, Any]) -> dict[str, Any] | None:
    """The validated Q settings (defaults filled in), or None when the config has no ``q_model``."""
    block = model_config.get(Q_MODEL_KEY)
    if block is None:
        return None
    if not isinstance(block, Mapping):
        raise ConfigError(Q_MODEL_KEY, "an object of DQNConfig settings (hiddens, dueling, ...)", block)
    for name in block:
        if name not in Q_MODEL_DEFAULTS:
            close = difflib.get_close_matches(str(name), list(Q_MODEL_DEFAULTS), n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"known: {sorted(Q_MODEL_DEFAULTS)}"
            raise ConfigError(_key(str(name)), "a known q_model key", name, hint=hint, received_text="an unknown key")
    q = copy.deepcopy(Q_MODEL_DEFAULTS)
    q.update(copy.deepcopy(dict(block)))
    _validate(q)
    return q


def _validate(q: dict[str, Any]) -> None:
    hiddens = q["hiddens"]
    if not isinstance(hiddens, list | tuple) or not all(isinstance(n, int) and not isinstance(n, bool) and n > 0
                                                         for n in hiddens):
        raise ConfigError(_key("hiddens"), "a list of positive layer sizes", hiddens)
    for flag in ("dueling", "noisy", "double_q", "add_layer_norm"):
        if not isinstance(q[flag], bool):
            raise ConfigError(_key(flag), "true or false", q[flag])
    if q["num_atoms"] != 1:
        raise ConfigError(_key("num_atoms"), "1 (distributional Q-heads are not served)", q["num_atoms"])
    if q["noisy"]:
        raise ConfigError(_key("noisy"), "false (noisy layers resample weights at every call; not served)", True)
    if q["dueling_activation"] not in _DUELING_ACTIVATIONS:
        raise ConfigError(_key("dueling_activation"), f"one of {list(_DUELING_ACTIVATIONS)}", q["dueling_activation"])
    eps = q["epsilon"]
    if isinstance(eps, bool) or not isinstance(eps, int | float) or not 0.0 <= eps <= 1.0:
        raise ConfigError(_key("epsilon"), "a number in [0, 1]", eps)


def q_num_outputs(q: Mapping[str, Any], model_config: Mapping[str, Any], n_actions: int) -> tuple[int, bool]:
    """DQN's builder rule: (num_outputs of the base model, whether it sets no_final_linear).

    With Q ``hiddens`` the base ends in its last hidden layer: ``num_outputs`` is
    ``([256] + fcnet_hiddens)[-1]`` and ``no_final_linear`` is forced on; without them the
    base's logits are the Q-values' input (``num_outputs = n_actions``).
    """
    if q["hiddens"]:
        return int(([256, *model_config.get("fcnet_hiddens", [])])[-1]), True
    return int(n_actions), False
