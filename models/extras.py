"""The optional extras an rlserve command needs, and whether they are installed (torch-free).

Looked up, not imported (importing torch takes seconds), so a command that cannot work
says so in one line at once, naming the extra to install, rather than failing halfway
with an import error: ``rlserve serve`` (``service/startup.py``) and ``rlserve export``.
"""

from __future__ import annotations

import importlib.util

TORCH_EXTRA = ("torch", "onnx", "onnxscript")  # what exporting imports ([torch])
EXPERIENCE_EXTRA = ("pyarrow", "msgpack")  # what the experience log writes with ([experience])


def missing(modules: tuple[str, ...]) -> list[str]:
    """The modules of ``modules`` that cannot be imported."""
    return [name for name in modules if not _findable(name)]


def _findable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a finder that refuses it, a module without a spec
        return False
