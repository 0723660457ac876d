"""Reference inputs for a bundle: one small, realistic batch per model input (numpy only).

Observations are drawn from the observation space and preprocessed the way the server
will (so a mask is 0/1 and an image is 0..255, not noise); with a frozen filter the model
sees standardised values, so N(0, 1) rows stand in for filtered observations. Recurrent
state is random (not zero) so the state path is exercised, and previous actions are real
actions of the action space, flattened as the contract says.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Mapping
from typing import Any

import numpy as np
from gymnasium import spaces as gs

from rlserve.models.export.describe import get_preprocessor
from rlserve.models.interface import ModelSignature
from rlserve.models.spaces import Simplex


def make_reference_inputs(
    signature: ModelSignature,
    obs_space: gs.Space,
    action_space: gs.Space,
    model_config: Mapping[str, Any],
    filter_state: Mapping[str, Any] | None,
    batch: int,
    seed: int = 0,
) -> dict[str, np.ndarray]:
    """Input name -> ``(batch, ...)`` float32 array for every input of ``signature``."""
    rng = np.random.default_rng(seed)
    inputs = {"obs": _observations(signature, obs_space, model_config, filter_state, batch, rng, seed)}
    for i, spec in enumerate(signature.state):
        inputs[f"state_in_{i}"] = (0.5 * rng.standard_normal((batch, *spec.shape))).astype(np.float32)
    window = _prev_window(signature)
    if signature.uses_prev_actions:
        n = signature.prev.n_prev_actions
        count = batch * (n if signature.prev.windowed else 1)
        flat = _sample_flat_actions(action_space, count, signature.prev.action_width, seed)
        inputs["prev_actions"] = flat.reshape((batch, *window(n), signature.prev.action_width))
    if signature.uses_prev_rewards:
        shape = (batch, *window(signature.prev.n_prev_rewards))
        inputs["prev_rewards"] = rng.standard_normal(shape).astype(np.float32)
    return inputs


def _prev_window(signature: ModelSignature):
    return (lambda n: (n,)) if signature.prev.windowed else (lambda n: ())


def _observations(
    signature: ModelSignature, obs_space: gs.Space, model_config: Mapping[str, Any],
    filter_state: Mapping[str, Any] | None, batch: int, rng: np.random.Generator, seed: int,
) -> np.ndarray:
    shape = (batch, *signature.obs_shape)
    if filter_state is None:
        rows = _preprocessed_samples(obs_space, model_config, batch, seed)
        if rows is not None and rows.shape == shape:
            return rows.astype(np.float32)
    return rng.standard_normal(shape).astype(np.float32)


def _preprocessed_samples(
    obs_space: gs.Space, model_config: Mapping[str, Any], batch: int, seed: int
) -> np.ndarray | None:
    """``batch`` preprocessed samples of ``obs_space``, or None without a preprocessor.

    Without one (an unusual space, or a custom model's own input) the caller falls back
    to N(0, 1) noise, which still checks the runtimes against eager torch.
    """
    try:
        prep = get_preprocessor(obs_space, model_config)
    except (ImportError, ValueError, NotImplementedError):
        return None
    space = copy.deepcopy(obs_space)
    space.seed(seed)
    return np.stack([np.asarray(prep.transform(space.sample())) for _ in range(batch)])


def _sample_flat_actions(action_space: gs.Space, count: int, width: int, seed: int) -> np.ndarray:
    """``(count, width)`` flattened actions (Discrete: the index from 0; Dict keys sorted)."""
    space = copy.deepcopy(action_space)
    space.seed(seed)
    try:
        rows = np.stack([flatten_action(action_space, space.sample()) for _ in range(count)])
    except (TypeError, ValueError):
        rows = None
    if rows is None or rows.shape != (count, width):
        # A space this module cannot flatten: small non-negative integers are valid
        # indices for discrete columns and ordinary values for continuous ones.
        rows = np.random.default_rng(seed).integers(0, 2, size=(count, width))
    return rows.astype(np.float32)


@functools.singledispatch
def flatten_action(space: gs.Space, action: Any) -> np.ndarray:
    raise TypeError(f"cannot flatten actions of {type(space).__name__}")


@flatten_action.register
def _(space: gs.Discrete, action: Any) -> np.ndarray:
    return np.asarray([int(action) - int(space.start)], dtype=np.float64)


@flatten_action.register
def _(space: gs.MultiDiscrete, action: Any) -> np.ndarray:
    return (np.asarray(action) - np.asarray(space.start)).ravel().astype(np.float64)


@flatten_action.register(gs.Box)
@flatten_action.register(gs.MultiBinary)
@flatten_action.register(Simplex)
def _(space: gs.Space, action: Any) -> np.ndarray:
    return np.asarray(action, dtype=np.float64).ravel()


@flatten_action.register
def _(space: gs.Tuple, action: Any) -> np.ndarray:
    return np.concatenate([flatten_action(s, a) for s, a in zip(space.spaces, action, strict=True)])


@flatten_action.register
def _(space: gs.Dict, action: Any) -> np.ndarray:
    return np.concatenate([flatten_action(space.spaces[k], action[k]) for k in sorted(space.spaces)])
