"""A page runs as in a fresh clone, whatever the reader has done in this checkout.

A reader who followed the README has exports, ``weights.npz`` and the like in the checkout;
the runner copies tracked files only, so those never reach a page's sandbox, and git ignores
them, so the checkout stays clean. The page's caches (the export cache of ``rlserve serve
--checkpoint``) live in the sandbox, not in the reader's home.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import doc_session
import pytest
from doc_blocks import REPO, doc_pages, runnable_blocks
from doc_namespace import run_isolated
from doc_session import copy_checkout, logical_lines

SESSION = Path(__file__).resolve().parent / "doc_session.py"

# What the pages' commands make in the working directory that a regular expression below
# cannot read from the command line: redis-server saves its data there when it stops.
MADE_BY_PROGRAMS = ("dump.rdb",)
_MADE = [
    # A name followed by "/" is a path into a folder of the checkout (docs/bench-peers.json).
    re.compile(r"--out[ =]([\w.-]+)(?![\w.-]|/)"),  # rlserve export, scripts/plot_benchmarks.py
    re.compile(r"--json ([\w.-]+)(?![\w.-]|/)"),  # the benchmark scripts
    re.compile(r"(?<![>&\d=-])> ?([\w.-]+)"),  # a redirect to a file here (not 2>&1, >/dev/null, ->)
    re.compile(r"^cp \S+ ([\w.-]+)"),
    re.compile(r"RLSERVE_EXPERIENCE_LOG=([\w.-]+)"),
    re.compile(r"rlserve experience to-json \S+ ([\w.-]+)"),
    re.compile(r"out_dir=\"([\w.-]+)\""),  # the Python API (docs/export.md)
    re.compile(r"\"([\w.-]+\.rlsb)\""),
    re.compile(r"\.tofile\('([\w.-]+)'\)"),  # numpy in a python -c line (docs/api.md)
]


def made_by_the_pages() -> set[str]:
    """The names the pages' runnable blocks (run or not) create in the checkout."""
    made = set(MADE_BY_PROGRAMS)
    for page in doc_pages():
        for block in runnable_blocks(page):
            for _, line in logical_lines(block.text):
                line = line.split(" #", 1)[0].strip()
                names = {match for pattern in _MADE for match in pattern.findall(line)}
                archive = re.search(r"\brlserve export\b.*--out[ =]([\w.-]+)", line)
                if archive is not None and "--archive" in line:
                    names.add(archive[1] + ".rlsb")
                made |= names
    return made


def _git(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)


def test_what_the_pages_make_is_ignored_by_git() -> None:
    made = made_by_the_pages()
    assert {"rps", "my-policy.rlsb", "weights.npz", "bench.json", "served-experience", "dump.rdb", "obs.bin"} <= made
    # A folder's pattern ends in "/": ask about a file inside it as well as about the name.
    asked = sorted(made | {f"{name}/x" for name in made})
    ignored = set(_git("check-ignore", "--no-index", *asked, cwd=REPO).stdout.split())
    missing = sorted(name for name in made if name not in ignored and f"{name}/x" not in ignored)
    assert not missing, f"the docs make these in the checkout and .gitignore does not list them: {missing}"


def test_a_page_gets_the_tracked_files_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = tmp_path / "clone"
    (repo / "scripts").mkdir(parents=True)
    (repo / "scripts" / "tool.py").write_text("print('tracked')\n")
    assert _git("init", "-q", cwd=repo).returncode == 0
    assert _git("add", "scripts/tool.py", cwd=repo).returncode == 0
    (repo / "scripts" / "tool.py").write_text("print('tracked, changed')\n")  # as it is in the working tree
    (repo / "rps").mkdir()
    (repo / "rps" / "policy_set.json").write_text("{}")  # what the README's export left, not ignored
    (repo / "weights.npz").write_bytes(b"x")
    monkeypatch.setattr(doc_session, "REPO", repo)
    copy = copy_checkout(tmp_path / "sandbox")
    assert sorted(p.relative_to(copy).as_posix() for p in copy.rglob("*") if p.is_file()) == ["scripts/tool.py"]
    assert (copy / "scripts" / "tool.py").read_text() == "print('tracked, changed')\n"


@pytest.mark.e2e
def test_the_export_cache_is_the_pages_own(tmp_path: Path) -> None:
    """``rlserve serve --checkpoint`` keeps its exports under the page's sandbox, never in the
    user's ``~/.cache/rlserve/exports`` (which the page would otherwise fill, and read)."""
    page = tmp_path / "page.md"
    page.write_text("```python\nfrom rlserve.service.serving.export_cache import default_root\n"
                    "print(default_root())\n```\n")
    out = tmp_path / "results.json"
    done = run_isolated([sys.executable, str(SESSION), str(REPO / "README.md"), str(out), "--text", str(page)],
                        timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    (result,) = json.loads(out.read_text())
    assert result["passed"], result
    root = Path(result["stdout"].strip())
    assert root.name == "exports" and not root.is_relative_to(Path.home()), root
    assert not root.exists()  # the page's folder went with the page
