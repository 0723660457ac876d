"""Bad input never crashes the server or corrupts a session (end to end, bounded fuzzing).

A real ``rlserve serve`` process serves bundles for several observation spaces (Box,
Discrete with start, Dict holding a Tuple with a Discrete leaf, Repeated, a uint8 image,
a Dict carrying an action mask) and action spaces (Discrete, MultiDiscrete, Dict), plus the
embedded cartpole policies. Every malformed request of ``fuzz_cases`` must get its 4xx with
the documented error JSON naming the field, and ``/healthz`` must answer after it. Bad
requests interleaved with a live recurrent session's steps must leave it exactly as a
control session that saw only the good steps. Seeded random requests never get a 5xx.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import quote

import httpx
import numpy as np
import pytest
from fuzz_attacks import DET, batch_attacks, good_steps, session_attacks
from fuzz_cases import (
    BUGS,
    ENDED,
    LIVE,
    MAX_BODY,
    TOKEN,
    Case,
    admin_cases,
    b64_cases,
    field_cases,
    mask_cases,
    observation_cases,
    prev_action_cases,
    route_cases,
    session_route_cases,
    transport_cases,
)
from fuzz_checks import SERVER_PATHS, error_problems, send
from fuzz_inputs import (
    BUNDLES,
    DEFAULT_BUNDLES,
    build_repository,
    dumps,
    random_request,
    sample,
    spaces_of,
)
from server_process import running_server

pytestmark = pytest.mark.e2e
MODELS = [*BUNDLES, *DEFAULT_BUNDLES]
def all_cases() -> list[Case]:
    cases: list[Case] = []
    for model in MODELS:
        cases += [*observation_cases(model), *mask_cases(model), *prev_action_cases(model)]
    cases += [*b64_cases(), *field_cases(), *transport_cases(), *route_cases(), *session_route_cases(), *admin_cases()]
    names = [c.name for c in cases]
    assert len(names) == len(set(names)), "case names must be unique"
    return cases


CASES = all_cases()


def _param(case: Case):
    marks = [pytest.mark.xfail(strict=True, reason=BUGS[case.bug])] if case.bug else []
    return pytest.param(case, id=case.name, marks=marks)


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    root = build_repository(tmp_path_factory, tmp_path_factory.mktemp("fuzz_repo"))
    SERVER_PATHS.update({str(root), str(root.resolve())})
    return root


@contextmanager
def _serve(repo, **env: str) -> Iterator[str]:
    # Log level critical: running_server pipes stderr without reading it while the server
    # runs, so a server logging a traceback per 500 would fill the pipe and block.
    env = {
        "RLSERVE_ADMIN_TOKEN": TOKEN,
        "RLSERVE_MAX_BODY_BYTES": str(MAX_BODY),
        "RLSERVE_LOG_LEVEL": "critical",
        **env,
    }
    with running_server(["--repository", str(repo)], env=env) as url, _client(url) as client:
        assert client.post("/v1/models/box/sessions", json={"session_id": LIVE}).status_code == 201
        assert client.post("/v1/models/box/sessions", json={"session_id": ENDED}).status_code == 201
        assert client.delete(f"/v1/models/box/sessions/{ENDED}").status_code == 200
        yield url


@pytest.fixture(scope="module")
def server(repo) -> Iterator[str]:
    with _serve(repo) as url:
        yield url


def _client(url: str) -> httpx.Client:
    # No keep-alive: a connection the server drops shows up on the request that caused it.
    return httpx.Client(base_url=url, timeout=60.0, limits=httpx.Limits(max_keepalive_connections=0))


@pytest.fixture(scope="module")
def client(server) -> Iterator[httpx.Client]:
    with _client(server) as c:
        yield c


def assert_refused(client: httpx.Client, case: Case) -> httpx.Response:
    resp = send(client, case)
    problems = error_problems(resp, case)
    assert not problems, (
        f"{case.name}: {'; '.join(problems)}\nbody sent: {(case.body or b'')[:200]!r}\nanswer: {resp.text[:400]}"
    )
    assert client.get("/healthz").status_code == 200
    return resp


# --------------------------------------------------------------------------- the catalogue

def test_valid_baselines_are_accepted(client):
    """The valid values the mutations start from are accepted, so each refusal is the mutation's."""
    rng = np.random.default_rng(0)
    for model in MODELS:
        obs_space, _ = spaces_of(model)
        for body in (
            {"observation": sample(obs_space, rng)},
            {"observations": [sample(obs_space, rng) for _ in range(3)]},
        ):
            resp = client.post(f"/v1/models/{model}/act", content=dumps(body))
            assert resp.status_code == 200, (model, resp.text[:300])
    image = {"b64": "AAAA" * (42 * 42), "dtype": "uint8", "shape": [42, 42, 3]}
    assert client.post("/v1/models/image/act", json={"observation": image}).status_code == 200


