"""A policy set's act requests for the multi-agent fuzz test: valid steps of a random
episode, and hostile versions of them that the server must refuse.

The set ``team`` serves two of ``fuzz_inputs``' bundles: ``mem`` (the recurrent ``memory``
bundle: Box(3) observations, Discrete(3) actions, the previous action and reward as model
inputs) and ``ff`` (the feed-forward ``box`` bundle: Box(4) observations, Discrete(3)
actions). ``boss`` and ``red_*`` map to ``mem``, ``blue_*`` to ``ff``; nothing else maps.

Valid steps are drawn from a client-side picture of the episode (which agents hold a seat):
agents join late, act in random subsets, finish with or without a last observation (and
join again), and the episode ends or restarts. Every hostile request is one valid step bent
in one place, so that it must be refused as a whole: ``Hostile.field`` is the error's field
(or a field above it), ``Hostile.codes`` the error codes that fit.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any

from fuzz_inputs import ANY, BUNDLES

MEMBERS = {"mem": "memory", "ff": "box"}  # policy id -> fuzz_inputs bundle
PATTERNS = [("red_*", "mem"), ("blue_*", "ff")]
EXACT = {"boss": "mem"}
POOL = {"boss": "mem", "red_1": "mem", "red_2": "mem", "blue_1": "ff", "blue_2": "ff"}
ACTIONS = 3  # both bundles act in Discrete(3)
BAD_REQUEST, INVALID_INPUT, INVALID_JSON = ("bad_request",), ("invalid_input", "bad_request"), ("invalid_json",)


def observation(rnd: random.Random, agent: str) -> list[float]:
    size = BUNDLES[MEMBERS[POOL[agent]]][0].shape[0]
    return [round(rnd.uniform(-1.0, 1.0), 4) for _ in range(size)]


@dataclass
class EpisodePicture:
    """What the client believes of its episode: started or not, and the seated agents."""

    started: bool = False
    seated: set[str] = field(default_factory=set)

    def step(self, rnd: random.Random) -> dict[str, Any]:
        """A valid step of the episode (without its ``episode_id``)."""
        body: dict[str, Any] = {"explore": True, "agents": {}}
        if not self.started or rnd.random() < 0.05:  # a start, or a restart of the live episode
            body["episode_start"] = True
            if not self.started or rnd.random() < 0.5:
                body["seed"] = rnd.randrange(1 << 20)
        if rnd.random() < 0.3:
            body["outputs"] = ["value"]
        starting = body.get("episode_start", False)
        agents = rnd.sample(sorted(POOL), rnd.randint(1, len(POOL)))
        for agent in agents:
            seated = agent in self.seated and not starting
            step: dict[str, Any] = {"observation": observation(rnd, agent)}
            if seated:
                step["reward"] = round(rnd.uniform(-1.0, 1.0), 3)
                if POOL[agent] == "mem" and rnd.random() < 0.2:  # the environment overrode the action
                    step["prev_action"] = rnd.randrange(ACTIONS)
                roll = rnd.random()
                if roll < 0.08:  # finished, with its last observation
                    step["done"] = True
                    if rnd.random() < 0.5:
                        step["truncated"] = True
                elif roll < 0.12:  # finished after its last action: no observation
                    step = {"done": True, "reward": step["reward"]}
            if "observation" in step and rnd.random() < 0.15:
                mask = [rnd.randint(0, 1) for _ in range(ACTIONS)]
                mask[rnd.randrange(ACTIONS)] = 1
                step["action_mask"] = mask
            body["agents"][agent] = step
        if rnd.random() < 0.06:
            body["episode_end"] = True
        return body

    def answered(self, body: dict[str, Any]) -> None:
        """The step was answered: seats follow it."""
        if body.get("episode_start"):
            self.started, self.seated = True, set()
        for agent, step in body["agents"].items():
            if step.get("done"):
                self.seated.discard(agent)
            else:
                self.seated.add(agent)
        if body.get("episode_end"):
            self.started, self.seated = False, set()


@dataclass
class Hostile:
    name: str
    body: bytes
    field: str  # the error's field, or one above it (ANY: not checked)
    codes: tuple[str, ...] | None = None  # None: any documented 4xx code


def _acting(body: dict[str, Any], rnd: random.Random) -> str | None:
    """An agent of the step that sends an observation."""
    with_obs = [a for a, s in body["agents"].items() if "observation" in s]
    return rnd.choice(with_obs) if with_obs else None


def _bend_observation(rnd: random.Random, body: dict[str, Any]) -> tuple[str, str] | None:
    agent = _acting(body, rnd)
    if agent is None:
        return None
    obs = body["agents"][agent]["observation"]
    how = rnd.choice(["short", "long", "string", "overflow", "nested", "object", "null", "bool-list"])
    i = rnd.randrange(len(obs))
    if how == "short":
        obs.pop()
    elif how == "long":
        obs.append(0.5)
    elif how == "string":
        obs[i] = "0.5"
    elif how == "overflow":  # a finite double that float32 cannot hold
        obs[i] = 1e39
    elif how == "nested":
        obs[i] = [obs[i]]
    elif how == "object":
        body["agents"][agent]["observation"] = {"x": obs}
    elif how == "null":
        body["agents"][agent]["observation"] = None
    else:
        body["agents"][agent]["observation"] = [True] * (len(obs) + 1)
    return f"observation-{how}", f"agents.{agent}.observation"


def _bend_agent(rnd: random.Random, body: dict[str, Any]) -> tuple[str, str] | None:
    agent = rnd.choice(list(body["agents"]))
    step = body["agents"][agent]
    how = rnd.choice(["reward", "prev-action", "mask-length", "mask-zero", "truncated", "unknown", "no-obs",
                      "done-type"])
    if how == "reward":
        step["reward"] = rnd.choice(["high", [1.0], {"r": 1}])
        return "reward", f"agents.{agent}.reward"
    if how == "prev-action":
        if POOL[agent] != "mem" or "observation" not in step:
            return None
        step["prev_action"] = rnd.choice([ACTIONS, -1, 7, "left", [1]])
        return "prev_action", f"agents.{agent}.prev_action"
    if how in ("mask-length", "mask-zero"):
        if "observation" not in step:
            return None
        step["action_mask"] = [1] * (ACTIONS + 2) if how == "mask-length" else [0] * ACTIONS
        return how, f"agents.{agent}.action_mask"
    if how == "truncated":
        if step.get("done") and "observation" in step:
            return None
        step["truncated"] = True
        return "truncated-without-done", f"agents.{agent}.truncated"
    if how == "unknown":
        step[rnd.choice(["obs", "rewards", "session_id", "policy"])] = 1
        return "unknown-agent-field", ANY
    if how == "no-obs":
        if step.get("done"):
            return None
        step.pop("observation", None)
        return "no-observation", f"agents.{agent}.observation"
    step["done"] = "yes"
    return "done-type", f"agents.{agent}.done"


def _bend_request(rnd: random.Random, body: dict[str, Any]) -> tuple[str, str] | None:
    how = rnd.choice(["unmapped", "bad-id", "no-agents", "episode-id", "seed", "outputs", "explore", "unknown",
                      "agents-list"])
    if how == "unmapped":
        agent = rnd.choice(["green_1", "red", "bluee_1", "Boss"])
        body["agents"][agent] = {"observation": [0.1, 0.2, 0.3]}
        return how, f"agents.{agent}"
    if how == "bad-id":
        agent = rnd.choice(["", "x" * 300, "a\x00b", "red_" + "x" * 70])  # empty, too long, unmapped
        body["agents"][agent] = {"observation": [0.1, 0.2, 0.3]}
        return how, "agents"
    if how == "no-agents":
        body["agents"] = {}
        return how, "agents"
    if how == "episode-id":
        body["episode_id"] = rnd.choice([5, ["x"], "", "e" * 5000])
        return how, "episode_id"
    if how == "seed":
        body["seed"] = rnd.choice([-1, "7", 1.5, 1 << 70])
        return how, "seed"
    if how == "outputs":
        body["outputs"] = rnd.choice([["bogus"], "value", [1]])
        return how, "outputs"
    if how == "explore":
        body["explore"] = rnd.choice(["yes", 2, [True]])
        return how, "explore"
    if how == "agents-list":
        body["agents"] = list(body["agents"].values())
        return how, "agents"
    body[rnd.choice(["agent", "observations", "session_id", "episode"])] = 1
    return "unknown-field", ANY


def hostile(rnd: random.Random, valid: dict[str, Any]) -> Hostile:
    """``valid`` (not changed) bent in one place."""
    while True:
        body = json.loads(json.dumps(valid))
        bend = rnd.choice([_bend_observation, _bend_agent, _bend_request, None])
        if bend is None:  # broken JSON: cut short, or a stray byte
            text = json.dumps(valid).encode()
            cut = rnd.randrange(1, len(text))
            bad = text[:cut] if rnd.random() < 0.5 else text[:cut] + b"\xff" + text[cut:]
            return Hostile("broken-json", bad, ANY, INVALID_JSON + BAD_REQUEST)
        made = bend(rnd, body)
        if made is not None:
            name, at = made
            return Hostile(name, json.dumps(body).encode(), at)


# --------------------------------------------------------------------------- episode exports

_HEADER_FIELDS = {"version_len": (10, 2), "steps": (12, 4), "answer_len": (36, 4), "trail_len": (76, 4)}


def damaged_export(rnd: random.Random, exported: bytes) -> tuple[str, bytes]:
    """An episode export (``GET .../episodes/{id}`` as bytes) bent in one place: its bytes,
    its msgpack fields, or one agent's session record (``rlserve.service.sessions.record``)."""
    import msgspec

    how = rnd.choice(["bytes", "truncate", "append", "field", "record", "record-length", "swap-records"])
    if how == "bytes":
        raw = bytearray(exported)
        for _ in range(rnd.randint(1, 4)):
            raw[rnd.randrange(len(raw))] = rnd.randrange(256)
        return how, bytes(raw)
    if how == "truncate":
        return how, exported[:rnd.randrange(len(exported))]
    if how == "append":
        return how, exported + bytes(rnd.randrange(256) for _ in range(rnd.randint(1, 64)))
    body = msgspec.msgpack.decode(exported)
    agent = rnd.choice(sorted(body["records"]))
    if how == "field":
        key = rnd.choice(["seed", "steps", "id", "joins", "seats", "format", "v", "records"])
        body[key] = rnd.choice([-1, "x", (1 << 64) - 1, 1.5, None, [], {agent: -1}, {agent: ["zz", "s"]}, {"": 1}])
        return f"field-{key}", msgspec.msgpack.encode(body)
    record = bytearray(body["records"][agent])
    if how == "record":
        cut = rnd.randrange(len(record))
        record = record[:cut] if rnd.random() < 0.5 else record[:cut] + bytes([rnd.randrange(256)]) + record[cut + 1:]
    elif how == "record-length":  # a length or count in the header that the record does not hold
        name = rnd.choice(sorted(_HEADER_FIELDS))
        offset, size = _HEADER_FIELDS[name]
        record[offset:offset + size] = ((1 << (8 * size)) - rnd.randint(1, 3)).to_bytes(size, "little")
        how = f"record-{name}"
    else:  # another agent's record (of the other policy, when there is one)
        others = [a for a in body["records"] if a != agent]
        if not others:
            return how, msgspec.msgpack.encode(body)
        record = bytearray(body["records"][rnd.choice(others)])
    body["records"][agent] = bytes(record)
    return how, msgspec.msgpack.encode(body)
