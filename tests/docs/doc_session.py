"""Run one Markdown page's blocks, verbatim and in order, in one shell; write what happened.

    python tests/docs/doc_session.py PAGE.md RESULTS.json [--blocks NAME ...]

Meant to run inside private network and PID namespaces (``doc_namespace.py`` starts it
there), so that the documented addresses (``127.0.0.1:8000``, Redis on ``6379``, gRPC on
``8001``) are this page's own and nothing of the page outlives it. Here the loopback
interface is brought up, a copy of the checkout becomes the working directory (the docs
are written for a reader in a clone), and each runnable block not marked not-run is run by
one ``bash`` (``doc_shell.sh``): a bash block line by line, stopping at the first line that
fails (pipelines fail as a whole: ``pipefail``); a python block as ``python BLOCK.py``.

A block passes when no line failed and its output matches the page's ```output block, or,
without one, when nothing it printed is an rlserve error answer (curl prints a 4xx body and
exits 0, so "no error JSON" is what a reader would check by eye).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from doc_blocks import REPO, Block, runnable_blocks  # noqa: E402

sys.path.insert(0, str(REPO / "scripts"))

from bench_procs import stat_fields  # noqa: E402
from output_match import json_documents, mismatch  # noqa: E402

TOOLS = Path(__file__).resolve().parent
BLOCK_TIMEOUT_S = 600.0  # a ceiling for a loaded machine: the slowest block (the README's scripts) takes ~1.5 min alone
IGNORED = shutil.ignore_patterns(".git", "__pycache__", "*.egg-info", ".venv", "venv", ".mypy_cache", ".ruff_cache")


def loopback_up() -> None:
    """``ip link set lo up`` without iproute2: a new network namespace starts with lo down."""
    siocgifflags, siocsifflags, iff_up = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sh", b"lo", 0)
        flags = struct.unpack("16sh", fcntl.ioctl(sock, siocgifflags, request))[1]
        fcntl.ioctl(sock, siocsifflags, struct.pack("16sh", b"lo", flags | iff_up))


def copy_checkout(target: Path) -> Path:
    """The checkout's tracked files, as they are in its working tree, under ``target/rlserve``.

    Untracked files stay behind: a reader who followed the docs in this checkout has made
    exports (``rps/``, ``my-policy.rlsb``), ``weights.npz`` or a ``dump.rdb`` there, and a
    page run over them would fail where a fresh clone passes (``rlserve export --out rps``
    onto the reader's ``rps/``). Only a copy outside git takes every file."""
    root, repo = target / "rlserve", REPO
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=repo,
                            capture_output=True) if (repo / ".git").exists() and shutil.which("git") else None
    if listed is None or listed.returncode != 0:
        shutil.copytree(repo, root, ignore=IGNORED, symlinks=True)
        return root
    for name in filter(None, listed.stdout.decode().split("\0")):
        source = repo / name
        if source.is_file() or source.is_symlink():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, root / name, follow_symlinks=False)
    return root


def logical_lines(text: str) -> list[tuple[int, str]]:
    """(line number, command) with backslash continuations joined; blanks and comments dropped."""
    lines, pending, start = [], "", 0
    for number, line in enumerate(text.splitlines(), 1):
        if not pending:
            start = number
        pending += line
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        if pending.strip() and not pending.lstrip().startswith("#"):
            lines.append((start, pending))
        pending = ""
    if pending.strip():
        lines.append((start, pending))
    return lines


def shell_script(block: Block, state: Path) -> str:
    """What the shell sources for ``block``: each command followed by a check of its status."""
    if block.lang == "python":
        source = state / f"block-{block.index}.py"
        source.write_text(block.text)
        return f"python {source}\n__rl_check $? 1 || return 0\n"
    lines = logical_lines(block.text)
    if all(subprocess.run(["bash", "-n", "-c", line], capture_output=True).returncode == 0 for _, line in lines):
        return "".join(f"{line}\n__rl_check $? {number} || return 0\n" for number, line in lines)
    # A construct over several lines (a loop, a here-document): the block as a whole.
    return f"{block.text}\n__rl_check $? {len(block.text.splitlines())} || return 0\n"