@pytest.mark.parametrize("case", [_param(c) for c in CASES])
def test_bad_request_gets_its_4xx(client, case):
    assert_refused(client, case)


# The other act paths refuse the same way as the act protocol `rlserve serve` uses by
# default: the raw ASGI handler (RLSERVE_ACT_PROTOCOL=false) and the documented FastAPI
# routes (RLSERVE_FAST_ACT_PATH=false); every request-level, transport, base64 and
# nested-observation case.
FALLBACK_CASES = [c for c in CASES if c.path.endswith("/act")
                  and c.name.split(":")[0] in ("box", "image", "nested", "disc")]


@pytest.fixture(scope="module", params=["RLSERVE_ACT_PROTOCOL", "RLSERVE_FAST_ACT_PATH"],
                ids=["asgi-handler", "fastapi-route"])
def fallback_client(repo, request) -> Iterator[httpx.Client]:
    with _serve(repo, **{request.param: "false"}) as url, _client(url) as c:
        yield c


@pytest.mark.parametrize("case", [_param(c) for c in FALLBACK_CASES])
def test_other_act_paths_refuse_the_same(fallback_client, case):
    assert_refused(fallback_client, case)


# Decode-level refusals carry the field and say what was expected and what was received.
STRUCTURED = [
    Case("explore-string", "/v1/models/box/act", dumps({"observation": [0.1, 0.2, 0.3, 0.4], "explore": "yes"}),
         (400,), "bad_request", "explore"),
    Case("seed-negative", "/v1/models/box/act", dumps({"observation": [0.1, 0.2, 0.3, 0.4], "seed": -1}),
         (400,), "bad_request", "seed"),
    Case("unknown-field", "/v1/models/box/act", dumps({"observation": [0.1, 0.2, 0.3, 0.4], "obz": 1}),
         (400,), "bad_request", "obz"),
    Case("outputs-bogus", "/v1/models/box/act", dumps({"observation": [0.1, 0.2, 0.3, 0.4], "outputs": ["bogus"]}),
         (400,), "bad_request", "outputs[0]"),
    Case("sessions-seed-negative", "/v1/models/box/sessions", dumps({"seed": -1}), (400,), "bad_request", "seed",
         headers=(("content-type", "application/json"),)),
]


@pytest.mark.parametrize("case", [pytest.param(c, id=c.name) for c in STRUCTURED])
def test_decode_errors_say_what_was_expected_and_received(client, case):
    error = assert_refused(client, case).json()["error"]
    assert error["expected"] is not None and error["received"] is not None, error


# --------------------------------------------------------------------------- random requests

RANDOM_PER_MODEL = 400


@pytest.mark.parametrize("model", MODELS)
def test_random_requests_never_get_a_5xx(client, model):
    """Seeded random damage to a valid request: the answer is a 200 or a documented 4xx."""
    rnd = random.Random(f"fuzz-{model}")
    obs_space, _ = spaces_of(model)
    rng = np.random.default_rng(5)
    failures, refused = [], 0
    for _ in range(RANDOM_PER_MODEL):
        body = random_request(rnd, sample(obs_space, rng))
        resp = client.post(f"/v1/models/{model}/act", content=body)
        if resp.status_code == 200:
            answer = resp.json()
            ok = ("action" in answer or "actions" in answer) and answer["model"] == model
            problems = [] if ok else [f"200 without actions: {resp.text[:200]}"]
        else:
            refused += 1
            problems = error_problems(resp, Case("random", "", body, (resp.status_code,)))
        if problems:
            failures.append(f"{body[:300]!r} -> {resp.status_code} {problems} {resp.text[:200]}")
    assert client.get("/healthz").status_code == 200
    assert not failures, "\n".join(failures[:10])
    assert refused > RANDOM_PER_MODEL // 4, "the damage should make most requests invalid"


# --------------------------------------------------------------------------- session integrity

STATEFUL = ["cartpole-memory", "memory"]  # an LSTM; an LSTM that also reads prev action and reward


def _outputs(resp: httpx.Response) -> tuple:
    assert resp.status_code == 200, resp.text[:300]
    answer = resp.json()
    return (answer.get("action", answer.get("actions")), answer["logp"], answer["value"], answer["dist_inputs"])


def _create(client: httpx.Client, model: str, *ids: str) -> None:
    for sid in ids:
        resp = client.post(f"/v1/models/{model}/sessions", json={"session_id": sid, "seed": 1})
        assert resp.status_code == 201, resp.text


def _steps(client: httpx.Client, model: str, sid: str) -> int:
    resp = client.get(f"/v1/models/{model}/sessions/{sid}")
    assert resp.status_code == 200, resp.text
    return resp.json()["steps"]


