"""``get_preprocessor``: RLlib's choice of preprocessor for a space, one rule per type.

RLlib's order (``ray.rllib.models.preprocessors.get_preprocessor``):

1. Discrete / MultiDiscrete -> OneHotPreprocessor (type first, whatever the shape);
2. shape (210, 160, 3) -> GenericPixelPreprocessor, shape (128,) -> AtariRamPreprocessor,
   for *any* other space with that shape (a float Box, a MultiBinary, a Simplex);
3. Tuple / Dict / Repeated -> flattening / padding preprocessors;
4. anything else with a shape (Box, MultiBinary, Simplex) -> NoPreprocessor.

The same rules apply to every child of a Tuple/Dict/Repeated, so a (128,) Box nested in
a Dict is RAM-scaled too. Step 3 and 4 are a ``functools.singledispatch`` on the space
type: a new space is a new registration.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from gymnasium import spaces as gs

from rlserve.models.preprocessing.base import Preprocessor
from rlserve.models.preprocessing.containers import (
    DictFlatteningPreprocessor,
    RepeatedValuesPreprocessor,
    TupleFlatteningPreprocessor,
)
from rlserve.models.preprocessing.leaves import (
    AtariRamPreprocessor,
    NoPreprocessor,
    OneHotPreprocessor,
)
from rlserve.models.preprocessing.pixels import ATARI_OBS_SHAPE, GenericPixelPreprocessor
from rlserve.models.spaces import Repeated, Simplex

__all__ = ["build_preprocessor", "get_preprocessor", "preprocessor_options"]

ATARI_RAM_OBS_SHAPE = (128,)
_OPTION_DEFAULTS = {"dim": 84, "grayscale": False, "zero_mean": True}


def preprocessor_options(model_config: Mapping[str, Any] | None) -> dict[str, Any]:
    """The three model-config keys preprocessors read, with RLlib's defaults."""
    config = model_config or {}
    return {k: config.get(k, default) for k, default in _OPTION_DEFAULTS.items()}


def get_preprocessor(space: gs.Space, model_config: Mapping[str, Any] | None = None) -> Preprocessor:
    """The preprocessor RLlib would build for ``space`` under ``model_config``.

    Only ``dim``, ``grayscale`` and ``zero_mean`` are read (defaults 84, False, True);
    validating the rest of the config is ``rlserve.models.config``'s job.
    """
    return build_preprocessor(space, preprocessor_options(model_config))


def build_preprocessor(space: gs.Space, options: Mapping[str, Any]) -> Preprocessor:
    if not isinstance(space, gs.Discrete | gs.MultiDiscrete):
        shape = getattr(space, "shape", None)
        if shape == ATARI_OBS_SHAPE:
            return GenericPixelPreprocessor(space, options)
        if shape == ATARI_RAM_OBS_SHAPE:
            return AtariRamPreprocessor(space, options)
    return _by_type(space, options)


@functools.singledispatch
def _by_type(space: gs.Space, options: Mapping[str, Any]) -> Preprocessor:
    raise ValueError(
        f"unsupported observation space {type(space).__name__}: {space!r}; expected Box, "
        "Discrete, MultiDiscrete, MultiBinary, Tuple, Dict, Repeated or Simplex"
    )


@_by_type.register(gs.Discrete)
@_by_type.register(gs.MultiDiscrete)
def _(space: gs.Discrete | gs.MultiDiscrete, options: Mapping[str, Any]) -> Preprocessor:
    return OneHotPreprocessor(space, options)


@_by_type.register(gs.Box)
@_by_type.register(gs.MultiBinary)
@_by_type.register(Simplex)
def _(space: gs.Space, options: Mapping[str, Any]) -> Preprocessor:
    return NoPreprocessor(space, options)


@_by_type.register(gs.Tuple)
def _(space: gs.Tuple, options: Mapping[str, Any]) -> Preprocessor:
    return TupleFlatteningPreprocessor(space, options, build_preprocessor)


@_by_type.register(gs.Dict)
def _(space: gs.Dict, options: Mapping[str, Any]) -> Preprocessor:
    return DictFlatteningPreprocessor(space, options, build_preprocessor)


@_by_type.register(Repeated)
def _(space: Repeated, options: Mapping[str, Any]) -> Preprocessor:
    return RepeatedValuesPreprocessor(space, options, build_preprocessor)
