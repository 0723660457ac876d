"""What a client sent, said in its own terms (JSON's), for refusals.

numpy names what it could not make numbers of by dtype codes (``'U'``, ``'O'``,
``str672``); a client sent JSON. These helpers find the first element of a nested JSON
array that is no number and say what it is ("element 2 is the string 'nan'", "element
[1, 0] is null"), and find a non-JSON token (``NaN``, ``Infinity``) where a JSON decoder
stopped. Strings are repeated only when short (a long one is said by its length).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

_SHORT = 40  # characters of a client's string a message repeats
_CONSTANT = re.compile(rb"-?(NaN|nan|Infinity|infinity|inf|Inf)")


def describe(value: Any) -> str:
    """A JSON value in words: ``the string 'nan'``, ``null``, ``an object``, ``a list``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f"the string {value!r}" if len(value) <= _SHORT else f"a string of {len(value)} characters"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list | tuple):
        return f"a list of {len(value)} items"
    return f"{value!r}"


def leaves(data: Any) -> Iterator[tuple[list[int], Any]]:
    """(index path, value) of each leaf of nested lists (or tuples), in order."""
    stack: list[tuple[list[int], Any]] = [([], data)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, list | tuple):
            stack.extend((path + [i], item) for i, item in reversed(list(enumerate(value))))
        else:
            yield path, value


def first_non_number(data: Any) -> tuple[list[int], Any] | None:
    """(index path, value) of the first leaf of nested lists that is not a JSON number
    (booleans count as numbers, as numpy takes them), or None when every leaf is one."""
    return next(((path, value) for path, value in leaves(data) if not isinstance(value, bool | int | float)), None)


def not_numbers(data: Any, shape: list[int] | None = None) -> str:
    """Why nested lists are no array of finite numbers (of ``shape``): the first element
    that is no number, else the lists' lengths differ (a ragged array)."""
    found = first_non_number(data)
    if found is None:
        of = "" if shape is None else f" of shape {shape}"
        return f"expected finite numbers in nested lists{of}; the lists' lengths differ (a ragged array)"
    path, value = found
    where = f"element {path[0]}" if len(path) == 1 else f"element {path}" if path else "the value"
    return f"expected finite numbers; {where} is {describe(value)}"


def non_finite_token(message: str, body: bytes) -> str | None:
    """The ``NaN``/``Infinity`` token a JSON decoder stopped at (its message names the
    byte, as msgspec's ``... (byte 17)``), or None when it stopped at something else."""
    at = re.search(r"byte (\d+)", message)
    if at is None:
        return None
    start = int(at[1])
    for offset in (start - 1, start):  # the sign before where it stopped, if any
        match = _CONSTANT.match(body, max(offset, 0))
        if match is not None:
            return match[0].decode()
    return None
