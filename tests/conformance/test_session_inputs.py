"""The server's per-session bookkeeping rebuilds RLlib's recurrent inputs from what it sees.

A recurrent case records, per step, the action RLlib sampled (``actions_taken``) and the
reward that followed (``rewards``): they become the next step's ``prev_actions`` /
``prev_rewards`` (windows, oldest first, for attention). The server never receives those
windows; it keeps them in ``rlserve.service.sessions.slabs.SessionSlabs``. Here the slabs are driven the
way ``rlserve.service.step.batch`` drives them (reset at the episode start, report the last step's
reward, gather, run the model, scatter the new state and the flattened sampled action) and
every gathered input must equal what RLlib fed at that step, state included.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from oracle import OracleCase, assert_close, cases_of_kind, load_case

from conformance.keys_checked import mark_io
from rlserve.models.catalog import build_model
from rlserve.models.distributions.actions import flatten_actions
from rlserve.models.distributions.structure import leaf_paths, path_str, unflatten_leaves
from rlserve.models.rllib_import import load_rllib_weights
from rlserve.models.spaces import space_from_json
from rlserve.service.sessions.slabs import SessionSlabs


def _recurrent_names() -> list[str]:
    return cases_of_kind("lstm", "attention", "custom_recurrent")


@pytest.fixture(params=_recurrent_names())
def case(request) -> OracleCase:
    return load_case(request.param)


def _actions_at(case: OracleCase, space, t: int) -> np.ndarray:
    """``actions_taken[t]`` (one leaf per path) flattened as the server flattens actions."""
    tree = {p: v[t] for p, v in case.tree("actions_taken").items()}
    paths = [path_str(p) for p in leaf_paths(space)]
    assert sorted(paths) == sorted(tree), f"actions_taken leaves {sorted(tree)} != action space leaves {paths}"
    return np.asarray(flatten_actions(space, unflatten_leaves(space, [tree[p] for p in paths])), np.float32)


def _recorded_prev(case: OracleCase, key: str, t: int, windowed: bool) -> np.ndarray:
    """Recorded prev actions/rewards of step t in the slabs' layout: (B, [n,] width) / (B, [n])."""
    values = case.io[key][t]
    batch = values.shape[0]
    if key == "prev_rewards":
        return values.reshape(batch, -1) if windowed else values.reshape(batch)
    return values.reshape((batch, values.shape[1], -1) if windowed else (batch, -1))


def test_seq_lens_are_one_step_per_call(case: OracleCase) -> None:
    # Every replay here and in test_recurrent.py steps one observation per call.
    seq_lens = case.io["seq_lens"]
    assert seq_lens.shape == (case.meta["batch_size"],)
    np.testing.assert_array_equal(seq_lens, 1)
    mark_io(case, "seq_lens")


def test_taken_actions_are_the_recorded_samples(case: OracleCase) -> None:
    for path, taken in case.tree("actions_taken").items():
        sampled = case.io["dist/actions/dist_sample" + (f"/{path}" if path else "")]
        np.testing.assert_array_equal(taken, sampled)
    mark_io(case, *case.keys_under("actions_taken"))


def test_slabs_rebuild_rllibs_step_inputs(case: OracleCase) -> None:
    meta = case.meta
    obs_space, action_space = space_from_json(meta["observation_space"]), space_from_json(meta["action_space"])
    model = build_model(obs_space, action_space, meta["model_config"], num_outputs=meta["num_outputs"])
    load_rllib_weights(model, case.weights)
    model.eval()
    sig = model.signature()
    batch, steps = meta["batch_size"], meta["T"]
    slabs = SessionSlabs(sig, capacity=batch + 1, max_capacity=batch + 1)
    slots = np.arange(1, batch + 1)
    for t in range(steps):
        if t == 0:
            slabs.reset(slots)
        elif sig.uses_prev_rewards:
            slabs.report(slots, case.io["rewards"][t - 1].astype(np.float32), None)
        inputs = slabs.gather(slots)
        for i in range(len(sig.state)):
            assert_close(inputs[f"state_in_{i}"], case.io[f"state_in/{i}"][t], f"state_in/{i} at t={t}")
        for key in ("prev_actions", "prev_rewards"):
            if key in case.io:
                got = inputs[key]
                assert_close(got, _recorded_prev(case, key, t, sig.prev.windowed).astype(got.dtype), f"{key} t={t}")
        inputs["obs"] = case.io["obs_flat"][t]
        with torch.no_grad():
            out = model(*(torch.from_numpy(np.ascontiguousarray(inputs[n])) for n in sig.input_names))
        assert_close(out[0].numpy(), case.io["model_out"][t], f"model_out t={t}")
        flat = _actions_at(case, action_space, t) if sig.uses_prev_actions else None
        slabs.scatter(slots, [s.numpy() for s in out[2:]], flat)
    # Rewards reach the model only through prev_rewards (signature checked in
    # test_recurrent.py): with no reward input they cannot change any output, so they are
    # accounted for either way; the taken actions were fed here when the model reads them.
    mark_io(case, "rewards", *(["actions_taken"] if sig.uses_prev_actions else []))
