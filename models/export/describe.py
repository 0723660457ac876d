"""What a bundle records about the action distribution and the preprocessor (torch-free).

The server rebuilds both from the manifest's spaces and model config; these descriptions
let it check that it got the same thing the exporter saw (same class, same output shape).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rlserve.models.distributions import get_action_dist
from rlserve.models.export.errors import BundleError
from rlserve.models.preprocessors import get_preprocessor as build_preprocessor

PREPROCESSOR_OPTIONS = ("dim", "grayscale", "zero_mean")
# Constructor arguments an RLlib dist_type accepts beyond the catalog's own (SAC-style bounds).
_EXPLICIT_KWARGS = ("low", "high")


def describe_action_dist(
    action_space: Any, model_config: Mapping[str, Any], rllib_dist: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The action-distribution spec JSON (``ActionDistSpec.from_json`` reads it).

    Without ``rllib_dist`` this is the catalog's choice for the action space. With it
    (RLlib's ``{"class": "TorchSquashedGaussian", "kwargs": {...}}``, as a fixture's
    case.json records it), the named class is used, as RLlib's ``dist_type`` would: that is
    how SAC/DDPG policies get SquashedGaussian/Deterministic on a Box action space.
    """
    config = dict(model_config)
    spec = get_action_dist(action_space, config)
    if rllib_dist is not None and "num_outputs" in rllib_dist:
        return dict(rllib_dist)  # already our spec JSON
    same_class = rllib_dist is not None and spec.dist_class.rllib_name == rllib_dist.get("class")
    if rllib_dist is not None and (config.get("q_model") is not None or same_class):
        # A Q-policy serves its own (epsilon-)greedy rule over the Q-values, whatever class
        # RLlib paired with them; a custom dist recorded by its RLlib class name is the same.
        return dict(spec.to_json())
    if rllib_dist is not None and rllib_dist.get("class") != spec.name:
        kwargs = rllib_dist.get("kwargs") or {}
        extra = {k: kwargs[k] for k in _EXPLICIT_KWARGS if k in kwargs}
        spec = get_action_dist(action_space, config, dist_type=str(rllib_dist["class"]), dist_kwargs=extra)
    return dict(spec.to_json())


def describe_preprocessor(obs_space: Any, model_config: Mapping[str, Any]) -> dict[str, Any]:
    """Class name, output shape/dtype, image options and leaf layout of the preprocessor."""
    prep = get_preprocessor(obs_space, model_config)
    return {
        "class": prep.name,
        "output_shape": [int(d) for d in prep.output_shape],
        "output_dtype": str(prep.output_dtype),
        "size": int(prep.size),
        "options": {k: prep.options.get(k) for k in PREPROCESSOR_OPTIONS},
        "layout": prep.layout,
    }


def get_preprocessor(obs_space: Any, model_config: Mapping[str, Any]) -> Any:
    return build_preprocessor(obs_space, dict(model_config))


def check_preprocessor(manifest_preprocessor: Mapping[str, Any], prep: Any) -> None:
    """Raise ``BundleError`` unless ``prep`` (rebuilt by the server from the manifest's
    observation space and model config) is the preprocessor the exporter recorded."""
    recorded = dict(manifest_preprocessor)
    rebuilt = {
        "class": prep.name,
        "output_shape": [int(d) for d in prep.output_shape],
        "output_dtype": str(prep.output_dtype),
        "options": {k: prep.options.get(k) for k in PREPROCESSOR_OPTIONS},
    }
    for key, value in rebuilt.items():
        if key in recorded and recorded[key] != value:
            raise BundleError(
                f"preprocessor.{key}: the bundle was exported with {recorded[key]!r}, but this "
                f"server builds {value!r} from the same spaces and config (different rlserve version?)"
            )