@pytest.mark.parametrize("model", STATEFUL)
def test_refused_requests_leave_a_session_as_it_was(client, model):
    """A victim session gets every attack before each good step; a control session only
    the good steps. Their outputs must match exactly, step for step."""
    victim, control = f"fz-victim-{model}", f"fz-control-{model}"
    _create(client, model, victim, control)
    act = f"/v1/models/{model}/act"
    steps = good_steps(model, 6, seed=7)
    state_mattered = False
    for t, step in enumerate(steps):
        for attack in session_attacks(model, victim, t):
            assert_refused(client, attack)
        got = _outputs(client.post(act, content=dumps({**step, "session_id": victim})))
        want = _outputs(client.post(act, content=dumps({**step, "session_id": control})))
        assert got == want, f"step {t}: victim {got} != control {want}"
        state_mattered |= _outputs(client.post(act, content=dumps(step))) != want
    assert state_mattered, "the session state never changed an output: corruption would go unseen"
    assert _steps(client, model, victim) == _steps(client, model, control) == len(steps)
    for t in range(len(steps)):
        resp = client.get(f"/v1/models/{model}/sessions/fz-new-{victim}-{t}")
        assert resp.status_code == 404, f"a refused request created session fz-new-{victim}-{t}: {resp.text}"


def test_the_integrity_check_sees_each_kind_of_corruption(client):
    """Each change a refused request could make (an extra step, a reset, a stored reward or
    taken action) changes the next output of the prev-action/reward LSTM, so the exact
    comparison above would catch it."""
    model, act = "memory", "/v1/models/memory/act"
    first, second = good_steps(model, 2, seed=11)
    second = {k: v for k, v in second.items() if k not in ("reward", "prev_action")}
    tweaks = {"extra-step": None, "reset": {"episode_start": True}, "reward": {"reward": 7.5},
              "taken-action": {"prev_action": "other"}}
    _create(client, model, "fz-sens-control", *(f"fz-sens-{k}" for k in tweaks))
    served = _outputs(client.post(act, content=dumps({**first, "session_id": "fz-sens-control"})))[0]
    want = _outputs(client.post(act, content=dumps({**second, "session_id": "fz-sens-control"})))
    for name, tweak in tweaks.items():
        sid = f"fz-sens-{name}"
        client.post(act, content=dumps({**first, "session_id": sid}))
        if tweak is None:
            client.post(act, content=dumps({**first, "session_id": sid}))
            body = {**second, "session_id": sid}
        elif name == "taken-action":
            body = {**second, "session_id": sid, "prev_action": (served + 1) % 3}
        else:
            body = {**second, **tweak, "session_id": sid}
        assert _outputs(client.post(act, content=dumps(body))) != want, f"{name} left the outputs unchanged"



@pytest.mark.parametrize("model", STATEFUL)
def test_a_refused_batch_advances_none_of_its_sessions(client, model):
    victims, controls = [f"fz-bv{i}-{model}" for i in range(2)], [f"fz-bc{i}-{model}" for i in range(2)]
    _create(client, model, *victims, *controls)
    act = f"/v1/models/{model}/act"
    obs_space, _ = spaces_of(model)
    rng = np.random.default_rng(3)
    for t in range(5):
        for attack in batch_attacks(model, victims, t):
            assert_refused(client, attack)
        step = {"observations": [sample(obs_space, rng) for _ in victims], **DET}
        if t % 2:
            step["rewards"] = [0.5, -0.25]
        got = _outputs(client.post(act, content=dumps({**step, "session_ids": victims})))
        want = _outputs(client.post(act, content=dumps({**step, "session_ids": controls})))
        assert got == want, f"step {t}: victims {got} != controls {want}"
    for victim, control in zip(victims, controls, strict=True):
        assert _steps(client, model, victim) == _steps(client, model, control) == 5
    for t in range(5):
        assert client.get(f"/v1/models/{model}/sessions/fz-bnew-{t}").status_code == 404


@pytest.mark.parametrize("model", STATEFUL)
def test_an_overflowing_batch_row_advances_no_session(client, model):
    victim, control = f"fz-ov-victim-{model}", f"fz-ov-control-{model}"
    _create(client, model, victim, control)
    obs_space, _ = spaces_of(model)
    good = sample(obs_space, np.random.default_rng(4))
    huge = [1e39] * len(good)
    assert_refused(client, Case("overflow-row", f"/v1/models/{model}/act",
                                dumps({"observations": [good, huge], "session_ids": [victim, None], **DET}),
                                (422,), "invalid_input", "observations[1]"))
    assert_refused(client, Case("overflow-own-row", f"/v1/models/{model}/act",
                                dumps({"observations": [huge], "session_ids": [victim], **DET}),
                                (422,), "invalid_input", "observations[0]"))
    step = {"observation": good, **DET}
    act = f"/v1/models/{model}/act"
    assert _outputs(client.post(act, content=dumps({**step, "session_id": victim}))) == \
        _outputs(client.post(act, content=dumps({**step, "session_id": control})))


