"""The opt-in CPU log of the suite (tests/cpu_log.py): a line per test, summed by file and folder."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import cpu_log

TESTS = Path(__file__).resolve().parents[1]


def test_a_test_run_with_the_variable_writes_its_processes_cpu(tmp_path: Path) -> None:
    test = tmp_path / "test_spin.py"
    test.write_text(
        "import subprocess, sys\n"
        "def test_spins_in_a_child():\n"
        "    subprocess.run([sys.executable, '-c', 'x = sum(i * i for i in range(3_000_000))'], check=True)\n"
        "def test_idle():\n"
        "    pass\n"
    )
    (tmp_path / "conftest.py").write_text(
        f"import sys\nsys.path.insert(0, {str(TESTS)!r})\n"
        "import pytest\nfrom cpu_log import measured\n"
        "@pytest.hookimpl(hookwrapper=True)\n"
        "def pytest_runtest_protocol(item, nextitem):\n"
        "    yield from measured(item.nodeid)\n"
    )
    log = tmp_path / "cpu.log"
    env = {"RLSERVE_TEST_CPU_LOG": str(log), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                           "-o", "addopts=", str(test)], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    fields = [line.split("\t") for line in log.read_text().splitlines()]
    rows = {nodeid.split("::")[1]: (own, children) for nodeid, own, children in fields}
    assert set(rows) == {"test_spins_in_a_child", "test_idle"}
    assert float(rows["test_spins_in_a_child"][1]) > 0.05  # the child's CPU is counted
    assert float(rows["test_idle"][1]) == 0.0


def test_summary_sums_by_file_and_folder() -> None:
    lines = ["tests/e2e/test_a.py::t1\t1.00\t2.50\n", "tests/e2e/test_a.py::t2\t0.50\t0.00\n",
             "tests/unit/test_b.py::t\t0.25\t0.00\n"]
    by_file, by_folder = cpu_log.summarize(lines)
    assert by_file == {"tests/e2e/test_a.py": 4.0, "tests/unit/test_b.py": 0.25}
    assert by_folder == {"tests/e2e": 4.0, "tests/unit": 0.25}
