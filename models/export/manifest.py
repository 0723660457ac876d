"""A bundle's ``manifest.json`` as typed read access (torch-free).

``Manifest`` wraps the JSON object ``load_bundle`` read and checked (``bundle.py``); its
properties are what the server and ``inspect`` read: spaces, model config, action
distribution, preprocessor, filter, a new-stack module's connectors, signature, settings,
files, runtimes and the reference check.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlserve.models.interface import ModelSignature
from rlserve.models.spaces import space_from_json

__all__ = ["Manifest", "RuntimeInfo"]


@dataclass(frozen=True)
class RuntimeInfo:
    """One runtime file: ``kind`` is 'onnx' or 'torchscript'; ``info`` its versions/options."""

    kind: str
    file: str
    info: dict[str, Any]


@dataclass(frozen=True)
class Manifest:
    """Typed read access to ``manifest.json``; ``data`` is the JSON object as loaded."""

    data: dict[str, Any]

    def __getitem__(self, key: str) -> Any:
        return self.data[key]

    @property
    def name(self) -> str:
        return self.data["name"]

    @property
    def version(self) -> str:
        return self.data["version"]

    @property
    def format_version(self) -> int:
        return self.data["format_version"]

    @property
    def created_at(self) -> str:
        return self.data["created_at"]

    @property
    def observation_space(self):  # -> gymnasium.Space

        return space_from_json(self.data["observation_space"])

    @property
    def action_space(self):  # -> gymnasium.Space

        return space_from_json(self.data["action_space"])

    @property
    def model_config(self) -> dict[str, Any]:
        return self.data["model_config"]

    @property
    def action_dist(self) -> dict[str, Any]:
        """The action distribution spec JSON (``ActionDistSpec.from_json`` reads it)."""
        return self.data["action_dist"]

    @property
    def num_outputs(self) -> int:
        return self.data["num_outputs"]

    @property
    def preprocessor(self) -> dict[str, Any]:
        return self.data["preprocessor"]

    @property
    def filter(self) -> dict[str, Any] | None:
        """Frozen observation-filter state JSON, or ``None`` when no filter is applied."""
        return self.data.get("filter")

    @property
    def signature(self) -> ModelSignature:
        return ModelSignature.from_json(self.data["signature"])

    @property
    def input_names(self) -> list[str]:
        return list(self.data["signature"]["input_names"])

    @property
    def output_names(self) -> list[str]:
        return list(self.data["signature"]["output_names"])

    @property
    def explore(self) -> bool:
        return self.data["explore"]

    @property
    def normalize_actions(self) -> bool:
        """RLlib's ``normalize_actions``: by default, unsquash Box actions from the model's
        [-1, 1] to the space's bounds before the environment sees them (False in bundles
        written before the field existed)."""
        return bool(self.data.get("normalize_actions", False))

    @property
    def clip_actions(self) -> bool:
        """RLlib's ``clip_actions``: by default, clip Box actions to the bounds (RLlib applies
        it only when ``normalize_actions`` is off; unsquashing already clips)."""
        return bool(self.data.get("clip_actions", False))

    @property
    def source(self) -> dict[str, Any] | None:
        """Where the policy came from (e.g. an RLlib checkpoint's policy id), if recorded."""
        return self.data.get("source")

    @property
    def connectors(self) -> dict[str, Any] | None:
        """A new-stack module's connector layout (server and graph stages), or None."""
        return self.data.get("connectors")

    @property
    def files(self) -> dict[str, dict[str, Any]]:
        return self.data["files"]

    @property
    def runtimes(self) -> dict[str, RuntimeInfo]:
        return {k: RuntimeInfo(k, v["file"], v) for k, v in self.data["runtimes"].items()}

    @property
    def reference(self) -> dict[str, Any]:
        return self.data["reference"]
