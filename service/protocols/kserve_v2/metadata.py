"""Health and metadata answers of the protocol (framework-free; the router serves them)."""

from __future__ import annotations

from importlib import metadata as package_metadata

from rlserve.service.protocols.kserve_v2.layout import layout_of
from rlserve.service.protocols.kserve_v2.wire import (
    ModelMetadataResponse,
    ModelReadyResponse,
    ServerMetadataResponse,
)
from rlserve.service.serving.registry import ModelRegistry

SERVER_NAME = "rlserve"
# binary_tensor_data and sequence are Triton's extensions; "sequence(string_id)" says that
# sequence_id may also be a string.
EXTENSIONS = ["binary_tensor_data", "sequence", "sequence(string_id)"]


def _version() -> str:
    try:
        return package_metadata.version("rlserve")
    except package_metadata.PackageNotFoundError:  # run from a checkout without installing
        return "0.0.0"


def server_ready(registry: ModelRegistry, stopping: bool) -> bool:
    """Ready: at least one model loaded, and not draining or shutting down (as /readyz)."""
    return bool(registry.entries) and not stopping


def server_metadata() -> ServerMetadataResponse:
    return ServerMetadataResponse(name=SERVER_NAME, version=_version(), extensions=list(EXTENSIONS))


def model_metadata(registry: ModelRegistry, name: str, version: str | None) -> ModelMetadataResponse:
    """The tensors of a version (the current one unless given); 404 for an unknown model
    or version, 400 when its spaces have no tensor form."""
    entry = registry.entry(name)
    policy = entry.policy(version)
    inputs, outputs, extras = layout_of(policy).metadata()
    return ModelMetadataResponse(
        name=policy.name,
        versions=list(entry.versions),
        platform=f"rlserve_{policy.runtime.kind}",
        inputs=inputs,
        outputs=outputs,
        parameters={"version": policy.version, **extras},
    )


def model_ready(registry: ModelRegistry, name: str, version: str | None) -> ModelReadyResponse:
    """Whether the version serves (its batcher runs); 404 for an unknown model or version."""
    policy = registry.entry(name).policy(version)
    return ModelReadyResponse(name=policy.name, ready=policy.batcher is not None)
