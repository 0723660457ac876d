"""Shared pytest wiring: oracle cases are parametrised by what they contain, never by name."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from oracle import case_names, load_case, oracle_dirs_text  # noqa: E402


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
