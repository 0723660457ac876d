"""Integer observations (a uint8 image) stay in their own dtype until their batch is built:
the model still gets float32, cast once per batch (or by a staging runtime's copy), and
answers as it does for the same frames sent as float32."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from rlserve.service.engine.runtime.staging import HostStaging
from rlserve.service.step.batch import BatchStep

pytestmark = pytest.mark.asyncio


def _spy_on(policy):
    """Record the steps of every batch and the obs each runtime call received."""
    steps_seen, obs_seen = [], []
    # The batcher holds ``step.run`` itself; ``_run`` and ``runtime.run`` are looked up per batch.
    run_batch, run_model = policy.step._run, policy.runtime.run

    def step_run(steps):
        steps_seen.append(list(steps))
        return run_batch(steps)

    def model_run(inputs, *, value=True):
        obs_seen.append(inputs["obs"])
        return run_model(inputs, value=value)

    policy.step._run, policy.runtime.run = step_run, model_run
    return steps_seen, obs_seen


async def _act_concurrently(client, frames: np.ndarray, per_request: int) -> list[dict]:
    bodies = [{"observations": frames[i:i + per_request].tolist(), "explore": False, "outputs": ["dist_inputs"]}
              for i in range(0, len(frames), per_request)]
    responses = await asyncio.gather(*(client.post("/v1/models/image/act", json=b) for b in bodies))
    assert [r.status_code for r in responses] == [200] * len(bodies), [r.text for r in responses]
    return [r.json() for r in responses]


async def test_uint8_frames_are_batched_narrow_and_reach_the_model_as_float32(make_client):
    app, client = make_client(("image",), max_batch_delay_ms=50)
    policy = app.state.registry.entry("image").policy()
    assert policy.preparer.narrow_obs and policy.runtime.input_dtypes["obs"] == np.float32
    steps_seen, obs_seen = _spy_on(policy)
    frames = np.random.default_rng(5).integers(0, 256, (12, 10, 10, 3)).astype(np.uint8)

    answers = await _act_concurrently(client, frames, 3)

    assert any(len(steps) > 1 for steps in steps_seen)  # requests shared a batch
    assert {step.obs.dtype for steps in steps_seen for step in steps} == {np.dtype(np.uint8)}
    assert {obs.dtype for obs in obs_seen} == {np.dtype(np.float32)}
    np.testing.assert_array_equal(np.concatenate(obs_seen), frames.astype(np.float32))
    # The same frames as float32 straight into the runtime, one call: the same dist inputs.
    direct = policy.runtime.run({"obs": frames.astype(np.float32)})["dist_inputs"]
    served = np.array([row for answer in answers for row in answer["dist_inputs"]], dtype=np.float32)
    np.testing.assert_allclose(served, direct, rtol=1e-5, atol=1e-6)


class _StagingRuntime:
    """A runtime that copies inputs into host staging blocks, casting there (as the CUDA
    runtimes do), around the served model's real ONNX Runtime (whose spy records what it got)."""

    casts_inputs = True

    def __init__(self, inner):
        self.inner = inner
        self.kind, self.device, self.input_dtypes = inner.kind, inner.device, inner.input_dtypes
        self.staging = HostStaging()
        self.received: list[np.dtype] = []

    def run(self, inputs, *, value=True):
        self.received.append(inputs["obs"].dtype)
        staged = {name: self.staging.stage(name, array, self.input_dtypes[name]) for name, array in inputs.items()}
        return self.inner.run(staged, value=value)


async def test_a_runtime_that_casts_on_staging_gets_the_frames_uint8_and_answers_the_same(make_client):
    app, client = make_client(("image",), max_batch_delay_ms=50)
    policy = app.state.registry.entry("image").policy()
    steps_seen, obs_seen = _spy_on(policy)
    frames = np.random.default_rng(6).integers(0, 256, (8, 10, 10, 3)).astype(np.uint8)
    await _act_concurrently(client, frames, 2)
    staged = _StagingRuntime(policy.runtime)
    step = BatchStep(policy.step.signature, staged, policy.pipeline, policy.sessions, policy.step.mask_layout)

    for steps in list(steps_seen):
        plain = len(obs_seen)
        policy.step.run(steps)  # cast by the batch step
        step.run(steps)  # cast by the staging copy
        np.testing.assert_array_equal(obs_seen[plain], obs_seen[plain + 1])

    assert staged.received and set(staged.received) == {np.dtype(np.uint8)}
