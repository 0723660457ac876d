"""Open ``/docs`` of a real ``rlserve serve`` in headless Chromium, with no network but loopback.

    python tests/docs/browse_offline.py OUT_DIR

Run inside a fresh network namespace (``doc_namespace.run_isolated``): this brings its
loopback up, checks that nothing outside answers (an address on the internet is
unreachable), starts the server, and has Chromium render the page until its scripts are
done (``--virtual-time-budget``), writing the rendered DOM to ``OUT_DIR/dom.html`` and what
it found to ``OUT_DIR/report.json``.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "e2e"))

from doc_session import loopback_up  # noqa: E402
from server_process import running_server  # noqa: E402

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--virtual-time-budget=20000"]
OUTSIDE = ("1.1.1.1", 443)  # any address beyond loopback


def outside_reachable() -> str | None:
    """None when the outside cannot be reached (what this script needs); else what answered."""
    try:
        with socket.create_connection(OUTSIDE, timeout=3):
            return f"{OUTSIDE} answered"
    except OSError:
        return None


def browser() -> str:
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    raise SystemExit("chromium is not installed (Debian: apt-get install chromium; .ci/run installs it)")


def main(out: Path) -> int:
    loopback_up()
    report: dict = {"outside": outside_reachable()}
    with running_server() as url, tempfile.TemporaryDirectory() as profile:
        done = subprocess.run([browser(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--dump-dom",
                               f"{url}/docs"], capture_output=True, text=True, timeout=180)
        (out / "dom.html").write_text(done.stdout)
        report.update(returncode=done.returncode, stderr=done.stderr[-3000:], url=url)
    (out / "report.json").write_text(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
