"""The doc runner itself: it catches what it exists to catch.

The end-to-end half runs real pages with one documented thing broken (a route, a flag) in
a copy of the page's text and requires the runner to fail exactly that block; the rest
checks its parts (output comparison, line splitting, the pip check) on small inputs.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from doc_blocks import REPO, runnable_blocks
from doc_namespace import run_isolated
from doc_session import logical_lines
from output_match import mismatch

SESSION = Path(__file__).resolve().parent / "doc_session.py"
TOOLS = Path(__file__).resolve().parent
README = REPO / "README.md"


def _run_copy(tmp_path: Path, page: Path, text: str, blocks: list[str]) -> dict[str, dict]:
    copy = tmp_path / page.name
    copy.write_text(text)
    out = tmp_path / "results.json"
    done = run_isolated([sys.executable, str(SESSION), str(page), str(out), "--text", str(copy),
                         "--blocks", *blocks], timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return {r["name"]: r for r in json.loads(out.read_text())}


def _block_with(page: Path, text: str, piece: str):
    (block,) = [b for b in runnable_blocks(page, text) if piece in b.text]
    return block


@pytest.mark.e2e
def test_a_renamed_route_or_flag_fails_its_block(tmp_path: Path) -> None:
    """The README's first command and the act example pass as written; in a copy of the page
    with the act route and an export flag renamed, exactly those blocks fail, for that reason."""
    original = README.read_text()
    act = '${RLSERVE_URL:-http://127.0.0.1:8000}/v1/models/cartpole/act'
    assert original.count(act) >= 1
    mutated = original.replace(act, "${RLSERVE_URL:-http://127.0.0.1:8000}/v1/model/cartpole/act")
    mutated = mutated.replace("--out my-npz-policy", "--output my-npz-policy")
    serve = _block_with(README, original, "pip install . && rlserve serve")
    act_block = _block_with(README, original, '"outputs": ["value"]')
    export = _block_with(README, original, "--out my-npz-policy")
    names = [serve.name, act_block.name, export.name]

    as_written = _run_copy(tmp_path, README, original, names[:2])  # the export as written: test_doc_commands
    assert all(as_written[name]["passed"] for name in names[:2]), as_written
    broken = _run_copy(tmp_path, README, mutated, names)
    assert broken[serve.name]["passed"]
    assert not broken[act_block.name]["passed"] and "not_found" in broken[act_block.name]["why"]
    assert not broken[export.name]["passed"] and "exited with status 2" in broken[export.name]["why"]


def test_outputs_compare_as_data_to_the_documented_precision() -> None:
    documented = '{"model": "cartpole", "action": 1, "logp": -0.6957, "value": "..."}'
    assert mismatch(documented, '{"model": "cartpole", "action": 1, "logp": -0.69571234, "value": 3.2}\n') is None
    assert "logp" in mismatch(documented, '{"model": "cartpole", "action": 1, "logp": -0.6968, "value": 0}')
    assert "keys differ" in mismatch(documented, '{"model": "cartpole", "act": 1, "logp": -0.6957, "value": 0}')
    assert "action" in mismatch(documented, '{"model": "cartpole", "action": 0, "logp": -0.6957, "value": 0}')
    assert mismatch('{"a": [1, "..."], "...": "..."}', '{"a": [1, 2, 3], "b": 4}') is None
    assert mismatch('{"a": [1, 2]}', '{"a": [1, 2, 3]}') is not None


def test_text_outputs_allow_ellipses() -> None:
    assert mismatch("cartpole: returns [...] mean 500.0\n...", "cartpole: returns [500.0] mean 500.0\nmore\n") is None
    assert mismatch("cartpole: mean 500.0", "cartpole: mean 9.0") is not None


def test_blocks_are_checked_line_by_line() -> None:
    text = "echo one \\\n  two\n# a comment\n\ncurl -s x && false\n"
    assert logical_lines(text) == [(1, "echo one    two"), (5, "curl -s x && false")]


def test_pip_install_lines_are_checked_against_what_is_installed(tmp_path: Path) -> None:
    def pip(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(TOOLS / "pip_check.py"), *args], cwd=REPO, capture_output=True,
                              text=True)

    assert pip("install", ".").returncode == 0
    assert pip("install", ".[redis,grpc]").returncode == 0
    missing_extra = pip("install", ".[no-such-extra]")
    assert missing_extra.returncode == 1 and "no extra no-such-extra" in missing_extra.stderr
    missing_package = pip("install", "no-such-package-for-rlserve")
    assert missing_package.returncode == 1 and "no-such-package-for-rlserve" in missing_package.stderr
