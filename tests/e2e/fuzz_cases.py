"""The catalogue of bad requests for ``test_fuzz_e2e.py``: every one with the 4xx status,
error code and error field it must get.

``Case.bug`` names an entry of ``BUGS`` when the service answers that request wrongly
today; the test keeps asserting the right answer and is marked a strict xfail.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from fuzz_archives import hostile_archives
from fuzz_inputs import ANY, Raw, dumps, mask_blocks, mutations, sample, spaces_of, wrong_actions

LIVE = "fz-live"  # a live session on model "box", created by the fixture
ENDED = "fz-ended"  # a session on "box" the fixture created and deleted (410)
TOKEN = "fz-admin-token"
MAX_BODY = 1 << 20  # RLSERVE_MAX_BODY_BYTES of the fuzz server

BUGS: dict[str, str] = {}  # none known today; see Case.bug


@dataclass(frozen=True)
class Case:
    name: str
    path: str
    body: bytes | None
    status: tuple[int, ...]
    code: str | tuple[str, ...] | None = None  # None: any documented 4xx code
    field: str | None = ANY  # ANY: not checked; None: must be null
    sub: bool = False  # the error may name a path below ``field``
    method: str = "POST"
    headers: tuple[tuple[str, str], ...] = ()
    chunked: bool = False
    bug: str | None = None


def _act(model: str) -> str:
    return f"/v1/models/{model}/act"


def _batch_field(single_field: str, row: int) -> str:
    return f"observations[{row}]" + single_field[len("observation"):]


# --------------------------------------------------------------------------- observations

def observation_cases(model: str, seed: int = 0) -> Iterator[Case]:
    """Every node of the model's observation made wrong, in single and batch form."""
    obs_space, _ = spaces_of(model)
    rng = np.random.default_rng(seed)
    valid = sample(obs_space, rng)
    for i, (label, bad, where, wrong) in enumerate(mutations(obs_space, valid, "observation")):
        common = {"status": (wrong.status,), "code": wrong.code, "sub": wrong.sub}
        yield Case(f"{model}:{label}", _act(model), dumps({"observation": bad}), field=where, **common)
        row = 1 + i % 2  # the bad row is not the first: errors must name its index
        rows = [sample(obs_space, rng) for _ in range(3)]
        rows[row] = bad
        yield Case(f"{model}:batch:{label}", _act(model), dumps({"observations": rows}),
                   field=_batch_field(where, row), **common)


def mask_cases(model: str) -> Iterator[Case]:
    obs_space, act_space = spaces_of(model)
    obs = sample(obs_space, np.random.default_rng(1))
    blocks = mask_blocks(act_space)
    width = sum(blocks)
    bad = {"wrong-length-short": [1] * (width - 1), "wrong-length-long": [1] * (width + 1),
           "two": [2] * width, "half": [0.5] * width, "string": "x" * width, "object": {"a": 1},
           "nested": [[1] * width], "nulls": [None] * width, "negative": [-1] * width}
    cases = [(k, v, "invalid_input") for k, v in bad.items()]
    cases.append(("all-zero", [0] * width, "all_actions_masked"))
    start = 0
    for b, size in enumerate(blocks):  # one categorical part all masked, the others open
        if len(blocks) > 1:
            mask = [1] * width
            mask[start:start + size] = [0] * size
            cases.append((f"block{b}-zero", mask, "all_actions_masked"))
        start += size
    for label, mask, code in cases:
        yield Case(f"{model}:mask:{label}", _act(model), dumps({"observation": obs, "action_mask": mask}),
                   (422,), code, "action_mask")
        yield Case(f"{model}:masks:{label}", _act(model),
                   dumps({"observations": [obs, obs], "action_masks": [None, mask]}),
                   (422,), code, "action_masks[1]")
        if isinstance(obs, dict) and "action_mask" in obs:
            if isinstance(mask, list) and len(mask) == width and code == "invalid_input":
                yield Case(f"{model}:obs-mask:{label}", _act(model),
                           dumps({"observation": {**obs, "action_mask": mask}}),
                           (422,), code, "observation.action_mask")
            if code == "all_actions_masked":
                yield Case(f"{model}:obs-mask:{label}", _act(model),
                           dumps({"observations": [obs, {**obs, "action_mask": mask}]}),
                           (422,), code, "observations[1].action_mask")


