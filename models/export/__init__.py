"""Policy bundles: export (torch) and load/verify (torch-free).

Importing this package never imports torch: ``export_bundle`` is resolved lazily, so the
server can use ``load_bundle``/``verify_reference`` on an image without torch.
"""

from __future__ import annotations

from typing import Any

from rlserve.models.export.bundle import (
    Bundle,
    BundleError,
    Manifest,
    load_bundle,
    pack_bundle,
    unpack_bundle,
    verify_reference,
)

__all__ = [
    "Bundle",
    "BundleError",
    "Manifest",
    "export_bundle",
    "load_bundle",
    "pack_bundle",
    "unpack_bundle",
    "verify_reference",
]


def __getattr__(name: str) -> Any:
    if name == "export_bundle":
        from rlserve.models.export.exporter import export_bundle

        return export_bundle
    raise AttributeError(f"module 'rlserve.models.export' has no attribute {name!r}")
