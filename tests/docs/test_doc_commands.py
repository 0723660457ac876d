"""Every command block of README.md and docs/*.md runs as written, against real servers.

The blocks are read from the Markdown when the tests are collected (nothing is copied into
a test), and each page runs in its own private network and PID namespaces
(``doc_namespace.py``) through ``doc_session.py``: one shell per page, the blocks in page
order, on a copy of the checkout. Documented addresses are used as written: the page's
``rlserve serve`` really listens on 127.0.0.1:8000 of its namespace, so no text of a block
is rewritten. Two commands behave as a reader's setup makes them (``doc_shell.sh``):
``rlserve serve`` runs in the background (the reader's other terminal) until the page's next
``rlserve serve``, and ``pip install`` checks that what it names is installed.

What a block prints is compared with the ```output block under it where the page shows
one (``output_match.py``). Blocks marked ``<!-- not-run: KEY -->`` are listed, with their
reason, in ``doc_blocks.NOT_RUN``; ``test_doc_blocks.py`` keeps that list honest.
"""

from __future__ import annotations

import functools
import json
import sys
import tempfile
from pathlib import Path

import pytest
from doc_blocks import REPO, Block, doc_pages, runnable_blocks
from doc_namespace import run_isolated

pytestmark = pytest.mark.e2e

SESSION = Path(__file__).resolve().parent / "doc_session.py"
PAGE_TIMEOUT_S = 1800  # a ceiling, far above a page's usual minute or two

# Blocks that fail because of behaviour another change is to fix; strict, so each entry must
# go once that work has landed. Keyed by page and a piece of the block's text. (The admin
# walkthrough's entry went with issue 34's behaviour half.)
PENDING_BEHAVIOUR: dict[tuple[str, str], str] = {}

# Pages left out of the default run (marked ``slow``; ``--slow`` runs them, see
# tests/conftest.py), each with what runs its behaviour there instead. The README and the
# pages a first day needs (api, client, sessions, kubernetes) stay in it.
SLOW_PAGES: dict[str, str] = {
    "docs/benchmarks.md": "benchmark commands; the scripts' smoke tests are slow too",
    "docs/rollout.md": "tests/e2e/test_rollout_e2e.py and test_rollout_story_e2e.py run the walkthrough's parts",
    "docs/custom_models.md": "ray-environment exports; tests/e2e/test_custom_models_e2e.py serves the catalog's",
    "docs/newstack.md": "tests/e2e/test_newstack_e2e.py and the newstack conformance tests export the same checkpoints",
    "docs/experience.md": "tests/e2e/test_experience_e2e.py, test_experience_cli.py and the RLlib BC test",
    "docs/export.md": "tests/unit/test_export_cli.py and the conformance export tests",
    "docs/action-heads.md": "tests/e2e/test_action_heads_e2e.py and the action-head conformance tests",
}


def page_blocks() -> list[Block]:
    return [block for page in doc_pages() for block in runnable_blocks(page) if block.not_run is None]


@functools.cache
def page_results(page: str) -> dict[str, dict]:
    """Run a page once (its blocks share its servers); results by block name."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "results.json"
        done = run_isolated([sys.executable, str(SESSION), str(REPO / page), str(out)], timeout=PAGE_TIMEOUT_S)
        assert done.returncode == 0 and out.exists(), f"the doc runner failed on {page}:\n{done.stderr[-3000:]}"
        return {result["name"]: result for result in json.loads(out.read_text())}


def _param(block: Block):
    pending = [why for (page, text), why in PENDING_BEHAVIOUR.items() if page == block.page and text in block.text]
    marks = [pytest.mark.xfail(strict=True, reason=pending[0])] if pending else []
    if block.page in SLOW_PAGES:
        marks.append(pytest.mark.slow)
    return pytest.param(block, id=block.name, marks=marks)


@pytest.mark.parametrize("block", [_param(block) for block in page_blocks()])
def test_documented_block_runs(block: Block) -> None:
    result = page_results(block.page)[block.name]
    assert result["passed"], (
        f"{block.name} ({block.first_line[:100]!r}) failed: {result['why']}\n"
        f"--- stdout\n{result['stdout'][-2000:]}\n--- stderr\n{result['stderr'][-2000:]}"
    )


def test_slow_pages_are_pages() -> None:
    """Each page left out of the default run exists and has blocks to run."""
    pages = {block.page for block in page_blocks()}
    assert set(SLOW_PAGES) <= pages, set(SLOW_PAGES) - pages


def test_pending_entries_name_real_blocks() -> None:
    """Each pending entry matches exactly one block (a stale entry would hide nothing)."""
    blocks = page_blocks()
    for (page, text), _ in PENDING_BEHAVIOUR.items():
        assert sum(block.page == page and text in block.text for block in blocks) == 1, (page, text)