def prev_action_cases(model: str) -> Iterator[Case]:
    obs_space, act_space = spaces_of(model)
    obs = sample(obs_space, np.random.default_rng(2))
    for label, action in wrong_actions(act_space):
        yield Case(f"{model}:prev_action:{label}", _act(model), dumps({"observation": obs, "prev_action": action}),
                   (422,), "invalid_input", "prev_action", sub=True)
        yield Case(f"{model}:prev_actions:{label}", _act(model),
                   dumps({"observations": [obs, obs], "prev_actions": [None, action]}),
                   (422,), "invalid_input", "prev_actions[1]", sub=True)


def _b64(fill: float, dtype: type) -> str:
    return base64.b64encode(np.full((42, 42, 3), fill, dtype=dtype).tobytes()).decode()


def b64_cases() -> Iterator[Case]:
    """The image model (42x42x3 uint8) sent as base64 raw bytes."""
    good = {"b64": "AAAA" * (42 * 42 * 3 // 3), "dtype": "uint8", "shape": [42, 42, 3]}
    bad: list[tuple[str, dict[str, Any], str, str | None]] = [
        ("invalid-chars", {**good, "b64": "!!!!"}, "b64", None),
        ("bad-padding", {**good, "b64": "AAA"}, "b64", None),
        ("too-few-bytes", {**good, "b64": "AAAA"}, "b64", None),
        ("too-many-bytes", {**good, "b64": good["b64"] + "AAAA"}, "b64", None),
        ("b64-number", {**good, "b64": 5}, "b64", None),
        ("b64-missing", {"dtype": "uint8", "shape": [42, 42, 3]}, "b64", None),
        ("wrong-dtype-size", {**good, "dtype": "float32"}, "b64", None),
        ("dtype-unknown", {**good, "dtype": "foo"}, "dtype", None),
        ("dtype-complex", {**good, "dtype": "complex64"}, "dtype", None),
        ("dtype-string", {**good, "dtype": "U3"}, "dtype", None),
        ("dtype-object", {**good, "dtype": "O"}, "dtype", None),
        ("dtype-number", {**good, "dtype": 123}, "dtype", None),
        ("dtype-list", {**good, "dtype": ["uint8"]}, "dtype", None),
        ("dtype-structured", {**good, "dtype": {"names": ["a"], "formats": ["u1"]}}, "dtype", None),
        ("dtype-null", {**good, "dtype": None}, "dtype", None),
        ("shape-mismatch", {**good, "shape": [42, 42]}, "shape", None),
        ("shape-transposed", {**good, "shape": [3, 42, 42]}, "shape", None),
        ("shape-strings", {**good, "shape": ["a"]}, "shape", None),
        ("shape-string", {**good, "shape": "abc"}, "shape", None),
        ("shape-int", {**good, "shape": 5}, "shape", None),
        ("shape-null", {**good, "shape": None}, "shape", None),
        ("float-bytes-not-integers", {**good, "b64": _b64(1.5, np.float32), "dtype": "float32"}, "", None),
        ("float-bytes-nan", {**good, "b64": _b64(np.nan, np.float64), "dtype": "float64"}, "", None),
        ("int64-out-of-uint8", {**good, "b64": _b64(300, np.int64), "dtype": "int64"}, "", None),
    ]
    for label, obs, sub, bug in bad:
        field = f"observation.{sub}" if sub else "observation"
        yield Case(f"image:b64:{label}", _act("image"), dumps({"observation": obs}), (422,), "invalid_input",
                   field, bug=bug)
        yield Case(f"image:b64-batch:{label}", _act("image"), dumps({"observations": [good, obs]}), (422,),
                   "invalid_input", _batch_field(field, 1), bug=bug)
    yield Case("image:b64:extra-key", _act("image"), dumps({"observation": {**good, "x": 1}}), (422,),
               "invalid_input", "observation")


# --------------------------------------------------------------------------- request fields

OBS = [0.1, -0.2, 0.3, 0.05]  # a valid "box" observation


def _box(label: str, body: Any, status: int, code: str | None, field: str | None = ANY, *,
         sub: bool = False, bug: str | None = None) -> Case:
    raw = body if isinstance(body, bytes) else dumps(body)
    return Case(f"box:{label}", _act("box"), raw, (status,), code, field, sub=sub, bug=bug)


def field_cases() -> Iterator[Case]:
    """Wrong types and values of every request field, forms and column lengths."""
    one = {"observation": OBS}
    two = {"observations": [OBS, OBS]}
    typed = {  # field -> wrong values (msgspec refuses them at decode: 400 naming the field)
        "session_id": [5, ["a"], {"a": 1}, True], "episode_start": ["yes", 1, None],
        "reward": ["1", True, [1.0], {"r": 1}, Raw("1e400")], "seed": [-1, 1.5, "1", Raw("9" * 5000), [1]],
        "explore": ["yes", 1, [], {}], "clip_actions": [1, "x", []], "unsquash_actions": ["x", 0],
        "debug": [None, 1, "true"], "outputs": ["value", {"value": 1}, None, 5],
    }
    for name, values in typed.items():
        for v in values:
            yield _box(f"{name}={v!r}", {**one, name: v}, 400, "bad_request", name)
    for name, v, where in [
        ("outputs", ["bogus"], "outputs[0]"),
        ("outputs", ["value", 1], "outputs[1]"),
        ("session_ids", [None, 5], "session_ids[1]"),
        ("episode_starts", [True, 1], "episode_starts[1]"),
        ("rewards", [1.0, "x"], "rewards[1]"),
        ("rewards", [1.0, Raw("1e400")], "rewards[1]"),
        ("seeds", [None, -1], "seeds[1]"),
        ("seeds", [1, 2.5], "seeds[1]"),
        ("observations", 5, "observations"),
        ("observations", {"a": OBS}, "observations"),
        ("session_ids", "ab", "session_ids"),
        ("action_masks", 1, "action_masks"),
    ]:
        body = {**(two if name != "outputs" else one), name: v}
        yield _box(f"{name}={v!r}", body, 400, "bad_request", where)
    for unknown in ("obz", "Observation", "session", "observation_", "__proto__"):
        yield _box(f"unknown-field-{unknown}", {**one, unknown: 1}, 400, "bad_request", unknown)
    for column, value in [("session_ids", None), ("episode_starts", False), ("rewards", 0.0),
                          ("prev_actions", None), ("action_masks", None), ("seeds", None)]:
        for n in (1, 3):
            yield _box(f"{column}-length-{n}", {**two, column: [value] * n}, 422, "invalid_input", column)
        yield _box(f"{column}-with-single-form", {**one, column: [value]}, 400, "bad_request", column)
    for name, value in [("session_id", "a"), ("episode_start", True), ("reward", 1.0), ("prev_action", 1),
                        ("action_mask", [1, 1, 1]), ("seed", 1)]:
        yield _box(f"{name}-with-batch-form", {**two, name: value}, 400, "bad_request", name)
    yield _box("both-forms", {**one, **two}, 400, "bad_request", "observation")
    yield _box("no-observation", {"explore": False}, 400, "bad_request", "observation")
    yield _box("empty-object", {}, 400, "bad_request", "observation")
    yield _box("empty-batch", {"observations": []}, 400, "bad_request", "observations")
    # Session ids.
    for label, sid in [("empty", ""), ("129-chars", "x" * 129), ("4096-chars", "x" * 4096)]:
        yield _box(f"session_id-{label}", {**one, "session_id": sid}, 400, "bad_request", "session_id")
        yield _box(f"session_id-{label}-start", {**one, "session_id": sid, "episode_start": True}, 400,
                   "bad_request", "session_id")
        yield _box(f"session_ids-{label}", {**two, "session_ids": [LIVE, sid]}, 400, "bad_request",
                   "session_ids[1]")
    yield _box("session_id-unknown", {**one, "session_id": "fz-unknown"}, 404, "session_not_found", "session_id")
    yield _box("session_id-ended", {**one, "session_id": ENDED}, 410, "session_expired", "session_id")
    yield _box("session_ids-unknown", {**two, "session_ids": [LIVE, "fz-unknown"]}, 404, "session_not_found",
               "session_ids[1]")
    yield _box("session_ids-ended", {**two, "session_ids": [None, ENDED]}, 410, "session_expired",
               "session_ids[1]")
    yield _box("session_ids-twice", {**two, "session_ids": [LIVE, LIVE]}, 400, "bad_request", "session_ids[1]")
    yield _box("session_ids-twice-new", {**two, "session_ids": ["fz-n", "fz-n"], "episode_starts": [True, True]},
               400, "bad_request", "session_ids[1]")
    yield _box("reward-minus-1e400", {**one, "reward": Raw("-1e400")}, 400, "bad_request", "reward")
    for value in (1e39, -3.5e38):  # finite doubles, infinite as the model's float32 prev_reward
        yield _box(f"reward-{value:g}", {**one, "reward": value}, 422, "invalid_input", "reward")
        yield _box(f"rewards-{value:g}", {**two, "rewards": [1.0, value]}, 422, "invalid_input", "rewards[1]")


def transport_cases() -> Iterator[Case]:
    """Bodies that are not a JSON object, broken JSON, non-finite tokens, size, encoding."""
    for label, raw in [("array", b"[]"), ("number", b"1"), ("string", b'"x"'), ("null", b"null"), ("true", b"true"),
                       ("array-of-obs", dumps([{"observation": OBS}]))]:
        yield _box(f"non-object-{label}", raw, 400, ("bad_request", "invalid_json"))
    for label, raw in [
        ("empty", b""),
        ("whitespace", b"   "),
        ("truncated", b'{"observation": [0.1, 0.2'),
        ("trailing-garbage", dumps({"observation": OBS}) + b" x"),
        ("single-quotes", b"{'observation': [0, 0, 0, 0]}"),
        ("comment", b'{"observation": [0, 0, 0, 0]} // hi'),
        ("bom", b"\xef\xbb\xbf" + dumps({"observation": OBS})),
        ("NaN", b'{"observation": [0.1, NaN, 0.3, 0.4]}'),
        ("Infinity", b'{"observation": [0.1, Infinity, 0.3, 0.4]}'),
        ("-Infinity", b'{"observation": [0.1, 0.2, -Infinity, 0.4]}'),
        ("nan-reward", b'{"observation": [0, 0, 0, 0], "reward": NaN}'),
        ("hex-number", b'{"observation": [0x1, 0, 0, 0]}'),
        ("leading-plus", b'{"observation": [+1, 0, 0, 0]}'),
        ("unquoted-key", b"{observation: [0, 0, 0, 0]}"),
        ("nul-byte", b"\x00"),
        ("utf16", dumps({"observation": OBS}).decode().encode("utf-16")),
        ("lone-surrogate-escape", b'{"observation": [0, 0, 0, 0], "session_id": "\\ud800"}'),
        ("deep-nesting", b"[" * 100_000 + b"]" * 100_000),
        ("deep-observation", b'{"observation": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"),
    ]:
        yield _box(f"json-{label}", raw, 400, ("invalid_json", "bad_request"))
    for label, raw in [("session_id", b'{"observation": [0, 0, 0, 0], "session_id": "\xff"}'),
                       ("key", b'{"observation": [0, 0, 0, 0], "\xc3\x28": 1}'),
                       ("outputs", b'{"observation": [0, 0, 0, 0], "outputs": ["\xed\xa0\x80"]}')]:
        yield _box(f"invalid-utf8-{label}", raw, 400, "invalid_json")
    yield Case("disc:invalid-utf8-observation", _act("disc"), b'{"observation": "\xff"}', (400,), "invalid_json")
    big = b'{"observation": [0.1, 0.2, 0.3, 0.4], "session_id": "' + b"x" * (2 * MAX_BODY) + b'"}'
    yield _box("oversized", big, 413, "payload_too_large")
    yield Case("box:oversized-chunked", _act("box"), big, (413,), "payload_too_large", chunked=True)
    padded = b" " * MAX_BODY + dumps({"observation": OBS})  # valid JSON, one byte too many is enough
    yield _box("oversized-whitespace", padded, 413, "payload_too_large")


def route_cases() -> Iterator[Case]:
    """Unknown models, versions, routes and methods."""
    body = dumps({"observation": OBS})
    yield Case("act-unknown-model", _act("nope"), body, (404,), "model_not_found", "model")
    yield Case("act-unknown-model-long", _act("x" * 5000), body, (404,), "model_not_found", "model")
    yield Case("act-unknown-model-pct", "/v1/models/%ff%00/act", body, (404,), "model_not_found", "model")
    yield Case("act-unknown-version", "/v1/models/box/versions/9/act", body, (404,), "model_not_found", "version")
    yield Case("act-version-session-mismatch", "/v1/models/box/versions/9/act",
               dumps({"observation": OBS, "session_id": LIVE}), (404, 409), ("model_not_found", "session_conflict"))
    for method in ("GET", "PUT", "DELETE", "PATCH"):
        yield Case(f"act-{method}", _act("box"), None, (405,), "method_not_allowed", method=method)
    yield Case("unknown-route", "/v1/nope", None, (404,), "not_found", method="GET")
    yield Case("metadata-unknown-model", "/v1/models/nope", None, (404,), "model_not_found", "model", method="GET")
    yield Case("metadata-unknown-version", "/v1/models/box/versions/9", None, (404,), "model_not_found", "version",
               method="GET")


# --------------------------------------------------------------------------- sessions routes

def session_route_cases() -> Iterator[Case]:
    path = "/v1/models/cartpole-memory/sessions"
    json_ct = (("content-type", "application/json"),)

    def post(label: str, raw: bytes, status: int, code: Any, field: Any = ANY, bug: str | None = None) -> Case:
        return Case(f"sessions:{label}", path, raw, (status,), code, field, headers=json_ct, bug=bug)

    for label, body, field in [
        ("id-empty", {"session_id": ""}, "session_id"),
        ("id-number", {"session_id": 5}, "session_id"),
        ("id-129", {"session_id": "x" * 129}, "session_id"),
        ("id-list", {"session_id": ["a"]}, "session_id"),
        ("seed-negative", {"seed": -1}, "seed"),
        ("seed-string", {"seed": "x"}, "seed"),
        ("seed-fraction", {"seed": 1.5}, "seed"),
        ("version-number", {"version": {}}, "version"),
        ("unknown-field", {"zz": 1}, "zz"),
    ]:
        yield post(label, dumps(body), 400, "bad_request", field)
    for label, raw in [("array", b"[]"), ("string", b'"x"'), ("number", b"5")]:
        yield post(f"non-object-{label}", raw, 400, "bad_request")
    yield post("seed-1e400", b'{"seed": 1e400}', 400, "bad_request", "seed")
    yield post("id-1e400", b'{"session_id": 1e400}', 400, "bad_request", "session_id")
    yield post("id-lone-surrogate", b'{"session_id": "\\ud800"}', 400, "bad_request", "session_id")
    yield Case("sessions:version-lone-surrogate", path, b'{"version": "\\ud800"}', (400, 404),
               ("bad_request", "model_not_found"), "version", headers=json_ct)
    for label, raw in [
        ("not-json", b"nope"),
        ("truncated", b'{"seed": 1'),
        ("invalid-utf8", b'{"session_id": "\xff"}'),
        ("deep-nesting", b"[" * 100_000 + b"]" * 100_000),
        ("seed-5000-digits", b'{"seed": ' + b"9" * 5000 + b"}"),
    ]:
        yield post(label, raw, 400, "invalid_json", None)
    yield post("oversized", dumps({"session_id": "x" * (2 * MAX_BODY)}), 413, "payload_too_large")
    yield Case("sessions:id-live", "/v1/models/box/sessions", dumps({"session_id": LIVE}), (409,), "session_conflict",
             "session_id", headers=json_ct)
    yield post("unknown-version", dumps({"version": "9"}), 404, "model_not_found", "version")
    yield Case("sessions:unknown-model", "/v1/models/nope/sessions", b"{}", (404,), "model_not_found", "model",
               headers=json_ct)
    for method in ("GET", "DELETE"):
        yield Case(f"sessions:{method}-unknown", f"{path}/fz-unknown", None, (404,), "session_not_found", "session_id",
                   method=method)
        yield Case(f"sessions:{method}-long", f"{path}/{'x' * 5000}", None, (404,), "session_not_found", "session_id",
                   method=method)
    yield Case("sessions:GET-ended", f"/v1/models/box/sessions/{ENDED}", None, (410,), "session_expired", "session_id",
               method="GET")
    yield Case("sessions:DELETE-ended", f"/v1/models/box/sessions/{ENDED}", None, (410,), "session_expired",
               "session_id", method="DELETE")


# --------------------------------------------------------------------------- admin

def admin_cases() -> Iterator[Case]:
    models = "/v1/admin/models"
    auth = ("authorization", f"Bearer {TOKEN}")
    for label, header in [("none", None), ("basic", f"Basic {TOKEN}"), ("bearer-only", "Bearer"),
                          ("wrong", "Bearer nope"), ("prefix", f"Bearer {TOKEN[:-1]}"), ("longer", f"Bearer {TOKEN}x"),
                          ("lowercase-token", f"Bearer {TOKEN.upper()}")]:
        headers = () if header is None else (("authorization", header),)
        status, code = (
            (403, "forbidden") if label in ("wrong", "prefix", "longer", "lowercase-token") else (401, "unauthorized")
        )
        for route, method, path in [
            ("list", "GET", models),
            ("load", "POST", models),
            ("unload", "DELETE", f"{models}/box"),
            ("metadata", "GET", f"{models}/box/versions/1"),
        ]:
            yield Case(f"admin:auth-{label}:{route}", path, dumps({"path": "box"}) if method == "POST" else None,
                       (status,), code, "Authorization", method=method, headers=headers)
    json_h = (auth, ("content-type", "application/json"))

    def load(label: str, raw: bytes, status: tuple[int, ...], code: Any, field: Any = ANY, bug: str | None = None,
             headers: tuple[tuple[str, str], ...] = json_h) -> Case:
        return Case(f"admin:load-{label}", models, raw, status, code, field, headers=headers, bug=bug)

    yield load("no-path", b"{}", (400,), "bad_request", "path")
    yield load("path-number", b'{"path": 5}', (400,), "bad_request", "path")
    yield load("path-null", b'{"path": null}', (400,), "bad_request", "path")
    yield load("extra-key", b'{"path": "box", "x": 1}', (400,), "bad_request", "x")
    for label, raw in [("not-json", b"not json"), ("array", b"[]"), ("invalid-utf8", b"\xff\xfe"),
                       ("deep", b'{"path": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")]:
        yield load(label, raw, (400,), ("bad_request", "invalid_json"))
    for label, path in [("dotdot", "../.."), ("absolute", "/etc"), ("dotdot-inside", "box/../../..")]:
        yield load(f"outside-{label}", dumps({"path": path}), (400,), "path_outside_repository", "path")
    for label, path in [("missing", "nonexistent"), ("repository-root", ""), ("manifest-file", "box/manifest.json"),
                        ("onnx-file", "box/model.onnx")]:
        yield load(f"not-a-bundle-{label}", dumps({"path": path}), (422,), "bundle_invalid", "path")
    yield load("already-loaded", dumps({"path": "box"}), (409,), "version_conflict", "version")
    yield load("nul-byte", dumps({"path": "a\u0000b"}), (400, 422), None, "path")
    yield load("name-too-long", dumps({"path": "a" * 5000}), (400, 422), None, "path")
    yield load("oversized-json", dumps({"path": "x" * (2 * MAX_BODY)}), (413,), "payload_too_large")
    yield load(
        "content-type-text", b"x", (400,), "bad_request", "Content-Type", headers=(auth, ("content-type", "text/plain"))
    )
    octet = (auth, ("content-type", "application/octet-stream"))
    yield load("upload-empty", b"", (400,), "bad_request", "body", headers=octet)
    yield load("upload-garbage", b"garbage" * 100, (422,), "bundle_invalid", headers=octet)
    for label, raw in hostile_archives().items():
        yield load(f"upload-{label}", raw, (422,), "bundle_invalid", "body", headers=octet)
    yield load("upload-oversized", b"\0" * (2 * MAX_BODY), (413,), "payload_too_large", headers=octet)
    yield Case("admin:load-upload-oversized-chunked", models, b"\0" * (2 * MAX_BODY), (413,), "payload_too_large",
               headers=octet, chunked=True)
    for label, method, path in [("delete-unknown-model", "DELETE", f"{models}/nope"),
                                ("delete-unknown-version", "DELETE", f"{models}/box/versions/9"),
                                ("metadata-unknown-version", "GET", f"{models}/box/versions/9"),
                                ("metadata-unknown-model", "GET", f"{models}/nope/versions/1")]:
        field = "model" if "model" in label else "version"
        yield Case(f"admin:{label}", path, None, (404,), "model_not_found", field, method=method, headers=(auth,))
