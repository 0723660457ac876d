"""What a bundle records about the action distribution and the preprocessor (torch-free).

The server rebuilds both from the manifest's spaces and model config; these descriptions
let it check that it got the same thing the exporter saw (same class, same output shape).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

PREPROCESSOR_OPTIONS = ("dim", "grayscale", "zero_mean")


def describe_action_dist(action_space: Any, model_config: Mapping[str, Any]) -> dict[str, Any]:
    """The catalog's action-distribution spec as JSON (``ActionDistSpec.from_json`` reads it)."""
    from models.distributions import get_action_dist

    return dict(get_action_dist(action_space, dict(model_config)).to_json())


def describe_preprocessor(obs_space: Any, model_config: Mapping[str, Any]) -> dict[str, Any]:
    """Class name, output shape/dtype and image options of the catalog's preprocessor."""
    from models.preprocessors import get_preprocessor

    prep = get_preprocessor(obs_space, dict(model_config))
    return {
        "class": type(prep).__name__,
        "output_shape": [int(d) for d in prep.shape],
        "output_dtype": str(getattr(prep, "dtype", "float32")),
        "options": {k: model_config.get(k) for k in PREPROCESSOR_OPTIONS},
    }
