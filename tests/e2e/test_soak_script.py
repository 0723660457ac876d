"""scripts/soak.py runs: a few seconds of the mix at a fixed rate, hostile requests among
them, two reported windows and the targets' verdicts.

Timing is not asserted (docs/benchmarks.md records the 10-minute run); this keeps the
script from rotting, and holds what does not depend on the machine: every request of the
mix answered 200 and every hostile one a 4xx.
"""

from __future__ import annotations

import re

import pytest
from server_process import run_script

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_the_soak_script_reports_windows_and_its_targets_without_errors():
    out = run_script("soak.py", "--minutes", "0.1", "--window", "3", "--rate", "60", "--hostile", "3",
                     "--connections", "4", "--no-check")
    windows = re.findall(r"window +\d+: +(\d+) requests .* errors (\d+) .* hostile (\d+) \((\d+) 4xx\)", out)
    assert len(windows) == 2, out
    assert all(int(n) > 0 and errors == "0" for n, errors, _, _ in windows), out
    assert sum(int(h) for _, _, h, _ in windows) > 0 and all(h == ok for _, _, h, ok in windows), out
    assert "PASS  0 errors" in out, out
    assert re.search(r"(PASS|FAIL)  RSS after the first window within 5%", out), out
    assert re.search(r"(PASS|FAIL)  p99 of the last window within 1.5x of the first", out), out
