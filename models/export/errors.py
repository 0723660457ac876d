"""The one error type bundle loading raises (torch-free)."""

from __future__ import annotations


class BundleError(ValueError):
    """A bundle is malformed, tampered with, unsafe, or disagrees with its reference."""