@pytest.mark.parametrize("how", ["act", "create"])
def test_every_accepted_session_id_can_be_addressed(client, how):
    sid = f"fz/{how}"
    if how == "act":
        resp = client.post("/v1/models/box/act", json={"observation": [0.1, 0.2, 0.3, 0.4], "session_id": sid,
                                                       "episode_start": True})
    else:
        resp = client.post("/v1/models/box/sessions", json={"session_id": sid})
    if resp.status_code >= 400:  # refusing such ids is one right answer
        assert not error_problems(resp, Case("slash-id", "", None, (400,), "bad_request", "session_id"))
        return
    path = f"/v1/models/box/sessions/{quote(sid, safe='')}"
    assert client.get(path).status_code == 200
    assert client.delete(path).status_code == 200


# --------------------------------------------------------------------------- shared batches

@pytest.fixture(scope="module")
def batching_url(repo) -> Iterator[str]:
    # A 20 ms batching window: concurrent requests share runtime calls.
    with _serve(repo, RLSERVE_MAX_BATCH_DELAY_MS="20") as url:
        yield url


async def _concurrently(url: str, requests: list[tuple[str, bytes]]) -> list[httpx.Response]:
    async with httpx.AsyncClient(base_url=url, timeout=60.0) as client:
        return await asyncio.gather(*(client.post(path, content=body) for path, body in requests))


def _good_box_requests(n: int) -> list[tuple[str, bytes]]:
    rng = np.random.default_rng(9)
    obs_space, _ = spaces_of("box")
    return [("/v1/models/box/act", dumps({"observation": sample(obs_space, rng), "debug": True, **DET}))
            for _ in range(n)]


def _check_goods(url: str, goods: list[tuple[str, bytes]], answers: list[httpx.Response]) -> None:
    with _client(url) as client:
        for (path, body), resp in zip(goods, answers, strict=True):
            assert resp.status_code == 200, f"a good request sharing a batch got {resp.status_code}: {resp.text[:300]}"
            alone = client.post(path, content=body)  # deterministic: the same answer on its own
            assert _outputs(resp)[1:] == _outputs(alone)[1:]
        assert client.get("/healthz").status_code == 200


def test_bad_requests_never_disturb_good_ones_sharing_a_batch(batching_url):
    bad = [c for c in CASES if c.path == "/v1/models/box/act" and not c.bug and not c.chunked
           and c.body is not None and len(c.body) < MAX_BODY][:40]
    goods = _good_box_requests(40)
    answers = asyncio.run(_concurrently(batching_url, [(c.path, c.body) for c in bad] + goods))
    for case, resp in zip(bad, answers[:len(bad)], strict=True):
        assert not error_problems(resp, case), (case.name, resp.status_code, resp.text[:300])
    _check_goods(batching_url, goods, answers[len(bad):])
    assert max(r.json()["debug"]["batch_requests"] for r in answers[len(bad):]) > 1, "no batch was shared"


def test_an_overflowing_row_never_fails_other_clients(batching_url):
    overflow = ("/v1/models/box/act", dumps({"observations": [[0.1, 0.2, 0.3, 0.4], [1e39] * 4]}))
    goods = _good_box_requests(12)
    answers = asyncio.run(_concurrently(batching_url, [overflow, *goods]))
    _check_goods(batching_url, goods, answers[1:])
    assert not error_problems(answers[0], Case("overflow", "", None, (422,), "invalid_input", "observations[1]"))


# --------------------------------------------------------------------------- afterwards

def test_nothing_stored_was_lost(client):
    """After everything above: every model is still loaded and serving, the fixture's
    sessions are as they were (the live one untouched, the ended one still 410)."""
    assert client.get("/healthz").status_code == 200
    listed = client.get("/v1/admin/models", headers={"authorization": f"Bearer {TOKEN}"})
    assert listed.status_code == 200
    assert sorted(m["name"] for m in listed.json()["models"]) == sorted(MODELS)
    rng = np.random.default_rng(12)
    for model in MODELS:
        resp = client.post(f"/v1/models/{model}/act", content=dumps({"observation": sample(spaces_of(model)[0], rng)}))
        assert resp.status_code == 200, (model, resp.text[:300])
    assert _steps(client, "box", LIVE) == 0
    assert client.get(f"/v1/models/box/sessions/{ENDED}").status_code == 410
