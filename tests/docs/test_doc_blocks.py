"""The pages' fences follow the runner's conventions, and the list of exemptions stays short.

Without these, a command could escape the runner by being written in a fence without a
language, or exempted with a reason nobody wrote down.
"""

from __future__ import annotations

import re
import tomllib
from collections import Counter, defaultdict

from doc_blocks import DESCRIPTIVE, NOT_RUN, REPO, RUNNABLE, all_blocks, doc_pages, runnable_blocks
from doc_session import logical_lines

# Every exempt block of every page; raise it only with a reason in NOT_RUN (25-27: the soak, the
# GPU benchmark and the GPU image's container check; 28-29: experience.md's BC run on a log and
# its configuration, which need ray in an environment of its own; 30: benchmarks.md's comparison
# with other serving systems; 31-32: newstack.md's and custom_models.md's `rlserve export
# --trust-code` in a training environment with ray, whose commands
# tests/e2e/test_trust_code_e2e.py and test_custom_modelv2_e2e.py run in the tests' ray venv;
# 33: api.md's openpi-client example, which tests/e2e/test_openpi_e2e.py runs in its venv).
MAX_NOT_RUN = 33


def test_every_fence_names_its_language() -> None:
    unknown = [f"{b.page}:{b.line} ```{b.lang}" for page in doc_pages() for b in all_blocks(page)
               if b.lang not in RUNNABLE + DESCRIPTIVE]
    assert not unknown, f"fences the runner does not know (use bash/python to run, json/text to show): {unknown}"


def test_every_output_block_follows_a_runnable_block() -> None:
    strays = [f"{b.page}:{b.line}" for page in doc_pages() for b in all_blocks(page) if b.lang == "output"]
    assert not strays, f"```output blocks must come right after a bash or python block: {strays}"


def test_not_run_markers_name_a_listed_reason() -> None:
    blocks = [b for page in doc_pages() for b in all_blocks(page) if b.not_run]
    unknown = [f"{b.page}:{b.line} ({b.not_run})" for b in blocks if b.not_run not in NOT_RUN]
    assert not unknown, f"not-run keys without a reason in doc_blocks.NOT_RUN: {unknown}"
    on_descriptive = [f"{b.page}:{b.line}" for b in blocks if b.lang not in RUNNABLE]
    assert not on_descriptive, f"not-run markers on blocks that are not commands: {on_descriptive}"
    used = Counter(b.not_run for b in blocks)
    assert set(used) == set(NOT_RUN), f"reasons no block uses: {set(NOT_RUN) - set(used)}"
    assert len(blocks) <= MAX_NOT_RUN, f"{len(blocks)} blocks are exempt: {[b.name for b in blocks]}"


def test_a_marker_is_read_only_right_before_its_fence() -> None:
    """A not-run comment anywhere else would be ignored: refuse it rather than run the block."""
    for page in doc_pages():
        text = page.read_text()
        markers = [m.start() for m in re.finditer(r"^[ \t]*<!--\s*not-run:", text, flags=re.M)]
        attached = {b.line for b in all_blocks(page) if b.not_run}
        lines = {text.count("\n", 0, start) + 2 for start in markers}
        assert lines == attached, f"{page.name}: not-run markers not on the line before a fence: {lines - attached}"


def test_the_readme_test_command_is_what_ci_runs() -> None:
    """The README's test command is exempt (it is the suite); .ci/run must run exactly it."""
    readme = [b for b in all_blocks(REPO / "README.md") if b.lang == "bash"]
    assert readme[1].not_run == "test-suite"
    install, test = readme[1].text.strip().split(" && ")
    ci = (REPO / ".ci" / "run").read_text()
    assert install in ci and test in ci


def test_the_readme_says_how_long_the_suite_takes_and_how_to_run_a_part() -> None:
    """The test command is exempt from the runner; its duration and a quicker command that
    works (folders that exist, markers pytest knows) are written beside it."""
    text = (REPO / "README.md").read_text()
    assert re.search(r"whole\s+suite\s+takes\s+about\s+\d+\s+to\s+\d+\s+minutes", text), "say how long the suite takes"
    commands = [command.split()[3:] for command in re.findall(r"`(python -m pytest [^`]+)`", text)]
    # What is left once the options and their values (-p no:cacheprovider, -n 0) are taken out.
    folders = [arg for args in commands for before, arg in zip(["", *args], args, strict=False)
               if not arg.startswith("-") and before not in ("-p", "-n", "-m", "-k")]
    assert folders and all((REPO / folder).is_dir() for folder in folders), folders
    markers = re.findall(r'`-m "not (\w+)"`', text)
    known = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["markers"]
    assert markers and all(any(m.startswith(f"{name}:") for m in known) for name in markers), markers


def test_no_two_pages_export_to_the_same_folder() -> None:
    """A reader follows one page after another in one checkout: a second page's `rlserve export
    --out DIR` onto a folder an earlier page exported to fails as written (without --force)."""
    pages: defaultdict[str, set[str]] = defaultdict(set)
    for page in doc_pages():
        for block in runnable_blocks(page):
            for _, line in logical_lines(block.text):
                out = re.search(r"\brlserve export\b.*?--out[ =](\S+)", line)
                if out is not None and "--force" not in line:
                    pages[out[1]].add(page.relative_to(REPO).as_posix())
    shared = {folder: sorted(names) for folder, names in pages.items() if len(names) > 1}
    assert not shared, f"pages exporting to the same --out folder (give each its own): {shared}"


def test_every_example_finds_the_server_at_rlserve_url() -> None:
    """A reader whose server is on another address exports RLSERVE_URL and pastes the examples:
    each address of the documented server in a command or an example is RLSERVE_URL with the
    default shown (`${RLSERVE_URL:-http://127.0.0.1:8000}`, `os.environ.get("RLSERVE_URL", ...)`)."""
    address = re.compile(r"(?:https?://)?(?:127\.0\.0\.1|localhost):8000\b")
    honoured = ("${RLSERVE_URL:-", 'os.environ.get("RLSERVE_URL", "')
    fixed = [f"{block.page}:{block.line + number}: {line.strip()[:100]}"
             for page in doc_pages() for block in runnable_blocks(page)
             for number, line in enumerate(block.text.splitlines(), 1)
             for match in address.finditer(line) if not line[:match.start()].endswith(honoured)]
    assert not fixed, "examples with the address written in (use ${RLSERVE_URL:-http://127.0.0.1:8000}):\n" + \
        "\n".join(fixed)
