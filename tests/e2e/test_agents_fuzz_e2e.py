"""Hostile steps never change a multi-agent episode (end to end, seeded fuzzing of a policy set).

A real ``rlserve serve`` process serves a policy set of a recurrent and a feed-forward
policy (``fuzz_agents``). Two episodes play the same random valid steps with the same seed,
sampling on: the control episode gets only those, the subject episode gets one to three
hostile versions of each step before it (``fuzz_agents.hostile``), each of which must be
refused with a documented 4xx and the error JSON naming its field. Every answer of the
subject episode must then equal the control's (each agent's policy, sampled action, logp,
value), and so must the episodes as the server describes them: a refused step changed no
agent's state, no sampler, no seat and no step count. Random byte damage to steps of a
third episode gets a 200 or a documented 4xx, never a 5xx.

The seeds: a fixed few, and one drawn afresh each run (``RLSERVE_FUZZ_SEED`` replays one);
a failure names its seed.
"""

from __future__ import annotations

import json
import math
import os
import random
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest
from fuzz_agents import EXACT, MEMBERS, PATTERNS, POOL, EpisodePicture, damaged_export, hostile, observation
from fuzz_cases import Case
from fuzz_checks import error_problems
from fuzz_inputs import ANY, export_bundles, random_request
from server_process import running_server

pytestmark = pytest.mark.e2e
ACT = "/v1/models/team/agents/act"
EPISODE = "/v1/models/team/episodes/"
OCTET = {"content-type": "application/octet-stream", "accept": "application/octet-stream"}
JSON = {"content-type": "application/json"}
# A hostile step racing the valid one may find the episode ended or in flight (and is refused for that).
EPISODE_STATES = {"session_expired", "session_conflict", "session_not_found"}
EPISODES, STEPS = 3, 25


@pytest.fixture(scope="module")
def team_set(tmp_path_factory) -> Path:
    """The set's two bundles exported (once for both stores) and the set made of them."""
    from rlserve.models.export.policy_set_export import policy_set_from_bundles
    from rlserve.models.multiagent.mapping import AgentMapping

    root = tmp_path_factory.mktemp("agents_fuzz")
    export_bundles(tmp_path_factory, root / "bundles", MEMBERS.values())
    (root / "repo").mkdir()
    with policy_set_from_bundles({p: root / "bundles" / b for p, b in MEMBERS.items()}, root / "team",
                                 AgentMapping(dict(EXACT), list(PATTERNS), None), name="team"):
        pass
    return root


@pytest.fixture(scope="module", params=["in-process", "redis"])
def server(team_set, tmp_path_factory, request) -> Iterator[str]:
    """The set served with its episodes and agents' sessions in process, or in a real redis-server."""
    from redis_server import running_redis

    env = {"RLSERVE_POLICY_SETS": json.dumps([str(team_set / "team")]), "RLSERVE_LOG_LEVEL": "critical"}
    with ExitStack() as stack:
        if request.param == "redis":
            redis = stack.enter_context(running_redis(tmp_path_factory.mktemp("agents_fuzz_redis")))
            env["RLSERVE_SESSION_STORE"] = redis.url
        yield stack.enter_context(running_server(["--repository", str(team_set / "repo")], env=env))


def _seed(which: str) -> int:
    if which != "fresh":
        return int(which)
    return int(os.environ.get("RLSERVE_FUZZ_SEED") or random.SystemRandom().randrange(1 << 32))


def _same_answers(subject: dict, control: dict) -> list[str]:
    """How the subject episode's answer differs from the control's (ids aside)."""
    problems = []
    if subject.get("episode_ended", False) != control.get("episode_ended", False):
        problems.append(f"episode_ended {subject.get('episode_ended')} vs {control.get('episode_ended')}")
    if list(subject["agents"]) != list(control["agents"]):
        return [*problems, f"agents {list(subject['agents'])} vs {list(control['agents'])}"]
    for agent, mine in subject["agents"].items():
        theirs = control["agents"][agent]
        if set(mine) != set(theirs) or mine.get("policy") != theirs.get("policy") \
                or mine.get("action") != theirs.get("action") or mine.get("done") != theirs.get("done"):
            problems.append(f"{agent}: {mine} vs {theirs}")
            continue
        for key in ("logp", "value"):
            if key in mine and not math.isclose(mine[key], theirs[key], rel_tol=1e-6, abs_tol=1e-7):
                problems.append(f"{agent}.{key}: {mine[key]} vs {theirs[key]}")
    return problems