def shell_environment(state: Path) -> dict[str, str]:
    """The page's environment: this one without ``RLSERVE_*`` (a page sets what it uses), with
    this environment's ``python`` and ``rlserve`` first on PATH, and its caches (the export
    cache of ``rlserve serve --checkpoint`` among them, ``$XDG_CACHE_HOME/rlserve/exports``)
    in the page's own folder rather than the user's home."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLSERVE_")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["XDG_CACHE_HOME"] = str(state / "cache")
    env.update(__RL_STATE=str(state), __RL_TOOLS=str(TOOLS))
    return env


class Shell:
    """One bash for the whole page, fed a block at a time."""

    def __init__(self, workdir: Path, state: Path):
        env = shell_environment(state)
        self.state = state
        self.proc = subprocess.Popen(["bash", "--noprofile", "--norc"], stdin=subprocess.PIPE, cwd=workdir,
                                     env=env, start_new_session=True, text=True,
                                     stdout=subprocess.DEVNULL, stderr=open(state / "shell.log", "w"))
        self._send(f"source {TOOLS / 'doc_shell.sh'}\n")

    def _send(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text)
        self.proc.stdin.flush()

    def run(self, block: Block, timeout: float) -> dict:
        n = block.index
        script = self.state / f"block-{n}.sh"
        script.write_text(shell_script(block, self.state))
        out, err, done = (self.state / f"block-{n}.{kind}" for kind in ("out", "err", "done"))
        started = time.monotonic()
        self._send(f"__rl_block {script} {out} {err} {done}\n")
        while not done.exists():
            if self.proc.poll() is not None or time.monotonic() - started > timeout:
                why = "the shell exited" if self.proc.poll() is not None else f"timed out after {timeout:.0f} s"
                return self._result(block, out, err, started, why)
            time.sleep(0.05)
        return self._result(block, out, err, started, done.read_text() or None)

    def _result(self, block: Block, out: Path, err: Path, started: float, failed: str | None) -> dict:
        stdout = out.read_text(errors="replace") if out.exists() else ""
        stderr = err.read_text(errors="replace") if err.exists() else ""
        why = failed or (mismatch(block.output, stdout) if block.output is not None else error_answer(stdout))
        if why:
            why += self._server_log_tail()
        return {"name": block.name, "passed": why is None, "why": why, "seconds": round(time.monotonic() - started, 2),
                "stdout": stdout[-4000:], "stderr": stderr[-4000:]}

    def _server_log_tail(self) -> str:
        current = self.state / "current-server-log"
        if not current.exists():
            return ""
        log = Path(current.read_text().strip())
        return f"\n(the running server's log ends: {log.read_text(errors='replace')[-1500:]})" if log.exists() else ""

    def close(self) -> None:
        """Stop the page's shell and everything it started. A server the page left running
        gets SIGTERM and up to ``STOP_S`` to shut down, as a user's Ctrl-C would: a server
        killed mid-shutdown leaves its unpacked bundles behind in the temporary folder."""
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=20)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
        deadline = time.monotonic() + STOP_S
        while _group_running(self.proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


STOP_S = 15.0


def _group_running(pgid: int) -> bool:
    """Whether a process of group ``pgid`` still runs (zombies, already exited, do not count)."""
    return any(int(fields[2]) == pgid and fields[0] != "Z" for _, fields in stat_fields())


def error_answer(stdout: str) -> str | None:
    """The first rlserve error body (``{"error": ...}``) among the JSON answers printed, as a
    failure reason. Lines that are not JSON (a server's log, a banner) are skipped."""
    for line in stdout.splitlines():
        for body in json_documents(line) or []:
            if isinstance(body, dict) and "error" in body:
                return f"answered an error: {json.dumps(body)[:500]}"
    return None


def run_page(page: Path, text: str | None, names: list[str] | None) -> list[dict]:
    blocks = [b for b in runnable_blocks(page, text) if b.not_run is None and (not names or b.name in names)]
    with tempfile.TemporaryDirectory(prefix="rlserve-docs-") as tmp:
        state = Path(tmp) / "state"
        state.mkdir()
        shell = Shell(copy_checkout(Path(tmp)), state)
        results = []
        try:
            for block in blocks:
                result = shell.run(block, BLOCK_TIMEOUT_S)
                results.append(result)
                if shell.proc.poll() is not None or "timed out" in (result["why"] or ""):
                    break  # the shell is gone or stuck: the page's later blocks cannot run
        finally:
            shell.close()
    ran = {r["name"] for r in results}
    return results + [{"name": b.name, "passed": False, "why": "not reached: an earlier block stopped the shell",
                       "seconds": 0, "stdout": "", "stderr": ""} for b in blocks if b.name not in ran]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("page", type=Path, help="a Markdown page of this checkout")
    parser.add_argument("results", type=Path, help="where to write the JSON results")
    parser.add_argument("--text", type=Path, help="read the page's text from this file (a modified copy)")
    parser.add_argument("--blocks", nargs="*", help="run only these blocks (by name)")
    args = parser.parse_args()
    loopback_up()
    text = args.text.read_text() if args.text else None
    args.results.write_text(json.dumps(run_page(args.page.resolve(), text, args.blocks), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
