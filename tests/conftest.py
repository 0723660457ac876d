"""Shared pytest wiring: oracle cases are parametrised by what they contain, never by name."""

from __future__ import annotations

import gc
import os
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))

from cpu_log import measured  # noqa: E402
from oracle import case_names, load_case, oracle_dirs_text  # noqa: E402


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """The units of work of the default run's pytest-xdist workers (``--dist loadfile`` in
    pyproject.toml): each test file is one, so its module-scoped servers start once, and all
    of tests/conformance is one, so that its key-coverage check, which runs last there, sees
    every comparison (its registry is per process). Other ``--dist`` modes are xdist's own.
    The scheduler relies on xdist's private API, guarded (``xdist_units.py``)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist_units import files_and_conformance

    return files_and_conformance(config, log)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    """With RLSERVE_TEST_CPU_LOG set, each test's CPU (its worker's and its processes') is
    appended there (``cpu_log.py``)."""
    yield from measured(item.nodeid)


def pytest_collection_finish(session: pytest.Session) -> None:
    """What collecting imported (torch, the catalogue, hypothesis, the oracle's cases) lives
    as long as the worker: frozen out of the collector's way, and the first generation
    collected less often, so each pass is not over the whole run's heap. On export-heavy
    tests this took about a sixth off the worker's CPU (tests/conformance/test_export.py)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(10_000, *gc.get_threshold()[1:])


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--slow", action="store_true", default=False,
                     help="also run the tests marked slow, which the default run leaves out (RLSERVE_SLOW_TESTS=1 too)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The default run leaves out the tests marked ``slow`` (benchmark scripts at smoke size,
    the doc pages and ray-environment exports whose behaviour other tests cover, the fuzzers'
    extra seeds): ``--slow`` or ``RLSERVE_SLOW_TESTS=1`` runs them too, and so does a ``-m``
    expression (it says what runs) or naming a test file on the command line."""
    if config.getoption("--slow") or os.environ.get("RLSERVE_SLOW_TESTS") == "1" or config.option.markexpr:
        return
    named = {Path(arg.split("::")[0]).resolve() for arg in config.args if arg.split("::")[0].endswith(".py")}
    kept, slow = [], []
    for item in items:
        (slow if item.get_closest_marker("slow") and Path(item.path).resolve() not in named else kept).append(item)
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = kept


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "oracle_case_name" in metafunc.fixturenames:
        names = case_names()
        if not names:
            # An empty or missing folder must fail, not skip into green.
            names = [f"<no cases in {oracle_dirs_text()}>"]
        metafunc.parametrize("oracle_case_name", names)


@pytest.fixture
def oracle_case(oracle_case_name: str):
    if oracle_case_name.startswith("<no cases"):
        pytest.fail(f"no oracle cases found: set RLSERVE_ORACLE_DIR (looked in {oracle_dirs_text()})")
    return load_case(oracle_case_name)


@pytest.fixture
def redis_server(tmp_path_factory):
    """A real redis-server of its own for one test (the test fails without the binary, see tests/redis_server.py)."""
    from redis_server import running_redis

    with running_redis(tmp_path_factory.mktemp("redis")) as server:
        yield server

