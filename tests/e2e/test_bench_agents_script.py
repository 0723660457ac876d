"""scripts/bench_agents.py runs: a real server with a policy set, HTTP and stream load, its lines.

Timing is not asserted (the script prints numbers; docs/benchmarks.md records them). At this
size a scenario of 64 connections may answer nothing inside its short window, so its line is
held to what any run shows: no error, and server CPU per request measured (the server
answered its requests); the cost question's scenarios (2 connections) answered inside it.
"""

from __future__ import annotations

import math
import re

import pytest
from server_process import run_script

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SCENARIO = re.compile(r"^(?P<label>\S.*?) +c=(?P<c>\d+) +(?P<req>\d+) req/s +(?P<obs>\d+) obs/s .*"
                      r"server cpu +(?P<cpu>\S+) us/req +errors (?P<errors>\d+)$")


def test_the_agents_benchmark_runs_and_reports_both_questions():
    out = run_script("bench_agents.py", "--duration", "0.5", "--warmup", "0.2", "--rounds", "1",
                     "--cost-concurrency", "2")
    lines = out.splitlines()
    assert lines[0].startswith("[start] ") and "nproc=" in lines[0] and lines[-1].startswith("[end] "), out
    scenarios = {m["label"]: m for line in lines if (m := SCENARIO.match(line))}
    assert set(scenarios) == {"1 agent, session", "8 agents, episode", "plain 8-row request, sessions",
                              "64-row requests, c=8", "8 agents, c=64", "8 agents, stream, c=64"}, out
    for label, m in scenarios.items():
        assert m["errors"] == "0" and math.isfinite(float(m["cpu"])) and float(m["cpu"]) > 0, (label, out)
    for label in ("1 agent, session", "8 agents, episode"):
        assert int(scenarios[label]["req"]) > 0, (label, out)
    assert sum(1 for line in lines if "batch work (the model, sampling, state):" in line) == 7, out
    medians = {q: re.search(rf"^{re.escape(q)}.*: median (\S+) \(rounds", out, re.M)
               for q in ("cost c=2: server CPU per request", "throughput: obs/s", "throughput over the stream")}
    assert all(m is not None and float(m[1]) >= 0 for m in medians.values()), out
    assert re.search(r"^budget at 0\.8: an 8-agent request may cost \d+ us .* a uvicorn app that parses nothing "
                     r"spends \d+ us", out, re.M | re.I), out
