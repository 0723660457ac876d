"""ONNX Runtime's intra-op threads: RLSERVE_INTRA_OP_THREADS reaches the session, its pool
threads sleep between calls unless RLSERVE_INTRA_OP_SPINNING says otherwise, and more
threads give the same answers."""

from __future__ import annotations

import numpy as np
import pytest

from rlserve.service.serving.loading import load_policy
from rlserve.service.settings import Settings


def _options(policy):
    sessions = [policy.runtime._session, policy.runtime._policy_session]
    return [s.get_session_options() for s in sessions if s is not None]


@pytest.mark.parametrize("spinning", [False, True])
def test_the_thread_settings_reach_every_onnx_session(bundle_store, monkeypatch, spinning):
    monkeypatch.setenv("RLSERVE_INTRA_OP_THREADS", "2")
    monkeypatch.setenv("RLSERVE_INTRA_OP_SPINNING", str(spinning).lower())
    policy = load_policy(bundle_store / "mlp", Settings(runtime="onnx"))
    options = _options(policy)
    assert len(options) == 2  # the full graph and the pruned policy graph
    for opts in options:
        assert opts.intra_op_num_threads == 2
        assert opts.get_session_config_entry("session.intra_op.allow_spinning") == ("1" if spinning else "0")


def test_the_default_is_one_thread_that_does_not_spin(bundle_store):
    for opts in _options(load_policy(bundle_store / "mlp", Settings(runtime="onnx"))):
        assert opts.intra_op_num_threads == 1
        assert opts.get_session_config_entry("session.intra_op.allow_spinning") == "0"


def test_two_threads_answer_as_one(bundle_store):
    obs = np.random.default_rng(3).uniform(-1, 1, (2048, 4)).astype(np.float32)
    one = load_policy(bundle_store / "mlp", Settings(runtime="onnx", intra_op_threads=1)).runtime.run({"obs": obs})
    two = load_policy(bundle_store / "mlp", Settings(runtime="onnx", intra_op_threads=2)).runtime.run({"obs": obs})
    assert set(one) == set(two)
    for name in one:
        np.testing.assert_allclose(two[name], one[name], rtol=1e-6, atol=1e-6)