def _described(client: httpx.Client, episode_id: str) -> dict | int:
    """The episode as the server describes it, without what names or times it."""
    resp = client.get(f"/v1/models/team/episodes/{episode_id}")
    if resp.status_code != 200:
        return resp.status_code
    info = resp.json()
    for key in ("episode_id", "idle_s"):
        info.pop(key)
    info["agents"] = {a: {k: v for k, v in seat.items() if k not in ("session_id", "idle_s")}
                      for a, seat in info["agents"].items()}
    return info


def _code(resp: httpx.Response) -> str | None:
    try:
        return resp.json()["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return None


def _any_4xx(resp: httpx.Response) -> tuple[int, ...]:
    return (resp.status_code,) if 400 <= resp.status_code < 500 else (400, 422)


def _refusal_problems(resp: httpx.Response, bad, raced: bool) -> list[str]:
    field = bad.field
    if raced and _code(resp) in EPISODE_STATES:  # the valid step it raced changed the episode first
        field = ANY
    problems = error_problems(resp, Case(bad.name, ACT, bad.body, _any_4xx(resp), bad.codes, field, sub=True))
    if len(resp.content) > 4096:
        problems.append(f"an error body of {len(resp.content)} bytes")
    return problems


@pytest.mark.parametrize("which", ["0", "1", "2", "fresh"])
def test_hostile_steps_leave_the_episode_as_a_control_episode(server, which):
    seed = _seed(which)
    rnd = random.Random(seed)
    failures: list[str] = []
    with httpx.Client(base_url=server, timeout=60.0) as client:
        for k in range(EPISODES):
            subject, control, picture = f"subject-{seed}-{k}", f"control-{seed}-{k}", EpisodePicture()
            for t in range(STEPS):
                valid = picture.step(rnd)
                bads = [hostile(rnd, valid) for _ in range(rnd.choice([1, 1, 2, 3]))]
                texts = [bad.body.replace(b'"agents"', b'"episode_id": "%s", "agents"' % subject.encode(), 1)
                         for bad in bads]
                together = rnd.random() < 0.3  # the hostile steps race the valid one, else come first
                with ThreadPoolExecutor(len(bads) + 1) as pool:
                    refused = [pool.submit(client.post, ACT, content=text, headers=JSON) for text in texts]
                    if not together:
                        for future in refused:
                            future.result()
                    answers = [pool.submit(client.post, ACT, json={"episode_id": episode, **valid})
                               for episode in (subject, control)]
                    refused, answers = [f.result() for f in refused], [f.result() for f in answers]
                for bad, text, resp in zip(bads, texts, refused, strict=True):
                    problems = _refusal_problems(resp, bad, together)
                    if problems:
                        failures.append(f"episode {k} step {t} {bad.name}: {problems}\n  sent {text[:300]!r}"
                                        f"\n  got {resp.status_code} {resp.text[:300]}")
                if [a.status_code for a in answers] != [200, 200]:
                    failures.append(f"episode {k} step {t}: a valid step got {[a.status_code for a in answers]}: "
                                    f"{answers[0].text[:300]}\n  sent {valid}")
                    break
                differ = _same_answers(answers[0].json(), answers[1].json())
                described = [_described(client, episode) for episode in (subject, control)]
                if differ or described[0] != described[1]:
                    failures.append(f"episode {k} step {t}: the subject episode moved apart from the control: "
                                    f"{differ or described}")
                    break
                picture.answered(valid)
                if failures:
                    break
            if failures:
                break
        assert client.get("/healthz").status_code == 200
    assert not failures, f"seed {seed} (RLSERVE_FUZZ_SEED={seed} replays it):\n" + "\n".join(failures[:10])


def test_random_damage_to_steps_never_gets_a_5xx(server):
    seed = _seed("fresh")
    rnd, picture = random.Random(seed), EpisodePicture()
    failures = []
    with httpx.Client(base_url=server, timeout=60.0) as client:
        for t in range(150):
            valid = {"episode_id": f"scratch-{seed}", **picture.step(rnd)}
            if rnd.random() < 0.5:
                body = json.dumps(valid).encode()
                resp = client.post(ACT, content=body, headers={"content-type": "application/json"})
                if resp.status_code == 200:
                    picture.answered(valid)
                continue
            text = json.dumps(valid).encode()
            if rnd.random() < 0.5:  # one agent's step bent as fuzz_inputs bends a single act body
                agent = rnd.choice(list(valid["agents"]))
                step = random_request(rnd, valid["agents"][agent].get("observation", [0.0]))
                text = json.dumps({**valid, "agents": {**valid["agents"], agent: "@@"}}).encode().replace(
                    b'"@@"', step)
            else:  # one to three bytes of the valid body replaced
                raw = bytearray(text)
                for _ in range(rnd.randint(1, 3)):
                    raw[rnd.randrange(len(raw))] = rnd.choice(b'{}[],:"0-.e\xff a')
                text = bytes(raw)
            resp = client.post(ACT, content=text, headers={"content-type": "application/json"})
            if resp.status_code != 200:
                problems = error_problems(resp, Case("random", ACT, text, _any_4xx(resp), None, ANY))
                if problems:
                    failures.append(f"step {t}: {problems} sent {text[:300]!r} got {resp.text[:300]}")
        assert client.get("/healthz").status_code == 200
    assert not failures, f"seed {seed} (RLSERVE_FUZZ_SEED={seed} replays it):\n" + "\n".join(failures[:10])


def test_damaged_episode_imports_are_refused_or_play_on(server):
    """An exported episode bent in one place (``fuzz_agents.damaged_export``) and imported
    under a new id: a documented 4xx, or a 200 whose episode then answers a step (or refuses
    it with a 4xx), never a 5xx. The episode it was exported from, and a copy imported
    before, answer their next step alike afterwards."""
    seed = _seed("fresh")
    rnd, picture = random.Random(seed), EpisodePicture()
    failures = []
    with httpx.Client(base_url=server, timeout=60.0) as client:
        origin = f"origin-{seed}"
        while not picture.seated or not picture.started:  # an episode with agents of both policies
            valid = picture.step(rnd)
            valid.pop("episode_end", None)
            assert client.post(ACT, json={"episode_id": origin, **valid}).status_code == 200
            picture.answered(valid)
        exported = client.get(EPISODE + origin, headers=OCTET).content
        assert client.put(EPISODE + f"copy-{seed}", content=exported, headers=OCTET).status_code == 200
        for i in range(120):
            how, body = damaged_export(rnd, exported)
            target = f"imp-{seed}-{i}"
            resp = client.put(EPISODE + target, content=body, headers=OCTET)
            if resp.status_code != 200:
                problems = error_problems(resp, Case(how, EPISODE, body, _any_4xx(resp), None, ANY))
                if problems:
                    failures.append(f"import {i} ({how}): {problems} got {resp.text[:300]}")
                continue
            seats = resp.json()["agents"]
            if seats:
                step = {agent: {"observation": observation(rnd, agent) if agent in POOL else [0.0]} for agent in seats}
                answer = client.post(ACT, json={"episode_id": target, "agents": step})
                if answer.status_code != 200:
                    problems = error_problems(answer, Case(how, ACT, b"", _any_4xx(answer), None, ANY))
                    if problems:
                        failures.append(f"a step of import {i} ({how}): {problems} got {answer.text[:300]}")
            client.delete(EPISODE + target)
        step = {"explore": True, "agents": {a: {"observation": observation(rnd, a)} for a in sorted(picture.seated)}}
        answers = [client.post(ACT, json={"episode_id": e, **step}) for e in (origin, f"copy-{seed}")]
        assert [a.status_code for a in answers] == [200, 200], answers[0].text
        assert not _same_answers(answers[0].json(), answers[1].json())
        assert client.get("/healthz").status_code == 200
    assert not failures, f"seed {seed} (RLSERVE_FUZZ_SEED={seed} replays it):\n" + "\n".join(failures[:10])
