"""Multi-megabyte strings in every string field of every route: no error body larger than a
few KiB, and no server log line either (issue 29).

The routes and their string fields come from the live OpenAPI document of a real ``rlserve
serve``: every path, query and header parameter, every string (or untyped) property of every
JSON request body, nested ones, list items and free-form keys included, an unknown key, and
the headers any request may carry. Each request puts one 2 MiB string in one place of a
request that is otherwise valid, so what refuses it is that field's own check; it is sent
twice, as one long word and as many short ones (the two ways a message could carry it). A
client's long string must be reported by its length, never echoed.
"""

from __future__ import annotations

import http.client
import json
import os
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from plain_http import HTTP
from server_process import ServerProcess

pytestmark = pytest.mark.e2e

TOKEN = "long-strings-admin-token"
SIZE = 2 << 20
STRINGS = {"one word": "x" * SIZE, "many words": "ab " * (SIZE // 3)}
MAX_ERROR_BODY = 4096
# More of a string than any error may repeat (errors.MAX_ECHO is 256 characters).
ECHO = {kind: text[:300].encode() for kind, text in STRINGS.items()}
MAX_LOG_LINE = 20_000  # a bounded traceback (errors.MAX_TRACEBACK) plus the log line's prefix
PATH_VALUES = {"name": "cartpole-memory", "version": "1", "session_id": "live", "episode_id": "live"}
OBS = [0.1, -0.2]
# A valid body per request schema (the batch form where the field is a batch column).
BASES: dict[str, Any] = {
    "ActRequest": {"observation": OBS},
    "ActRequest:batch": {"observations": [OBS]},
    "InferRequest": {"inputs": [{"name": "obs", "shape": [1, 2], "datatype": "FP32", "data": OBS}]},
}
BATCH_COLUMNS = {"observations", "session_ids", "episode_starts", "rewards", "prev_actions", "action_masks",
                 "seeds", "windows"}


@dataclass
class Request:
    label: str
    method: str
    path: str
    params: dict[str, str] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    json: Any = None
    content: bytes | None = None


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    proc = ServerProcess({"RLSERVE_ADMIN_TOKEN": TOKEN, "RLSERVE_LOG_LEVEL": "info"}).start()
    try:
        yield proc
    finally:
        proc.stop()


# --------------------------------------------------------------------------- the document's strings

def _resolve(schema: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        schema = spec["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    return schema


def string_places(schema: dict[str, Any], spec: dict[str, Any], at: tuple[Any, ...] = (),
                  depth: int = 0) -> Iterator[tuple[Any, ...]]:
    """Every place in a JSON body of ``schema`` where a string may go (untyped ones too);
    a free-form object's key is the place ``(..., KEY)``."""
    schema = _resolve(schema, spec)
    branches = [_resolve(s, spec) for s in schema.get("anyOf", schema.get("oneOf", []))]
    options = [schema, *branches]  # a schema's own properties, and each alternative's
    kinds = {s.get("type") for s in branches or [schema]}
    if depth > 6:
        return
    if "string" in kinds or kinds == {None} and not any("properties" in s for s in options):
        yield at
    for option in options:
        for name, child in option.get("properties", {}).items():
            yield from string_places(child, spec, (*at, name), depth + 1)
        if isinstance(option.get("items"), dict):
            yield from string_places(option["items"], spec, (*at, 0), depth + 1)
        if isinstance(option.get("additionalProperties"), dict):
            yield from string_places(option["additionalProperties"], spec, (*at, "sequence_id"), depth + 1)
            yield (*at, KEY)


KEY = object()  # the place of a free-form object's (or an unknown field's) key


def _put(body: Any, place: tuple[Any, ...], value: str) -> Any:
    """A copy of ``body`` with ``value`` at ``place`` (containers made on the way)."""
    if not place:
        return value
    head, rest = place[0], place[1:]
    if head is KEY:
        out = dict(body) if isinstance(body, dict) else {}
        out[value] = 1
        return out
    if isinstance(head, int):
        items = list(body) if isinstance(body, list) and body else [{}]
        items[0] = _put(items[0], rest, value)
        return items
    out = dict(body) if isinstance(body, dict) else {}
    out[head] = _put(out.get(head, {}), rest, value)
    return out


def _base(schema_name: str, place: tuple[Any, ...]) -> Any:
    if schema_name == "ActRequest" and place and place[0] in BATCH_COLUMNS:
        return BASES["ActRequest:batch"]
    return BASES.get(schema_name, {})


def requests_for(spec: dict[str, Any], long: str) -> Iterator[Request]:
    for template, operations in spec["paths"].items():
        for method, op in operations.items():
            yield from _operation(spec, template, method.upper(), op, long)


def _operation(spec: dict[str, Any], template: str, method: str, op: dict[str, Any], long: str) -> Iterator[Request]:
    params = op.get("parameters", [])
    path = template.format(**PATH_VALUES)
    label = f"{method} {template}"
    auth = {"authorization": f"Bearer {TOKEN}"}
    for p in params:
        if p["in"] == "path":
            yield Request(f"{label} path {p['name']}", method,
                          template.format(**{**PATH_VALUES, p["name"]: urllib.parse.quote(long, safe="")}),
                          headers=auth)
        elif p["in"] == "query":
            yield Request(f"{label} query {p['name']}", method, path, params={p["name"]: long}, headers=auth)
        elif p["in"] == "header":
            yield Request(f"{label} header {p['name']}", method, path,
                          headers={**auth, p["name"]: long, "content-type": "application/octet-stream"},
                          content=b"\0" * 8)
    for name in ("authorization", "content-type", "accept"):
        value = f"Bearer {long}" if name == "authorization" else long
        yield Request(f"{label} header {name}", method, path, headers={**auth, name: value},
                      content=b"{}" if method in ("POST", "PUT") else None)
    body = op.get("requestBody", {}).get("content", {}).get("application/json")
    if body is None:
        return
    schema_name = body["schema"].get("$ref", "").rsplit("/", 1)[-1]
    for place in dict.fromkeys([*string_places(body["schema"], spec), (KEY,)]):
        shown = ".".join("<key>" if p is KEY else str(p) for p in place)
        yield Request(f"{label} body {shown}", method, path, headers=auth,
                      json=_put(_base(schema_name, place), place, long))


# --------------------------------------------------------------------------- the test

def _log(proc: ServerProcess) -> str:
    assert proc.log is not None
    fd = proc.log.fileno()
    return os.pread(fd, os.fstat(fd).st_size, 0).decode(errors="replace")


def send(url: str, req: Request) -> tuple[int, bytes]:
    """``req`` over a connection of its own, with http.client: httpx refuses URLs past 64 KiB."""
    parts = urllib.parse.urlsplit(url)
    target = req.path + ("?" + urllib.parse.urlencode(req.params) if req.params else "")
    body = json.dumps(req.json).encode() if req.json is not None else req.content
    headers = {**({"content-type": "application/json"} if req.json is not None else {}), **req.headers}
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=120)
    try:
        conn.request(req.method, target, body=body, headers=headers)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def test_multi_megabyte_strings_in_every_field_get_small_errors_and_small_log_lines(server):
    spec = HTTP.get(f"{server.url}/openapi.json", timeout=30).json()
    created = HTTP.post(f"{server.url}/v1/models/cartpole-memory/sessions", json={"session_id": "live"})
    assert created.status_code == 201
    log_before = len(_log(server))
    sent, too_big, server_errors = 0, {}, {}
    for kind, long in STRINGS.items():
        for req in requests_for(spec, long):
            status, content = send(server.url, req)
            sent += 1
            if status >= 400 and (len(content) > MAX_ERROR_BODY or ECHO[kind] in content):
                too_big[f"{req.label} ({kind})"] = (status, len(content), content[:300])
            if status >= 500 and status != 503:
                server_errors[f"{req.label} ({kind})"] = (status, content[:300])
    assert HTTP.get(f"{server.url}/healthz").status_code == 200
    assert sent > 100, sent  # the document's routes and fields were found
    assert not too_big, too_big
    assert not server_errors, server_errors
    log = _log(server)[log_before:]
    longest = max(log.splitlines(), key=len, default="")
    assert len(longest) <= MAX_LOG_LINE, f"a log line of {len(longest)} characters: {longest[:300]}"
    assert len(log) < 50 * MAX_LOG_LINE, f"{len(log)} characters logged for {sent} requests"
