"""``/docs`` renders every route in a real headless Chromium with the network unreachable.

``browse_offline.py`` runs in a fresh network namespace (only loopback; it first checks that
an internet address does not answer), starts ``rlserve serve`` there and lets Chromium
(Debian's package; ``.ci/run`` installs it) run the page's scripts. Swagger UI draws an
operation block per route only after its script ran and fetched ``/openapi.json`` from the
same server, so every documented path appearing in the DOM means the page worked offline.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from doc_namespace import run_isolated

from rlserve.service.app import create_app
from rlserve.service.settings import Settings

pytestmark = pytest.mark.e2e

HELPER = Path(__file__).resolve().parent / "browse_offline.py"


def test_the_docs_page_renders_every_route_without_network(tmp_path: Path) -> None:
    done = run_isolated([sys.executable, str(HELPER), str(tmp_path)], timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["outside"] is None, f"the namespace reached the outside: {report['outside']}"
    assert report["returncode"] == 0, report["stderr"]
    dom = (tmp_path / "dom.html").read_text()
    assert "Failed to load API definition" not in dom
    rendered = set(re.findall(r'class="opblock-summary-path" data-path="([^"]+)"', dom))
    documented = set(create_app(Settings()).openapi()["paths"])
    assert documented and rendered == documented, f"not rendered: {documented - rendered}"
