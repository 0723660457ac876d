"""The default run's units of work under pytest-xdist (``--dist loadfile``, tests/conftest.py).

Each test file is one unit, and tests/conformance as a whole is one. The scheduler is
xdist's ``LoadFileScheduling`` with its private ``_split_scope`` (how xdist names a test's
unit of work) overridden; xdist has no public way to merge files into one unit (its
``xdist_group`` mark sets the private ``Item._nodeid``, which pytest 9 no longer reads).
It was checked against pytest-xdist 3.5-3.8, the range pyproject.toml declares
(tests/unit/test_xdist_internals.py fails outside it). Where xdist no longer has the method,
or no longer calls it, the run stops saying so, rather than quietly spreading a file's tests,
and the conformance folder, over both workers.
"""

from __future__ import annotations

import inspect

import pytest

XDIST_CHECKED = "3.5-3.8"


def files_and_conformance(config: pytest.Config, log: object) -> object:
    from xdist.scheduler import LoadFileScheduling

    problem = xdist_scope_problem()
    if problem is not None:
        raise pytest.UsageError(f"tests/xdist_units.py's scheduler was checked against pytest-xdist {XDIST_CHECKED}: "
                                f"{problem}. Re-check it against the installed xdist, or run with -n 0")

    class FilesAndConformance(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            scope = super()._split_scope(nodeid)
            return "tests/conformance" if scope.startswith("tests/conformance/") else scope

    return FilesAndConformance(config, log)


def xdist_scope_problem() -> str | None:
    """What of xdist's private scope API the scheduler relies on is missing, or None."""
    from xdist.scheduler import LoadFileScheduling
    from xdist.scheduler.loadscope import LoadScopeScheduling

    split = getattr(LoadFileScheduling, "_split_scope", None)
    if not callable(split):
        return "LoadFileScheduling has no _split_scope"
    if "self._split_scope(" not in inspect.getsource(LoadScopeScheduling):
        return "LoadScopeScheduling no longer calls self._split_scope to name a test's unit of work"
    if split(None, "tests/a/test_b.py::test_c[1]") != "tests/a/test_b.py":
        return "LoadFileScheduling._split_scope no longer names a test's file"
    return None
