"""``ConfigError``: an invalid model config, said by key, expected and received.

Its own module so that ``config.py`` (the model config) and ``q_config.py`` (its
``q_model`` block, which ``config.py`` validates) both raise it without importing each other.
"""

from __future__ import annotations

from typing import Any


class ConfigError(ValueError):
    """An invalid model config; the message names the key, expected and received."""

    def __init__(self, key: str, expected: str, received: Any, hint: str = "", received_text: str | None = None):
        self.key = key
        self.expected = expected
        self.received = received
        got = received_text if received_text is not None else _describe(received)
        message = f"model config '{key}': expected {expected}, got {got}"
        super().__init__(message + (f". {hint}" if hint else ""))


def _describe(value: Any) -> str:
    text = repr(value)
    if len(text) > 80:
        text = text[:77] + "..."
    return f"{type(value).__name__} {text}"
