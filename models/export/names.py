"""The rule for a served model's name and version (torch-free).

A model is addressed as ``/v1/models/{name}/versions/{version}`` (and the Open Inference
Protocol's ``/v2/models/...``): a name or version holding ``/``, a NUL, nothing at all, or
``..`` could be loaded but never reached or unloaded again. An uploaded bundle is also
stored in a shared repository as ``<name>/<version>.rlsb``. So both follow the rule of a
bundle's plain file names (``archive.check_plain_name``): 1 to 128 letters, digits, ``.``,
``_`` or ``-``, not starting with ``.`` or ``-``. A policy set's member is served as
``<set>.<policy id>``, a name of up to 193 characters (``SERVED_NAME`` allows 256).
"""

from __future__ import annotations

import re

from rlserve.models.export.archive import PLAIN_NAME
from rlserve.models.export.errors import BundleError

NAME_RULE = "1 to 128 letters, digits, '.', '_' or '-', not starting with '.' or '-'"
_NAME = PLAIN_NAME  # a bundle's plain file name
# What the server can register at all: the same characters, as long as a route may quote.
SERVED_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,255}$")


def name_problem(value: object, pattern: re.Pattern[str] = _NAME) -> str | None:
    """What ``value`` is when it cannot be a model name or version (for a message: ``the
    name is ...``), or None when it can."""
    if not isinstance(value, str):
        return f"a {type(value).__name__}, not a string"
    if pattern.fullmatch(value):
        return None
    return "empty" if not value else _show(value)


def check_name(value: object, field: str, where: str) -> str:
    """``value`` when it is a valid name or version, else a ``BundleError`` naming
    ``field`` (``name``, ``version``) of ``where`` (e.g. ``manifest.json``)."""
    problem = name_problem(value)
    if problem is None:
        assert isinstance(value, str)
        return value
    raise BundleError(f"{where}: field {field!r} is {problem}: a model's {field} must be {NAME_RULE}, so that "
                      "/v1/models/{name}/versions/{version} can reach and unload it",
                      field=field, expected=NAME_RULE, received=value)


def _show(value: str, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else f"<str of {len(value)} characters>"
