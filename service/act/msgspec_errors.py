"""msgspec's validation errors said as a 400 naming the field, what was expected and what was received.

msgspec says what was expected and where ("Expected `bool | null`, got `str` - at
`$.explore`") but not the value, and inside untyped values (observations) it names a
dict key only as "[...]". On this error path the body is parsed again, loosely (numbers
kept as text), to name the exact place and echo what was received.

Every JSON wire format explains its errors here: the act request
(``rlserve.service.act.wire``), a policy set's (``rlserve.service.multiagent.wire``) and the
Open Inference Protocol's (``unknown_field``). An unknown field is the caller's to describe
(it knows its own fields); ``explain`` says every other error.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rlserve.service.errors import BadRequest, summarize_received, without

# msgspec's names of the JSON types as Python decodes them ("got `str`").
JSON_TYPE_NAMES = {bool: "bool", str: "str", list: "array", dict: "object", float: "float"}


_AT = re.compile(r"^(?P<what>.*?) - at `\$(?P<path>.*)`$", re.S)
_SEGMENT = re.compile(r"\.([^.\[]+)|\[([0-9]+|\.\.\.)\]")
_WILD = object()  # msgspec's "[...]": some key of an object
_NO_VALUE = object()


class _Number(str):
    """A JSON number kept as its text (1e400 and 5000-digit integers stay describable)."""


def explain(message: str, body: bytes, *, schema: str, enums: Mapping[str, Sequence[str]] | None = None) -> BadRequest:
    """The 400 for a msgspec validation error other than an unknown field, naming the
    field, expected and received; ``schema`` is what the body should have been ("the act
    request schema"), ``enums`` the values of each top-level enum field (what an invalid
    one expected)."""
    match = _AT.match(message)
    if match is None:
        return BadRequest(f"invalid request: {message}", expected=f"a JSON object of {schema}", received=message)
    what, raw_path = match["what"], match["path"]
    segments = [int(i) if i.isdigit() else _WILD if i == "..." else key for key, i in _SEGMENT.findall(raw_path)]
    got = re.search(r", got `([^`]*)`", what)
    loose = _loose(body)
    # Under a "[...]" (msgspec elides the key of an object's entry) the entry named is the
    # first whose value is what msgspec saw: an unparseable number, or a value of its type.
    found = _locate(loose, segments, "", _culprit("out of range" in what, got[1] if got else None))
    if found is None and got is not None:
        found = _locate(loose, segments, "", _culprit(False, None))
    field, value = found if found is not None else (raw_path.lstrip("."), _NO_VALUE)
    received = _received(value) if value is not _NO_VALUE else (got[1] if got else what)
    what = without(what, value)  # msgspec quotes an invalid enum value whole
    return BadRequest(f"invalid request: {what} - at {field}", field=field,
                      expected=_expected(what, segments, enums or {}), received=received)


_UNKNOWN = re.compile(r"^Object contains unknown field `(?P<name>.*)`(?: - at `\$[^`]*`)?$", re.S)


def unknown_field(message: str) -> str | None:
    """The name in msgspec's "Object contains unknown field `...`" (backticks and all)."""
    match = _UNKNOWN.match(message)
    return None if match is None else match["name"]


def _expected(what: str, segments: list[Any], enums: Mapping[str, Sequence[str]]) -> Any:
    if what.startswith("Invalid enum value") and segments and segments[0] in enums:
        return list(enums[segments[0]])
    if "out of range" in what:
        return "a number that fits a 64-bit float (integers of at most 4300 digits)"
    expected = re.match(r"Expected `([^`]*)`(.*?)(?:, got `[^`]*`)?$", what, re.S)
    if expected:
        return (expected[1] + expected[2]).strip()
    return what


def _loose(body: bytes) -> Any:
    try:
        return json.loads(body, parse_float=_Number, parse_int=_Number, parse_constant=_Number)
    except Exception:  # noqa: BLE001 - unparseable here too: the error keeps msgspec's path
        return _NO_VALUE


def _culprit(out_of_range: bool, got: str | None) -> Callable[[Any], bool]:
    """Whether a value (as ``_loose`` parsed it) can be the one msgspec refused."""
    if out_of_range:
        return _unparseable
    if got is None or got not in _GOT_NAMES:
        return lambda value: True
    return lambda value: _json_type(value) == got


def _json_type(value: Any) -> str:
    """msgspec's name of a parsed JSON value's type (``got `...` ``)."""
    if isinstance(value, _Number):  # no NaN/Infinity here: msgspec refused those bytes before validating
        return "float" if any(c in value for c in ".eE") else "int"
    return "null" if value is None else JSON_TYPE_NAMES.get(type(value), "?")


_GOT_NAMES = {"float", "int", "bool", "str", "array", "object", "null"}


def _locate(value: Any, segments: list[Any], prefix: str, culprit: Callable[[Any], bool]) -> tuple[str, Any] | None:
    """(field path, value) at msgspec's path; a "[...]" is the key of the entry whose value
    is the ``culprit``."""
    if not segments:
        return (prefix, value) if culprit(value) else None
    head, rest = segments[0], segments[1:]
    if head is _WILD and isinstance(value, dict):
        for key, item in value.items():
            found = _locate(item, rest, f"{prefix}.{key}", culprit)
            if found is not None:
                return found
    elif isinstance(head, int) and isinstance(value, list) and head < len(value):
        return _locate(value[head], rest, f"{prefix}[{head}]", culprit)
    elif isinstance(head, str) and isinstance(value, dict) and head in value:
        return _locate(value[head], rest, f"{prefix}.{head}" if prefix else head, culprit)
    return None


def _unparseable(value: Any) -> bool:
    if not isinstance(value, _Number):
        return False
    try:
        return not math.isfinite(float(value)) if any(c in value for c in ".eE") else int(value) is None
    except ValueError:  # over Python's 4300-digit limit for integers
        return True


def _received(value: Any) -> Any:
    if isinstance(value, _Number):
        if len(value) > 40:
            return f"a number of {len(value)} characters"
        try:
            number = float(value) if any(c in value for c in ".eE") else int(value)
        except ValueError:
            return str(value)
        return number if math.isfinite(number) else str(value)
    return summarize_received(value)
