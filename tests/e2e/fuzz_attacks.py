"""Refused requests aimed at live sessions, for the session-integrity tests of
``test_fuzz_e2e.py``: each carries valid values (a reward, a taken action, a reset, a seed)
that would change the session if the service applied any part of a refused request.
"""

from __future__ import annotations

import numpy as np
from fuzz_cases import MAX_BODY, Case
from fuzz_inputs import ANY, Raw, dumps, mask_blocks, sample, spaces_of

DET = {"explore": False, "outputs": ["value", "dist_inputs"]}
JSON_CT = (("content-type", "application/json"),)


def good_steps(model: str, n: int, seed: int) -> list[dict]:
    """Deterministic good steps (no session id). Reward and prev_action only on some steps,
    so one leaked by a refused request would change the next step's inputs."""
    obs_space, act_space = spaces_of(model)
    rng = np.random.default_rng(seed)
    steps = []
    for t in range(n):
        body = {"observation": sample(obs_space, rng), **DET}
        if t % 2 == 1:
            body["reward"] = round(float(rng.uniform(-1, 1)), 3)
        if t % 3 == 2:
            body["prev_action"] = sample(act_space, rng)
        steps.append(body)
    return steps


def session_attacks(model: str, sid: str, t: int) -> list[Case]:
    """Refused requests aimed at live session ``sid``; each carries valid values (a reward,
    a taken action, a reset, a seed) that would change the session if applied."""
    obs_space, act_space = spaces_of(model)
    rng = np.random.default_rng(100 + t)
    good = sample(obs_space, rng)
    bad = good[:-1]  # a Box observation one entry short
    width = sum(mask_blocks(act_space))
    taken = sample(act_space, rng)
    leak = {"reward": 7.5, "prev_action": taken}
    one = {"observation": good, "session_id": sid, **DET}
    two = {"observations": [good, good], **DET}
    act = f"/v1/models/{model}/act"

    def case(label, body, status, code, field=ANY, path=act, headers=()):
        raw = body if isinstance(body, bytes) else dumps(body)
        statuses = status if isinstance(status, tuple) else (status,)
        return Case(f"{model}:{sid}:{t}:{label}", path, raw, statuses, code, field, headers=headers)

    return [
        case(
            "bad-obs-and-start",
            {**one, **leak, "observation": bad, "episode_start": True, "seed": 3},
            422,
            "invalid_input",
            "observation",
        ),
        case("bad-obs", {**one, **leak, "observation": bad}, 422, "invalid_input", "observation"),
        case("all-masked", {**one, **leak, "action_mask": [0] * width}, 422, "all_actions_masked", "action_mask"),
        case("mask-too-long", {**one, **leak, "action_mask": [1] * (width + 1)}, 422, "invalid_input", "action_mask"),
        case(
            "prev-action-out-of-range", {**one, "reward": 7.5, "prev_action": 99}, 422, "invalid_input", "prev_action"
        ),
        case("reward-1e400", {**one, "prev_action": taken, "reward": Raw("1e400")}, 400, "bad_request", "reward"),
        case("reward-string", {**one, "prev_action": taken, "reward": "7.5"}, 400, "bad_request", "reward"),
        case("start-negative-seed", {**one, **leak, "episode_start": True, "seed": -1}, 400, "bad_request", "seed"),
        case(
            "start-bad-outputs",
            {**one, **leak, "episode_start": True, "outputs": ["bogus"]},
            400,
            "bad_request",
            "outputs[0]",
        ),
        case(
            "start-bad-explore", {**one, **leak, "episode_start": True, "explore": "no"}, 400, "bad_request", "explore"
        ),
        case("start-unknown-field", {**one, **leak, "episode_start": True, "zz": 1}, 400, "bad_request", "zz"),
        case(
            "start-unknown-version",
            {**one, **leak, "episode_start": True},
            (404, 409),
            ("model_not_found", "session_conflict"),
            path=f"/v1/models/{model}/versions/9/act",
        ),
        case("start-oversized", {**one, **leak, "episode_start": True, "zz": "x" * MAX_BODY}, 413, "payload_too_large"),
        case(
            "create-again",
            {"session_id": sid, "seed": 5},
            409,
            "session_conflict",
            "session_id",
            path=f"/v1/models/{model}/sessions",
            headers=JSON_CT,
        ),
        case(
            "batch-bad-row-new-session",
            {
                **two,
                "observations": [good, bad],
                "session_ids": [sid, f"fz-new-{sid}-{t}"],
                "episode_starts": [True, True],
                "rewards": [7.5, None],
                "prev_actions": [taken, None],
            },
            422,
            "invalid_input",
            "observations[1]",
        ),
        case(
            "batch-unknown-session",
            {**two, "session_ids": [sid, "fz-unknown"], "rewards": [7.5, None]},
            404,
            "session_not_found",
        ),
        case(
            "batch-session-twice",
            {**two, "session_ids": [sid, sid], "rewards": [7.5, None]},
            400,
            "bad_request",
            "session_ids[1]",
        ),
        case(
            "batch-mask-row",
            {**two, "session_ids": [sid, None], "rewards": [7.5, None], "action_masks": [None, [0] * width]},
            422,
            "all_actions_masked",
            "action_masks[1]",
        ),
        case(
            "batch-seed-row",
            {**two, "session_ids": [sid, None], "episode_starts": [True, False], "seeds": [None, -1]},
            400,
            "bad_request",
            "seeds[1]",
        ),
        case(
            "batch-prev-action-row",
            {**two, "session_ids": [sid, None], "rewards": [7.5, None], "prev_actions": [taken, 99]},
            422,
            "invalid_input",
            "prev_actions[1]",
        ),
        case(
            "batch-column-length", {**two, "session_ids": [sid, None], "rewards": [7.5]}, 422, "invalid_input",
            "rewards",
        ),
    ]



