"""docs/benchmarks.md shows the table of docs/benchmarks.json (rlserve's own scenarios, below
its comparison with other servers) and the history its plot; the file's numbers are the history's.

- The page's table is exactly what ``scripts/plot_benchmarks.py --table`` renders from the
  results file, so the two cannot drift apart.
- Every number of the results file is written in the history section its run names
  (docs/benchmarks-history.md), so the table shows only what a recorded run measured.
- The plot script draws the committed file, and every link into the history resolves.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

from bench_results import MEASURES, anchor, load, table  # noqa: E402

DOCS = ROOT / "docs"
RESULTS = DOCS / "benchmarks.json"
HISTORY = DOCS / "benchmarks-history.md"


def _sections(text: str) -> dict[str, str]:
    """Heading text -> the section's text up to the next heading of the same or a higher level."""
    heads = list(re.finditer(r"^(#+) (.+)$", text, flags=re.M))
    sections = {}
    for i, head in enumerate(heads):
        level = len(head.group(1))
        end = next((h.start() for h in heads[i + 1:] if len(h.group(1)) <= level), len(text))
        sections[head.group(2).strip()] = text[head.end():end]
    return sections


def test_the_page_shows_the_table_of_the_results_file() -> None:
    page = (DOCS / "benchmarks.md").read_text()
    assert table(load(RESULTS)) in page
    assert page.index(table(load(RESULTS))) < page.index("## Running them")
    assert "](benchmarks.png)" in HISTORY.read_text()


def test_every_number_is_recorded_in_the_history_section_of_its_run() -> None:
    sections = _sections(HISTORY.read_text())
    for run in load(RESULTS):
        assert run["history"] in sections, f"run {run['id']}: no history section {run['history']!r}"
        section = sections[run["history"]]
        assert run["commit"] in run["history"] + section, run["id"]
        for result in run["results"]:
            for measure in MEASURES:
                if measure in result:
                    value = result[measure]
                    written = f"{value:,}" if isinstance(value, int) and value >= 1000 else f"{value}"
                    assert written in section, f"run {run['id']}: {result['label']} c={result['c']} {measure} " \
                                               f"{written} is not in its history section"


def test_links_into_the_history_resolve() -> None:
    anchors = {anchor(heading) for heading in _sections(HISTORY.read_text())}
    for page in [ROOT / "README.md", *DOCS.glob("*.md")]:
        for target in re.findall(r"benchmarks-history\.md#([\w-]+)", page.read_text()):
            assert target in anchors, f"{page.name} links to a missing section #{target}"


def test_the_plot_script_draws_the_results(tmp_path: Path) -> None:
    out = tmp_path / "plot.png"
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "plot_benchmarks.py"), str(RESULTS), "--out",
                           str(out), "--table"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert out.read_bytes().startswith(b"\x89PNG") and out.stat().st_size > 10_000
    assert table(load(RESULTS)) in done.stdout
    assert (DOCS / "benchmarks.png").read_bytes().startswith(b"\x89PNG")
