"""docs/kubernetes.md's commands that need no cluster run as written, from the repository root.

A fenced block right after ``<!-- not-run: kubernetes -->`` is not run (it
applies to a cluster); every other ``bash`` block is, with this interpreter's environment
first on PATH (its ``python`` and the test extra's ``kubectl``). The overlay the page tells
users to write (its ``yaml`` block) is rendered and validated beside the repository's
folders, as a user's checkout would hold it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "kubernetes.md"
NOT_RUN = "<!-- not-run: kubernetes -->"
sys.path.insert(0, str(REPO / "scripts"))

from check_kubernetes import kustomizations, problems, render  # noqa: E402

FENCE = re.compile(r"^```(\w*)\n(.*?)^```", flags=re.M | re.S)


def blocks(language: str) -> list[tuple[bool, str]]:
    """(runnable, text) of the page's fenced blocks in ``language``."""
    text = PAGE.read_text()
    found = []
    for match in FENCE.finditer(text):
        if match[1] != language:
            continue
        before = text[:match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        found.append((before.strip() != NOT_RUN, match[2]))
    return found


def run(block: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLSERVE_")}
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, f"{block!r} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def test_runnable_blocks_run_as_written():
    runnable = [text for ok, text in blocks("bash") if ok]
    commands = [line for text in runnable for line in text.splitlines() if line.strip()]
    assert any(c.startswith("kubectl kustomize ") for c in commands)
    assert "python scripts/check_kubernetes.py" in commands, "the page must show the whole check"
    for text in runnable:
        out = run(text)
        if "check_kubernetes.py" in text:
            for folder in kustomizations():
                assert re.search(rf"^{re.escape(str(folder.relative_to(REPO)))}: \d+ resources valid", out, re.M)
            assert "ServingRuntime/rlserve" in out and "InferenceService/" in out
        elif "overlays/gpu" in text:
            assert "nvidia.com/gpu" in out and "kind: Deployment" in out
        else:
            pytest.fail(f"a runnable block whose output no test checks: {text!r}")


def test_blocks_not_run_are_the_ones_that_need_a_cluster():
    skipped = [text for ok, text in blocks("bash") if not ok]
    assert len(skipped) >= 4
    for text in skipped:
        commands = [line for line in text.splitlines() if line.strip()]
        assert all(c.startswith(("kubectl ", "export ", "./docker/load_model.sh")) for c in commands), text
        assert any(c.startswith("kubectl ") and "kustomize" not in c for c in commands), text


def test_the_users_overlay_renders_and_validates(tmp_path):
    """The page's `my-cluster/kustomization.yaml`, next to a checkout's docker/ folder."""
    ((_, overlay),) = [b for b in blocks("yaml") if "# my-cluster/kustomization.yaml" in b[1]]
    (tmp_path / "docker").symlink_to(REPO / "docker")
    (tmp_path / "my-cluster").mkdir()
    (tmp_path / "my-cluster" / "kustomization.yaml").write_text(overlay)
    docs = render(tmp_path / "my-cluster")
    assert problems(docs) == []
    (deployment,) = [d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "rlserve"]
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == "registry.example.com/rlserve:0.1.0"
    assert {d["metadata"].get("namespace") for d in docs} == {"rlserve"}