def batch_attacks(model: str, sids: list[str], t: int) -> list[Case]:
    """Refused batch requests holding the sessions ``sids`` (one bad row, column or field)."""
    obs_space, act_space = spaces_of(model)
    rng = np.random.default_rng(200 + t)
    rows = [sample(obs_space, rng) for _ in sids]
    bad = rows[0][:-1]
    width = sum(mask_blocks(act_space))
    taken = [sample(act_space, rng) for _ in sids]
    base = {"observations": rows, "session_ids": sids, "rewards": [7.5] * len(sids), "prev_actions": taken, **DET}
    act = f"/v1/models/{model}/act"

    def case(label, body, status, code, field):
        return Case(f"{model}:batch:{t}:{label}", act, dumps(body), (status,), code, field)

    return [
        case(
            "extra-bad-row",
            {
                **base,
                "observations": [*rows, bad],
                "session_ids": [*sids, None],
                "rewards": [7.5] * len(sids) + [None],
                "prev_actions": [*taken, None],
            },
            422,
            "invalid_input",
            f"observations[{len(sids)}]",
        ),
        case(
            "bad-row-new-session",
            {
                **base,
                "observations": [*rows, bad],
                "session_ids": [*sids, f"fz-bnew-{t}"],
                "episode_starts": [True] * (len(sids) + 1),
                "rewards": [7.5] * len(sids) + [None],
                "prev_actions": [*taken, None],
            },
            422,
            "invalid_input",
            f"observations[{len(sids)}]",
        ),
        case("reward-1e400", {**base, "rewards": [1.0, Raw("1e400")]}, 400, "bad_request", "rewards[1]"),
        case("mask-row", {**base, "action_masks": [None, [0] * width]}, 422, "all_actions_masked", "action_masks[1]"),
        case("prev-action-row", {**base, "prev_actions": [taken[0], 99]}, 422, "invalid_input", "prev_actions[1]"),
        case(
            "starts-with-bad-seed",
            {**base, "episode_starts": [True, True], "seeds": [1, -1]},
            400,
            "bad_request",
            "seeds[1]",
        ),
        case("column-too-long", {**base, "session_ids": [*sids, None]}, 422, "invalid_input", "session_ids"),
        case(
            "bad-outputs",
            {**base, "episode_starts": [True, True], "outputs": ["value", "logits"]},
            400,
            "bad_request",
            "outputs[1]",
        ),
    ]

