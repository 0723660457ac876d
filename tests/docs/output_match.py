"""Does what a block printed match the ```output block the docs show under it?

- JSON (one or more JSON documents, as curl prints answers, one after the other): compared
  as data. Objects must have exactly the documented keys (a renamed field fails), lists the
  documented length, strings and booleans the documented value. A number matches to the
  precision it is written with: ``-0.6957`` accepts anything within one unit of its last
  digit (so the docs may round, and ONNX Runtime's last bits may differ between CPUs);
  an integer literal must be that integer. ``"..."`` as a value matches any value, as a
  key (``"...": "..."``) lets the object have more keys, as a list's last item lets the
  list go on.
- Anything else: doctest's comparison with ELLIPSIS (``...`` matches any text), after
  trailing blanks are dropped from every line.
"""

from __future__ import annotations

import doctest
import json
from decimal import Decimal
from typing import Any

ANY = "..."


class _Literal(float):
    """A documented number that remembers how it was written (its precision)."""

    text: str

    def __new__(cls, text: str) -> _Literal:
        value = super().__new__(cls, float(text))
        value.text = text
        return value


def mismatch(expected: str, actual: str) -> str | None:
    """None when ``actual`` matches ``expected``; else what differs, in a sentence."""
    want_docs = json_documents(expected, documented=True)
    if want_docs is not None:
        got_docs = json_documents(actual)
        if got_docs is None:
            return f"expected JSON, got: {actual[-500:]!r}"
        if len(got_docs) != len(want_docs):
            return f"expected {len(want_docs)} JSON document(s), got {len(got_docs)}: {actual[-500:]!r}"
        for i, (want, got) in enumerate(zip(want_docs, got_docs, strict=True)):
            why = _compare(want, got, f"[{i}]" if len(want_docs) > 1 else "")
            if why:
                return why
        return None
    want, got = _tidy(expected), _tidy(actual)
    if doctest.OutputChecker().check_output(want, got, doctest.ELLIPSIS):
        return None
    return f"printed text differs:\n--- documented\n{want}--- printed\n{got}"


def _tidy(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.strip("\n").splitlines()) + "\n"


def json_documents(text: str, documented: bool = False) -> list[Any] | None:
    """The JSON documents ``text`` holds one after the other (curl prints answers without a
    newline, so several may share a line), or None when it holds anything else."""
    hooks = {"parse_float": _Literal, "parse_int": int} if documented else {}
    decoder = json.JSONDecoder(**hooks)  # type: ignore[arg-type]
    documents, position, text = [], 0, text.strip()
    while position < len(text):
        try:
            document, position = decoder.raw_decode(text, position)
        except ValueError:
            return None
        documents.append(document)
        while position < len(text) and text[position].isspace():
            position += 1
    return documents or None


def _compare(want: Any, got: Any, path: str) -> str | None:
    where = path or "the answer"
    if want == ANY:
        return None
    if isinstance(want, dict):
        return _compare_objects(want, got, path)
    if isinstance(want, list):
        return _compare_lists(want, got, path)
    if isinstance(want, bool) or want is None or isinstance(want, str):
        ok = got == want and type(got) is type(want)
        return None if ok else f"{where}: documented {want!r}, got {got!r}"
    if isinstance(got, bool) or not isinstance(got, int | float):
        return f"{where}: documented the number {want!r}, got {got!r}"
    if isinstance(want, _Literal):
        tolerance = float(Decimal(1).scaleb(Decimal(want.text).as_tuple().exponent))  # one unit of the last digit
        ok = abs(got - want) <= tolerance * (1 + 1e-9)
        return None if ok else f"{where}: documented {want.text}, got {got!r}"
    ok = isinstance(got, int) and got == want
    return None if ok else f"{where}: documented {want!r}, got {got!r}"


def _compare_objects(want: dict, got: Any, path: str) -> str | None:
    if not isinstance(got, dict):
        return f"{path or 'the answer'}: documented an object, got {got!r}"
    open_ended = want.get(ANY) == ANY
    keys = set(want) - {ANY}
    missing, extra = keys - set(got), set(got) - keys
    if missing or (extra and not open_ended):
        return (f"{path or 'the answer'}: keys differ from the documented ones "
                f"(missing {sorted(missing)}, not documented {sorted(extra)}): {json.dumps(got)[:500]}")
    for key in sorted(keys):
        why = _compare(want[key], got[key], f"{path}.{key}" if path else key)
        if why:
            return why
    return None


def _compare_lists(want: list, got: Any, path: str) -> str | None:
    if not isinstance(got, list):
        return f"{path or 'the answer'}: documented a list, got {got!r}"
    open_ended = bool(want) and want[-1] == ANY
    items = want[:-1] if open_ended else want
    if len(got) < len(items) or (len(got) != len(items) and not open_ended):
        return f"{path or 'the answer'}: documented {len(items)} items, got {len(got)}: {got!r}"
    for i, item in enumerate(items):
        why = _compare(item, got[i], f"{path}[{i}]")
        if why:
            return why
    return None
