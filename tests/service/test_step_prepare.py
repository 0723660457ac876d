"""``Preparer.prepare`` on its own, without HTTP: one request's rows (``Rows``) validated into
a ``Step`` against real small bundles (tests/svc_bundles.py, loaded as the server loads them).

What is checked: observations decoded (the plain float32 fast path, batches, a Dict space
with its action mask inside), preprocessed and filtered (a frozen MeanStd filter, and the
float32 overflow it can make), reported rewards and actions, action masks (explicit or from
the observation), the Q-policy options, and that each refusal is a 422 naming its field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium.spaces as gs
import msgspec
import numpy as np
import pytest

from rlserve.service.errors import AllActionsMasked, InvalidInput, ServiceError
from rlserve.service.serving.loading import load_policy
from rlserve.service.settings import Settings
from rlserve.service.step.prepare import Preparer, Step
from rlserve.service.step.rows import Rows

# Values past float32 are refused right after numpy's cast; its warning is not the point.
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")

ROW = [0.1, -0.2, 0.3, -0.4]
# A frozen MeanStd filter over 4 values: mean (1, 2, 3, 4), std (1, 2, 3, 4) (three pushes,
# sum of squared differences 2 * std**2: RLlib's unbiased variance), and one without
# clipping whose std of zero divides by RLlib's 1e-6 alone.
FILTERED = {"type": "MeanStdFilter", "shape": [4], "demean": True, "destd": True, "clip": 10.0, "num_pushes": 3,
            "mean": [1.0, 2.0, 3.0, 4.0], "sum_sq_diff": [2.0, 8.0, 18.0, 32.0]}
UNCLIPPED = {**FILTERED, "clip": None, "mean": [0.0] * 4, "sum_sq_diff": [0.0] * 4}


@pytest.fixture(scope="module")
def preparers(bundle_store, tmp_path_factory) -> dict[str, Preparer]:
    """The preparer of each bundle, as ``load_policy`` builds it for the server."""
    root = tmp_path_factory.mktemp("prepare")
    for name, state in (("filtered", FILTERED), ("unclipped", UNCLIPPED)):
        _export_filtered(root / name, name, state)
    out = {}
    for name in ("mlp", "masked", "lstm", "gtrxl", "image"):
        out[name] = load_policy(bundle_store / name, Settings(repository=bundle_store)).preparer
    for name in ("filtered", "unclipped"):
        out[name] = load_policy(root / name, Settings(repository=root)).preparer
    return out


def _export_filtered(out: Path, name: str, state: dict[str, Any]) -> None:
    import torch

    from rlserve.models.catalog import build_model
    from rlserve.models.export.exporter import export_bundle

    obs, act, config = gs.Box(-np.inf, np.inf, (4,), np.float32), gs.Discrete(3), {"fcnet_hiddens": [8]}
    torch.manual_seed(0)
    export_bundle(build_model(obs, act, config), obs_space=obs, action_space=act, model_config=config, out_dir=out,
                  name=name, version="1", formats=["onnx"], filter_state=state)


def rows(observations: list[Any], *, single: bool = False, **columns: list[Any]) -> Rows:
    """A request's rows as the act wire makes them; ``columns`` given are "sent"."""
    n = len(observations)
    given = {"session_ids": [None] * n, "episode_starts": [False] * n, "rewards": [None] * n,
             "prev_actions": [msgspec.UNSET] * n, "action_masks": [None] * n, "seeds": [None] * n, **columns}
    return Rows(single, observations, **given, has_sessions=False, has_rewards="rewards" in columns,
                has_prev_actions="prev_actions" in columns, has_masks="action_masks" in columns)


def prepare(preparer: Preparer, request: Rows, **options: Any) -> Step:
    options.setdefault("explore", None)
    options.setdefault("extras", frozenset())
    return preparer.prepare(request, **options)


def refusal(preparer: Preparer, request: Rows, **options: Any) -> ServiceError:
    with pytest.raises(InvalidInput) as caught:
        prepare(preparer, request, **options)
    assert caught.value.status == 422
    return caught.value


# --------------------------------------------------------------------------- decode


