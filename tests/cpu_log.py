"""Where the suite's CPU goes, test by test (opt-in: ``RLSERVE_TEST_CPU_LOG=PATH``).

On a 2-core machine the suite is bound by CPU, not by waiting: the sum of every process's CPU
time, divided by two, is about the run's length. A test's JUnit time says little about its
cost (it waits on servers while others run), so with ``RLSERVE_TEST_CPU_LOG`` set each test
appends one line to that file: its node id, the CPU seconds its worker process spent on it,
and the CPU seconds of the processes it started and reaped meanwhile (servers, command-line
runs, doc pages: a module's server counts at the module's last test, when it is stopped).
``python tests/cpu_log.py PATH`` sums the lines by file and by folder.
"""

from __future__ import annotations

import os
import resource
import sys
from collections import defaultdict
from collections.abc import Generator, Iterable
from typing import Any

ENV = "RLSERVE_TEST_CPU_LOG"


def _cpu() -> tuple[float, float]:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


def measured(nodeid: str) -> Generator[None, Any, None]:
    """The body of a ``pytest_runtest_protocol`` hook wrapper: a line per test when enabled."""
    path = os.environ.get(ENV)
    before = _cpu() if path else None
    yield
    if path and before is not None:
        after = _cpu()
        with open(path, "a", encoding="utf-8") as log:  # one short append per test: lines stay whole
            log.write(f"{nodeid}\t{after[0] - before[0]:.2f}\t{after[1] - before[1]:.2f}\n")


def summarize(lines: Iterable[str]) -> tuple[dict[str, float], dict[str, float]]:
    """CPU seconds (own + children) by test file and by folder under tests/."""
    by_file: dict[str, float] = defaultdict(float)
    by_folder: dict[str, float] = defaultdict(float)
    for line in lines:
        nodeid, own, children = line.rstrip("\n").split("\t")
        seconds = float(own) + float(children)
        path = nodeid.split("::", 1)[0]
        by_file[path] += seconds
        by_folder[path.rsplit("/", 1)[0]] += seconds
    return dict(by_file), dict(by_folder)


def main(argv: list[str]) -> int:
    with open(argv[0], encoding="utf-8") as log:
        by_file, by_folder = summarize(log)
    print(f"{sum(by_file.values()):.0f} s of CPU in {len(by_file)} files")
    for name, seconds in sorted(by_folder.items(), key=lambda item: -item[1]):
        print(f"{seconds:8.1f}  {name}/")
    for name, seconds in sorted(by_file.items(), key=lambda item: -item[1])[:30]:
        print(f"{seconds:8.1f}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
