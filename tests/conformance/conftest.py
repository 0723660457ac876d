"""Run bookkeeping for the key-coverage check in ``test_coverage.py``.

The coverage check must run after every other conformance test and may assert only when
the whole folder ran: a ``-k``/``--deselect``/``--lf`` selection, a node id or a single
file on the command line, or failures earlier in the run make its registry incomplete for
reasons that are not coverage gaps. These hooks record what it needs to tell.
"""

from __future__ import annotations

from pathlib import Path

import pytest

CONFORMANCE_DIR = Path(__file__).resolve().parent
FINAL_TEST = "test_every_key_and_field_was_compared"

_DESELECTED = pytest.StashKey[list[str]]()
_COLLECTED = pytest.StashKey[list[pytest.Item]]()
# A report carries no config to stash on; one pytest process runs one session.
_failed_nodeids: list[str] = []
_ran_nodeids: set[str] = set()


def _in_folder(item: pytest.Item) -> bool:
    return Path(item.path).resolve().is_relative_to(CONFORMANCE_DIR)


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_DESELECTED] = []
    config.stash[_COLLECTED] = []
    _failed_nodeids.clear()
    _ran_nodeids.clear()


def pytest_deselected(items: list[pytest.Item]) -> None:
    for item in items:
        if _in_folder(item):
            item.config.stash.setdefault(_DESELECTED, []).append(item.nodeid)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Whatever order plugins left, the coverage check goes last.
    final = [i for i in items if getattr(i, "originalname", i.name) == FINAL_TEST and _in_folder(i)]
    if final:
        rest = [i for i in items if i not in final]
        items[:] = rest + final
    # The gpu tests compare nothing without CUDA (they skip), and where CUDA is, the gpu check
    # runs only them, never the whole folder.
    config.stash[_COLLECTED] = [i for i in items
                                if _in_folder(i) and i not in final and not i.get_closest_marker("gpu")]


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if not Path(report.fspath).resolve().is_relative_to(CONFORMANCE_DIR):
        return
    if report.when == "setup":
        _ran_nodeids.add(report.nodeid)
    if report.failed:
        _failed_nodeids.append(report.nodeid)


def _whole_folder_requested(config: pytest.Config) -> bool:
    """True when some collection argument is this folder or a folder above it."""
    base = Path(config.invocation_params.dir)
    for arg in config.args:
        path_part, _, node_part = str(arg).partition("::")
        path = (base / path_part).resolve()
        if not node_part and path.is_dir() and CONFORMANCE_DIR.is_relative_to(path):
            return True
    return False


def incomplete_run_reason(config: pytest.Config) -> str | None:
    """Why this run cannot judge coverage (None when the whole folder ran cleanly so far)."""
    if hasattr(config, "workerinput"):
        # The registry is per process: under pytest-xdist it is whole only where one worker
        # ran the whole folder (tests/conftest.py makes the folder one unit of work under ``--dist loadfile``).
        elsewhere = [i.nodeid for i in config.stash.get(_COLLECTED, []) if i.nodeid not in _ran_nodeids]
        if elsewhere:
            return f"{len(elsewhere)} conformance tests ran in other xdist workers (e.g. {elsewhere[0]})"
    if not _whole_folder_requested(config):
        return f"only part of {CONFORMANCE_DIR} was selected on the command line"
    deselected = config.stash.get(_DESELECTED, [])
    if deselected:
        return f"{len(deselected)} conformance tests were deselected (e.g. {deselected[0]})"
    failed = [n for n in _failed_nodeids if FINAL_TEST not in n]
    if failed:
        return f"{len(failed)} conformance tests failed (e.g. {failed[0]}); fix them first"
    return None


@pytest.fixture
def conformance_run(request: pytest.FixtureRequest) -> str | None:
    return incomplete_run_reason(request.config)