def test_a_plain_float32_row_takes_the_fast_path_unconverted(preparers):
    step = prepare(preparers["mlp"], rows([ROW], single=True))
    assert step.obs is None and step.obs_row == ROW and step.rows == 1
    assert step.reset.tolist() == [False] and step.sessions == [None]
    assert step.mask is None and step.prev_actions is None and step.rewards == [None]
    assert step.explore is True  # the bundle's default (svc_bundles export explore=True)
    assert prepare(preparers["mlp"], rows([ROW], single=True), explore=False).explore is False


def test_rows_that_are_not_plain_floats_are_decoded_into_one_array(preparers):
    step = prepare(preparers["mlp"], rows([ROW, [1, 0, 0, 1]]))  # integers: the full decoder
    assert step.obs_row is None and step.obs.dtype == np.float32 and step.rows == 2
    np.testing.assert_array_equal(step.obs, np.array([ROW, [1, 0, 0, 1]], np.float32))
    assert step.reset.tolist() == [False, False]


@pytest.mark.parametrize(("bad", "words"), [
    ([1.0, 2.0, 3.0], "expected shape [4], got [3]"),
    ([0.1, 0.2, 0.3, "x"], "element 3 is the string 'x'"),
    ([0.1, 0.2, 0.3, 1e39], "finite"),
    ({"a": 1}, "observations[1]"),
])
def test_an_observation_that_does_not_fit_is_refused_by_its_row(preparers, bad, words):
    error = refusal(preparers["mlp"], rows([ROW, bad]))
    assert error.field == "observations[1]" and words in error.message, error.message
    assert error.expected["type"] == "Box" and error.expected["shape"] == [4]


def test_a_dict_observation_is_flattened_in_key_order_and_its_mask_read(preparers):
    value = {"observations": [0.1, 0.2, 0.3], "action_mask": [1, 0, 1, 1, 0]}
    step = prepare(preparers["masked"], rows([value], single=True))
    # gymnasium's Dict keeps its keys sorted: action_mask (5) first, then observations (3).
    np.testing.assert_array_equal(step.obs, np.array([[1, 0, 1, 1, 0, 0.1, 0.2, 0.3]], np.float32))
    assert step.mask.tolist() == [[True, False, True, True, False]]


def test_a_uint8_image_keeps_its_dtype_until_its_batch(preparers):
    frame = np.arange(300).reshape(10, 10, 3) % 256
    step = prepare(preparers["image"], rows([frame.tolist()], single=True))
    assert step.obs.dtype == np.uint8 and step.obs.shape == (1, 10, 10, 3)
    np.testing.assert_array_equal(step.obs[0], frame)


# --------------------------------------------------------------------------- preprocess and filter


def test_the_frozen_filter_normalises_and_clips(preparers):
    obs = [[2.0, 4.0, 6.0, 8.0], [1.0, 2.0, 3.0, 1000.0]]
    step = prepare(preparers["filtered"], rows(obs))
    std = np.array([1.0, 2.0, 3.0, 4.0])
    expected = np.clip((np.array(obs) - [1.0, 2.0, 3.0, 4.0]) / (std + 1e-6), -10, 10)
    np.testing.assert_allclose(step.obs, expected.astype(np.float32), rtol=1e-6)
    assert step.obs[1, 3] == 10.0  # clipped


def test_a_filtered_value_that_overflows_float32_is_refused_by_its_row(preparers):
    """Finite as sent, but divided by the filter's 1e-6 it is past float32's range."""
    assert prepare(preparers["unclipped"], rows([ROW, [1e30, 0.0, 0.0, 0.0]])).obs.dtype == np.float32
    error = refusal(preparers["unclipped"], rows([ROW, [3e38, 0.0, 0.0, 0.0]]))
    assert error.field == "observations[1]" and "overflow the model's float32 input" in error.message


# --------------------------------------------------------------------------- rewards and reported actions


def test_rewards_pass_through_and_one_past_float32_is_refused_by_its_row(preparers):
    assert prepare(preparers["lstm"], rows([ROW, ROW], rewards=[0.5, None])).rewards == [0.5, None]
    for bad in (1e39, float("nan"), float("-inf")):
        error = refusal(preparers["lstm"], rows([ROW, ROW], rewards=[0.5, bad]))
        assert error.field == "rewards[1]" and "finite as float32" in error.message
    error = refusal(preparers["lstm"], rows([ROW], single=True, rewards=[1e39]))
    assert error.field == "reward"


