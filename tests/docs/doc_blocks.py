"""The fenced blocks of the project's Markdown pages, as the doc runner sees them.

Conventions (docs/README-style pages follow them; ``test_doc_blocks.py`` enforces them):

- ```` ```bash ```` and ```` ```python ```` blocks are commands and examples: the runner
  executes them, in order per page.
- ```` ```output ```` right after a runnable block is what that block prints; the runner
  compares it (``output_match.py``). Without one, a block only has to succeed.
- ``<!-- not-run: KEY -->`` on the line before a runnable block's fence exempts it;
  ``KEY`` must be one of ``NOT_RUN`` below, the one place where every exemption's reason
  is written.
- Every other fence names what it holds: ``json`` (a payload), ``yaml`` (a configuration
  file), ``text`` (a diagram, a synopsis, a layout). A fence without a language is an error: a command nobody runs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

RUNNABLE = ("bash", "python")
DESCRIPTIVE = ("json", "yaml", "text", "output")

# Why a runnable block is not run. Short on purpose: each entry is a kind of block the test
# machine cannot run, not a block that happens to fail.
NOT_RUN: dict[str, str] = {
    "container": "needs a container engine (Docker/compose); scripts/container_check.sh checks the image with buildah",
    "gpu": "needs an NVIDIA GPU and its container toolkit",
    "benchmark": "a benchmark run of minutes on a quiet machine; the README's short run is executed instead",
    "peers": "bench_peers.py's full comparison: it makes a virtual environment per serving system (torch, Ray, "
             "PyTriton: gigabytes from PyPI) and runs for tens of minutes; tests/e2e/test_bench_peers_script.py "
             "runs it small",
    "training": "trains policies for minutes (the README runs the --evaluate half)",
    "test-suite": "runs (part of) the test suite this runner belongs to; .ci/run runs it",
    "ray": "needs a separate environment with ray installed (RLlib's own recording scripts, and "
           "`rlserve export --trust-code`, which the e2e tests run in a ray venv of their own)",
    "kubernetes": "needs a Kubernetes cluster (the manifests are rendered and validated without one)",
    "openpi": "needs openpi-client, which pins numpy<2 and so lives in an environment of its own; "
              "tests/e2e/test_openpi_e2e.py runs the block as written there (tests/openpi_venv.py)",
}

_FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", re.S | re.M)
_NOT_RUN = re.compile(r"<!--\s*not-run:\s*([\w-]+)\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    """One fenced block: where it is, what it holds, and how the runner treats it."""

    page: str  # path relative to the repository, e.g. "docs/api.md"
    index: int  # position among the page's runnable blocks (0-based); -1 for other blocks
    line: int  # 1-based line of the opening fence
    lang: str
    text: str
    not_run: str | None = None  # a NOT_RUN key
    output: str | None = None  # the ```output block that follows, if any

    @property
    def name(self) -> str:
        """``docs/api.md#3@L101``: page, runnable index and line, for test ids and reports."""
        return f"{self.page}#{self.index}@L{self.line}"

    @property
    def first_line(self) -> str:
        return next((line.strip() for line in self.text.splitlines() if line.strip()), "")


def doc_pages() -> list[Path]:
    """README.md and every page of docs/, the pages users follow."""
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def all_blocks(path: Path, text: str | None = None) -> list[Block]:
    """Every fenced block of a page, with ```output blocks attached to the block before them."""
    text = path.read_text() if text is None else text
    page = path.relative_to(REPO).as_posix() if path.is_relative_to(REPO) else path.name
    found: list[Block] = []
    runnable = 0
    for match in _FENCE.finditer(text):
        lang = match.group(1).strip()
        line = text.count("\n", 0, match.start()) + 1
        before = text[:match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = _NOT_RUN.search(before)
        if lang == "output" and found and found[-1].lang in RUNNABLE and _adjacent(text, found[-1], line):
            previous = found.pop()
            found.append(Block(previous.page, previous.index, previous.line, previous.lang, previous.text,
                               previous.not_run, match.group(2)))
            continue
        index = runnable if lang in RUNNABLE else -1
        runnable += lang in RUNNABLE
        found.append(Block(page, index, line, lang, match.group(2), marker.group(1) if marker else None))
    return found


def _adjacent(text: str, block: Block, output_line: int) -> bool:
    """Only blank lines between the runnable block's closing fence and the output block."""
    lines = text.splitlines()
    closing = next(i for i in range(block.line, len(lines)) if lines[i].startswith("```"))
    return all(not line.strip() for line in lines[closing + 1:output_line - 1])


def runnable_blocks(path: Path, text: str | None = None) -> list[Block]:
    return [block for block in all_blocks(path, text) if block.lang in RUNNABLE]
