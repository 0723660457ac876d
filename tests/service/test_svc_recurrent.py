"""LSTM and GTrXL sessions over HTTP equal the catalog's eager model stepped by hand.

Several sessions are interleaved in one batch per step (checked through the debug batch
ids); one of them reports a taken action that differs from the served one. The reference
keeps its own state, previous-action and previous-reward windows per session, runs the
eager torch model and the numpy distribution on its dist inputs.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import svc_bundles
import torch

from rlserve.models.distributions import get_action_dist
from rlserve.models.distributions.actions import actions_from_json, flatten_actions
from rlserve.models.interface import ModelSignature

pytestmark = pytest.mark.asyncio

K, T = 3, 6
REPORT = {"lstm": (2, 3, [0.3, -0.7]), "gtrxl": (2, 3, 2)}  # (session, step, taken action)


class EagerSession:
    """One episode of the eager model with explicit state and windows (oldest first)."""

    def __init__(self, model, signature: ModelSignature, action_space, config):
        self.model, self.sig, self.space = model, signature, action_space
        self.state = [np.full((1, *s.shape), s.initial_value, np.float32) for s in signature.state]
        prev = signature.prev
        self.actions = np.zeros((max(prev.n_prev_actions, 1), prev.action_width), np.float32)
        self.rewards = np.zeros(max(prev.n_prev_rewards, 1), np.float32)
        self.spec = get_action_dist(action_space, config)

    def step(self, obs, reward, taken_override):
        if reward is not None:
            self.rewards[-1] = reward
        if taken_override is not None:
            self.actions[-1] = flatten_actions(self.space, actions_from_json(self.space, taken_override))[0]
        inputs = {"obs": np.asarray([obs], np.float32)}
        inputs.update({f"state_in_{i}": s for i, s in enumerate(self.state)})
        windowed = self.sig.prev.windowed
        if self.sig.uses_prev_actions:
            inputs["prev_actions"] = self.actions[None] if windowed else self.actions[-1:]
        if self.sig.uses_prev_rewards:
            inputs["prev_rewards"] = self.rewards[None] if windowed else self.rewards[-1:]
        with torch.no_grad():
            outs = self.model(*(torch.from_numpy(np.ascontiguousarray(inputs[n])) for n in self.sig.input_names))
        outs = [o.numpy() for o in outs]
        dist = self.spec.build(outs[0])
        action = dist.deterministic_sample()
        logp = dist.logp(action)
        self.state = outs[2:]
        self.actions = np.concatenate([self.actions[1:], flatten_actions(self.space, action)])
        self.rewards = np.concatenate([self.rewards[1:], [0.0]]).astype(np.float32)
        return action, float(logp[0]), outs[0][0]


@pytest.mark.parametrize("name", ["lstm", "gtrxl"])
async def test_sessions_in_one_batch_equal_eager_stepping(make_client, name):
    _, client = make_client((name,), max_batch_size=K, max_batch_delay_ms=10_000)
    spec = svc_bundles.SPECS[name]
    model = svc_bundles.build_model(name).eval()
    eager = [EagerSession(model, model.signature(), spec["act"], spec["config"]) for _ in range(K + 1)]
    shadow = eager.pop()  # the reporting session as if it had not reported
    rng = np.random.default_rng(11)
    observations = rng.uniform(-1, 1, (T, K, 4)).astype(np.float32)
    rewards = rng.normal(0, 1, (T, K)).round(3)
    report_session, report_step, taken = REPORT[name]

    for t in range(T):
        payloads = []
        for k in range(K):
            payload = {"observation": observations[t, k].tolist(), "session_id": f"{name}-{k}", "explore": False,
                       "episode_start": t == 0, "debug": True, "outputs": ["dist_inputs"]}
            if t > 0:
                payload["reward"] = float(rewards[t - 1, k])
            if (k, t) == (report_session, report_step):
                payload["prev_action"] = taken
            payloads.append(payload)
        responses = await asyncio.gather(*(client.post(f"/v1/models/{name}/act", json=p) for p in payloads))
        bodies = [r.json() for r in responses]
        assert all(r.status_code == 200 for r in responses), bodies
        assert len({b["debug"]["batch_id"] for b in bodies}) == 1, "the K sessions did not share a batch"
        for k, body in enumerate(bodies):
            override = taken if (k, t) == (report_session, report_step) else None
            action, logp, dist_inputs = eager[k].step(observations[t, k], rewards[t - 1, k] if t else None, override)
            if k == report_session:
                _, _, ignored = shadow.step(observations[t, k], rewards[t - 1, k] if t else None, None)
                if t == report_step:  # the report must matter, or this test proves nothing
                    assert not np.allclose(ignored, dist_inputs, rtol=1e-4)
            np.testing.assert_allclose(body["dist_inputs"], dist_inputs, rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(np.asarray(body["action"], np.float64).reshape(-1),
                                       np.asarray(action, np.float64).reshape(-1), rtol=1e-5, atol=1e-5)
            assert body["logp"] == pytest.approx(logp, rel=1e-4, abs=1e-4)
