"""The OpenAPI document tells the truth about the API, as schemathesis (a fuzzer nobody here
wrote) checks it against a real ``rlserve serve``.

Every operation of the live document is run through schemathesis' examples, coverage,
fuzzing and stateful phases with all of its checks: no 5xx, every status answered is
documented for its operation, every body matches its documented schema, schema-valid
requests are accepted and schema-invalid ones refused, undeclared methods answer 405 with
``Allow``, admin routes refuse missing credentials. ``tests/e2e/schemathesis.toml`` holds what
the run needs to know beyond the document (why 410/422 can answer a schema-valid request,
the embedded models' names so requests reach them; ``schemathesis_hooks.py`` the act rules
JSON Schema cannot state). Each run draws ``SEEDS`` random seeds, one server and one
schemathesis run each, bounded by a number of examples: every run explores elsewhere, and
a failure names its seed in the test's id (``[seed=N]``); ``SCHEMATHESIS_SEEDS=N,M`` runs
those seeds again. The examples and coverage phases draw their cases from the document
itself (about half the time of a run); they run with the first seed, the fuzzing and
stateful phases with every seed. The default run has the first seed; the others are marked
``slow`` (``--slow`` runs them, see tests/conftest.py).
"""

from __future__ import annotations

import os
import random
import re
import subprocess
import sys

import pytest
from plain_http import HTTP

from tests.e2e.server_process import REPO, running_server

pytestmark = pytest.mark.e2e

TOKEN = "schemathesis-admin-token"
CONFIG = REPO / "tests" / "e2e" / "schemathesis.toml"
SEEDS = 3
MAX_EXAMPLES = 12  # per seed
TIMEOUT_S = 300  # a hang fails the test instead of blocking the suite
ALL_PHASES = "examples,coverage,fuzzing,stateful"
RANDOM_PHASES = "fuzzing,stateful"  # what a seed changes


def _seeds() -> list[int]:
    """``SCHEMATHESIS_SEEDS`` (comma-separated) to replay a run, else ``SEEDS`` new ones."""
    chosen = os.environ.get("SCHEMATHESIS_SEEDS")
    if chosen:
        return [int(seed) for seed in chosen.split(",")]
    # pytest-xdist's workers each collect the tests and must draw the same ids: they share
    # the run's random uid (uuid4), so the seeds come from it there and are as random.
    run_uid = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    draw = random.Random(run_uid) if run_uid else random.SystemRandom()
    return [draw.randrange(1 << 31) for _ in range(SEEDS)]


def _operations(spec: dict) -> int:
    methods = {"get", "put", "post", "delete", "patch", "head", "options", "trace"}
    return sum(1 for item in spec["paths"].values() for method in item if method in methods)


def _observations(metrics: str, model: str) -> float:
    match = re.search(rf'^rlserve_observations_total{{model="{re.escape(model)}"}} (\S+)$', metrics, re.M)
    return float(match[1]) if match else 0.0


@pytest.mark.parametrize(("seed", "phases"), [pytest.param(seed, ALL_PHASES, marks=()) if i == 0 else
                                              pytest.param(seed, RANDOM_PHASES, marks=pytest.mark.slow)
                                              for i, seed in enumerate(_seeds())],
                         ids=lambda value: f"seed={value}" if isinstance(value, int) else value.replace(",", "+"))
def test_schemathesis_finds_no_server_error_and_no_conformance_failure(seed: int, phases: str) -> None:
    print(f"schemathesis seed {seed}, phases {phases} (SCHEMATHESIS_SEEDS={seed} replays it)")
    with running_server(env={"RLSERVE_ADMIN_TOKEN": TOKEN}) as url:
        operations = _operations(HTTP.get(f"{url}/openapi.json", timeout=10).json())
        command = [sys.executable, "-m", "schemathesis.cli", "--config-file", str(CONFIG), "run",
                   f"{url}/openapi.json", "--checks", "all", "--header", f"Authorization: Bearer {TOKEN}",
                   "--max-examples", str(MAX_EXAMPLES), "--seed", str(seed), "--phases", phases, "--workers", "1",
                   "--no-color"]
        run = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT_S)
        metrics = HTTP.get(f"{url}/metrics", timeout=10).text
    output = run.stdout + run.stderr
    assert run.returncode == 0, (f"schemathesis found problems with seed {seed} (exit {run.returncode}; "
                                 f"SCHEMATHESIS_SEEDS={seed} replays it):\n{output[-20000:]}")
    # Every operation of the document was exercised, none skipped or left out.
    assert f"Selected: {operations}/{operations}" in output and f"Tested: {operations}\n" in output, output[-5000:]
    # The run reached the models themselves (not only 404s for made-up names): the act
    # examples of the document were answered with actions.
    assert "examples" not in phases or _observations(metrics, "cartpole") > 0, metrics