def test_reported_box_actions_are_flat_rows_with_nan_where_none_was_reported(preparers):
    step = prepare(preparers["lstm"], rows([ROW, ROW, ROW], prev_actions=[[0.5, -0.5], msgspec.UNSET, None]))
    assert step.prev_actions.dtype == np.float32 and step.prev_actions.shape == (3, 2)
    np.testing.assert_array_equal(step.prev_actions[0], [0.5, -0.5])
    assert np.isnan(step.prev_actions[1:]).all()
    # Outside the Box is fine (a previous action is the raw sample); not finite is not.
    assert prepare(preparers["lstm"], rows([ROW], prev_actions=[[3.0, -3.0]])).prev_actions.tolist() == [[3.0, -3.0]]


@pytest.mark.parametrize(("model", "bad", "words"), [
    ("lstm", [1.0, 2.0, 3.0], "expected shape [2]"),
    ("lstm", [1e39, 0.0], "expected finite numbers"),
    ("gtrxl", 3, "3 is not in Discrete(3)"),
    ("gtrxl", "1", "expected a number, got '1'"),
])
def test_a_reported_action_that_does_not_fit_is_refused_by_its_row(preparers, model, bad, words):
    error = refusal(preparers[model], rows([ROW, ROW], prev_actions=[None, bad]))
    assert error.field == "prev_actions[1]" and words in error.message, error.message
    error = refusal(preparers[model], rows([ROW], single=True, prev_actions=[bad]))
    assert error.field == "prev_action"


def test_a_reported_discrete_action_is_its_index(preparers):
    step = prepare(preparers["gtrxl"], rows([ROW, ROW], prev_actions=[2, 0]))
    assert step.prev_actions.tolist() == [[2.0], [0.0]]


# --------------------------------------------------------------------------- masks


def test_explicit_masks_are_bool_rows_and_rows_without_one_allow_everything(preparers):
    step = prepare(preparers["mlp"], rows([ROW, ROW], action_masks=[[1, 0, 1], None]))
    assert step.mask.dtype == bool and step.mask.tolist() == [[True, False, True], [True, True, True]]
    assert prepare(preparers["mlp"], rows([ROW, ROW], action_masks=[None, None])).mask is None


@pytest.mark.parametrize(("mask", "words"), [
    ([1, 0], "expected 3 values, each 0 or 1"),
    ([1, 0, 2], "expected 3 values, each 0 or 1"),
    (["1", "0", "1"], "expected 3 values, each 0 or 1"),
])
def test_a_malformed_mask_is_refused_by_its_row(preparers, mask, words):
    error = refusal(preparers["mlp"], rows([ROW, ROW], action_masks=[None, mask]))
    assert error.field == "action_masks[1]" and words in error.message


def test_a_mask_that_allows_nothing_is_refused_per_block(preparers):
    with pytest.raises(AllActionsMasked) as caught:
        prepare(preparers["mlp"], rows([ROW], single=True, action_masks=[[0, 0, 0]]))
    assert caught.value.field == "action_mask" and "every action" in caught.value.message
    # MultiDiscrete([2, 3]): each component needs one allowed choice; the mask in the observation.
    value = {"observations": [0.1, 0.2, 0.3], "action_mask": [1, 0, 0, 0, 0]}
    with pytest.raises(AllActionsMasked) as caught:
        prepare(preparers["masked"], rows([value], single=True))
    assert caught.value.field == "observation.action_mask" and "every choice of component 1" in caught.value.message


def test_a_model_without_categorical_actions_takes_no_mask(preparers):
    error = refusal(preparers["lstm"], rows([ROW], single=True, action_masks=[[1, 0]]))
    assert error.field == "action_mask" and "no categorical part to mask" in error.message


# --------------------------------------------------------------------------- options


def test_q_policy_options_are_refused_for_other_models(preparers):
    error = refusal(preparers["mlp"], rows([ROW], single=True), extras=frozenset({"q_values"}))
    assert error.field == "outputs" and error.received == "q_values"
    error = refusal(preparers["mlp"], rows([ROW], single=True), epsilon=0.1)
    assert error.field == "epsilon"

