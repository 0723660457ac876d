"""What every refusal of the end-to-end fuzz tests must look like, and how a case is sent.

A refusal is a documented 4xx with the error JSON (``{"error": {code, message, field,
expected, received}}``), naming the field at fault and none of the server's directories.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import httpx
from fuzz_cases import Case
from fuzz_inputs import ANY, DOCUMENTED_4XX
from server_process import REPO

ERROR_KEYS = {"code", "message", "field", "expected", "received"}
# Directories of the server's machine that no error body may name (clients send paths
# relative to the repository; archive members by name): the temporary directory (the
# server's TMPDIR, and the repository is under it), the checkout, the Python environment.
# The ``repo`` fixture adds the repository itself, however it is spelt.
SERVER_PATHS = {tempfile.gettempdir(), str(Path(tempfile.gettempdir()).resolve()), str(REPO), sys.prefix}


def send(client: httpx.Client, case: Case) -> httpx.Response:
    body = case.body
    if case.chunked and body is not None:
        chunks = [body[i:i + 65536] for i in range(0, len(body), 65536)]
        body = iter(chunks)  # type: ignore[assignment]
    return client.request(case.method, case.path, content=body, headers=dict(case.headers))


def error_problems(resp: httpx.Response, case: Case) -> list[str]:
    """What is wrong with ``resp`` as the answer to ``case`` (empty when it is right)."""
    problems = []
    if resp.status_code not in case.status:
        problems.append(f"status {resp.status_code}, expected {case.status}")
    if not 400 <= resp.status_code < 500:
        problems.append(f"status {resp.status_code} is not a 4xx")
    if not resp.headers.get("content-type", "").startswith("application/json"):
        problems.append(f"content-type {resp.headers.get('content-type')!r}")
    try:
        error = resp.json()["error"]
    except (ValueError, KeyError, TypeError):
        return [*problems, f"body is not the error JSON: {resp.text[:300]!r}"]
    if not isinstance(error, dict) or set(error) != ERROR_KEYS:
        return [*problems, f"error keys {sorted(error) if isinstance(error, dict) else error!r}"]
    codes = (case.code,) if isinstance(case.code, str) else case.code
    if error["code"] not in DOCUMENTED_4XX or (codes is not None and error["code"] not in codes):
        problems.append(f"code {error['code']!r}, expected {codes or 'a documented 4xx code'}")
    if not isinstance(error["message"], str) or not error["message"]:
        problems.append("empty message")
    named = sorted(path for path in SERVER_PATHS if path in resp.text)
    if named:
        problems.append(f"the error names the server's {named}")
    field = error["field"]
    if case.field is not ANY and field != case.field:
        below = case.sub and isinstance(field, str) and field.startswith((f"{case.field}[", f"{case.field}."))
        if not below:
            problems.append(f"field {field!r}, expected {case.field!r}")
    return problems


