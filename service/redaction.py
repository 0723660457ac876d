"""The last guard before an error leaves the server: no absolute path of the server in it.

Errors are meant to name paths as the client gave them (relative to the repository) or
an upload's member names, and their sources do. This catches what a source missed (a
library's message quoting a full path): the repository's directory becomes a relative
path, an unpacked archive's directory disappears (its files keep their names), an upload's
temporary file is "the uploaded archive", and any other path under the temporary
directory, the installed package or the Python environment is replaced by a placeholder
(``<temp>``, ``<package>``, ``<python>``).
"""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path
from typing import Any

from rlserve.service.errors import ServiceError


def _spellings(folder: Path) -> list[str]:
    """The folder as given and with symlinks resolved (``/tmp`` may be ``/private/tmp``)."""
    names = {str(folder).rstrip("/"), str(folder.resolve()).rstrip("/")}
    return sorted((n for n in names if n), key=len, reverse=True)


class PathRedactor:
    """Rewrites the text of a ``ServiceError`` (message, expected, received) in place."""

    def __init__(self, repository: Path, package: Path, temp: Path | None = None, python: Path | None = None):
        temp = Path(tempfile.gettempdir()) if temp is None else temp
        python = Path(sys.prefix) if python is None else python
        rules: list[tuple[str, str]] = []
        for tmp in _spellings(temp):
            t = re.escape(tmp)
            rules += [(rf"{t}/rlsb-[^/\s'\"]+/", ""), (rf"{t}/rlsb-[^/\s'\"]+", "the unpacked bundle"),
                      (rf"{t}/upload-[^/\s'\"]+", "the uploaded archive")]
        # Longest first, so a repository inside the package (the embedded defaults) or under
        # the temporary directory (tests) is rewritten as the repository.
        folders = [(name, "repository") for name in _spellings(repository)]
        folders += [(name, "package") for name in _spellings(package)]
        folders += [(name, "temp") for name in _spellings(temp)]
        folders += [(name, "python") for name in _spellings(python) if name != "/"]
        for name, kind in sorted(folders, key=lambda pair: len(pair[0]), reverse=True):
            n = re.escape(name)
            if kind == "repository":
                rules += [(rf"{n}/", ""), (rf"{n}(?![\w.-])", "the model repository")]
            else:
                rules += [(rf"{n}(?:/[^\s'\"]*)?(?![\w.-])", f"<{kind}>")]
        self._rules = [(re.compile(pattern), replacement) for pattern, replacement in rules]

    def text(self, value: str) -> str:
        for pattern, replacement in self._rules:
            value = pattern.sub(replacement, value)
        return value

    def value(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, list | tuple):
            return [self.value(v) for v in value]
        if isinstance(value, dict):
            return {k: self.value(v) for k, v in value.items()}
        return value

    def __call__(self, exc: ServiceError) -> ServiceError:
        exc.message = self.text(exc.message)
        exc.expected = self.value(exc.expected)
        exc.received = self.value(exc.received)
        return exc
