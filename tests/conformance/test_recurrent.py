"""LSTM and attention (GTrXL) wrappers against RLlib's recorded trajectories.

Every case of kind ``lstm``/``attention`` in the oracle folder is stepped t = 0..T-1 with
our *own* carried state (starting from the initial state), the recorded observations and
previous actions/rewards; at each step the state we feed, the outputs and the new state
must match RLlib's. LSTM cases that recorded RLlib's training layout (``seqmode/*``) are
also run through ``forward_sequence``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from oracle import OracleCase, assert_close, cases_of_kind, load_case

from conformance.keys_checked import mark_fields, mark_io
from rlserve.models.catalog import build_model, describe_model
from rlserve.models.rllib_import import load_rllib_weights
from rlserve.models.spaces import space_from_json

# custom_recurrent: a custom model that declares its own state (RLlib's TorchRNNModel example).
RECURRENT_KINDS = ("lstm", "attention", "custom_recurrent")
ATOL = 1e-5


CASES = cases_of_kind(*RECURRENT_KINDS)
LSTM_CASES = cases_of_kind("lstm")


def _spaces(case: OracleCase):
    return space_from_json(case.meta["observation_space"]), space_from_json(
        case.meta["action_space"]
    )


def _build(case: OracleCase) -> torch.nn.Module:
    """The model as the catalog builds it from the raw spaces, with RLlib's weights loaded."""
    model = build_model(*_spaces(case), case.meta["model_config"])
    load_rllib_weights(model, case.weights)
    return model.eval()


def _prev_inputs(case: OracleCase, sig, t: int) -> list[torch.Tensor]:
    """Recorded prev actions/rewards of step t in the contract's layout."""
    assert sig.uses_prev_actions == ("prev_actions" in case.io), (
        "prev_actions use differs from RLlib's"
    )
    assert sig.uses_prev_rewards == ("prev_rewards" in case.io), (
        "prev_rewards use differs from RLlib's"
    )
    batch = case.meta["batch_size"]
    window = (sig.prev.n_prev_actions,) if sig.prev.windowed else ()
    inputs = []
    if sig.uses_prev_actions:
        actions = np.asarray(case.io["prev_actions"][t], dtype=np.float32)
        inputs.append(torch.from_numpy(actions.reshape(batch, *window, sig.prev.action_width)))
    if sig.uses_prev_rewards:
        rewards = np.asarray(case.io["prev_rewards"][t], dtype=np.float32)
        shape = (batch, sig.prev.n_prev_rewards) if sig.prev.windowed else (batch,)
        inputs.append(torch.from_numpy(rewards.reshape(shape)))
    return inputs


def _newest_row(case: OracleCase, state: torch.Tensor) -> np.ndarray:
    """What RLlib returns as state_out: LSTM the state itself, attention the new memory row."""
    return state.numpy()[:, -1] if case.kind == "attention" else state.numpy()


@pytest.fixture(params=CASES)
def case(request) -> OracleCase:
    return load_case(request.param)


@pytest.fixture(params=LSTM_CASES)
def lstm_case(request) -> OracleCase:
    return load_case(request.param)


def test_signature_matches_recorded_state(case):
    assert describe_model(*_spaces(case), case.meta["model_config"]) == case.meta["model_class"]
    sig = _build(case).signature()
    state = case.meta["state"]
    assert len(sig.state) == state["num_state_tensors"]
    assert all(s.initial_value == 0.0 for s in sig.state)  # RLlib starts from zeros
    if case.kind in ("lstm", "custom_recurrent"):
        assert [list(s.shape) for s in sig.state] == state["state_shapes_per_row"]
    else:
        assert sig.prev.windowed
        for spec in sig.state:
            assert list(spec.shape) == state["state_in_shape_per_row"]
            assert list(spec.shape[-1:]) == state["state_out_shape_per_row"]
            assert spec.shape[0] == state["memory_inference"]
    assert sig.num_outputs == case.meta["num_outputs"]
    mark_fields(case, "model_class", "state", "num_outputs")


def test_stepwise_trajectory_matches_rllib(case):
    model = _build(case)
    sig = model.signature()
    batch, steps = case.meta["batch_size"], case.meta["T"]
    state = [torch.full((batch, *s.shape), s.initial_value) for s in sig.state]
    compared = set()
    for t in range(steps):
        for i, s in enumerate(state):
            assert_close(
                s.numpy(), case.io[f"state_in/{i}"][t], f"state_in/{i} at t={t}", atol=ATOL
            )
            compared.add(f"state_in/{i}")
        obs = torch.from_numpy(np.ascontiguousarray(case.io["obs_flat"][t]))
        with torch.no_grad():
            logits, value, *state = model(obs, *state, *_prev_inputs(case, sig, t))
        assert_close(logits.numpy(), case.io["model_out"][t], f"model_out at t={t}", atol=ATOL)
        assert_close(value.numpy(), case.io["value"][t], f"value at t={t}", atol=ATOL)
        for i, s in enumerate(state):
            want = case.io[f"state_out/{i}"][t]
            assert_close(_newest_row(case, s), want, f"state_out/{i} at t={t}", atol=ATOL)
            compared.add(f"state_out/{i}")
    fed = [k for k in ("prev_actions", "prev_rewards") if k in case.io]
    mark_io(case, "obs_flat", "model_out", "value", *sorted(compared), *fed)
    mark_fields(case, "batch_size", "T")


def test_lstm_sequence_mode_matches_rllib(lstm_case):
    case = lstm_case
    if "seqmode/model_out" not in case.io:
        pytest.skip("this LSTM case recorded no seqmode/* keys")
    model = _build(case)
    sig = model.signature()
    batch, steps = case.meta["batch_size"], case.meta["T"]
    per_step = [_prev_inputs(case, sig, t) for t in range(steps)]
    prev = [torch.stack([p[k] for p in per_step], dim=1) for k in range(len(per_step[0]))]
    actions = prev[0] if sig.uses_prev_actions else None
    rewards = prev[-1] if sig.uses_prev_rewards else None
    obs = torch.from_numpy(np.ascontiguousarray(np.swapaxes(case.io["obs_flat"], 0, 1)))
    h0, c0 = (torch.zeros(batch, *s.shape) for s in sig.state)
    with torch.no_grad():
        logits, value, h, c = model.forward_sequence(obs, h0, c0, actions, rewards)
    assert_close(
        logits.transpose(0, 1).numpy(), case.io["seqmode/model_out"], "seqmode/model_out", atol=ATOL
    )
    assert_close(
        value.transpose(0, 1).numpy(), case.io["seqmode/value"], "seqmode/value", atol=ATOL
    )
    assert_close(h.numpy(), case.io["seqmode/state_out/0"], "seqmode/state_out/0", atol=ATOL)
    assert_close(c.numpy(), case.io["seqmode/state_out/1"], "seqmode/state_out/1", atol=ATOL)
    assert steps == case.io["seqmode/model_out"].shape[0]
    mark_io(case, "seqmode/model_out", "seqmode/value", "seqmode/state_out/0", "seqmode/state_out/1")
