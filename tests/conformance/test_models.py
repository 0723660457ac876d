"""Feedforward models against RLlib's recorded outputs (every case of a kind in ``KINDS``).

``batch_norm`` (RLlib's TorchBatchNormModel, recorded in inference mode) and
``parametric_actions`` (RLlib's TorchParametricActionsModel on a Dict observation) cases are
feedforward models too: the same comparisons hold for them.

Each case is rebuilt from its spaces and RLlib's recorded model_config through the
catalog, RLlib's weights are imported, and ``obs_flat`` (what RLlib handed the model) is
run through it. RLlib's models call ``.float()`` on their input, so float64 (Repeated,
colour GenericPixel) and uint8/int8 (NoPreprocessor) observations are fed as float32.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from oracle import (
    assert_close,
    cases_of_kind,
    load_case,
)

from conformance.keys_checked import mark_fields, mark_io
from rlserve.models.catalog import build_model, describe_model
from rlserve.models.config import merge_model_config
from rlserve.models.distributions import get_action_dist
from rlserve.models.rllib_import import load_rllib_weights
from rlserve.models.spaces import space_from_json

KINDS = ("feedforward", "batch_norm", "parametric_actions")
# Vision logits reach ~100 and sum thousands of products; RLlib's own MKL kernels differ
# from run to run at this level (see check_format.md "Tolerance").
RTOL, ATOL = 1e-5, 1e-5


def _feedforward_cases() -> list[str]:
    return cases_of_kind(*KINDS)


@pytest.fixture(params=_feedforward_cases())
def case(request):
    if request.param.startswith("<no "):
        pytest.fail(request.param)
    return load_case(request.param)


def _spaces(case):
    return space_from_json(case.meta["observation_space"]), space_from_json(case.meta["action_space"])


def _built(case) -> torch.nn.Module:
    obs_space, action_space = _spaces(case)
    model = build_model(obs_space, action_space, case.meta["model_config"], num_outputs=case.meta["num_outputs"])
    load_rllib_weights(model, case.weights)
    return model.eval()


def test_catalog_picks_rllibs_class(case):
    obs_space, action_space = _spaces(case)
    assert describe_model(obs_space, action_space, case.meta["model_config"]) == case.meta["model_class"]
    mark_fields(case, "model_class")


def test_num_outputs(case):
    obs_space, action_space = _spaces(case)
    config = merge_model_config(case.meta["model_config"], action_space)
    spec = get_action_dist(action_space, config, dist_type=case.meta["action_dist"]["class"])
    assert spec.num_outputs == case.meta["num_outputs"]
    if get_action_dist(action_space, config).name == case.meta["action_dist"]["class"]:
        # The catalog's own default distribution: build_model must size the head by itself.
        model = build_model(obs_space, action_space, case.meta["model_config"])
        assert model.num_outputs == case.meta["num_outputs"]
    model = _built(case)
    assert model.num_outputs == case.meta["model_num_outputs"]
    assert model.signature().num_outputs == case.meta["num_outputs"]
    assert model.signature().obs_shape == tuple(case.meta["preprocessor"]["output_shape"])
    mark_fields(case, "num_outputs", "model_num_outputs")


def test_outputs_match_rllib(case):
    model = _built(case)
    obs = torch.from_numpy(case.io["obs_flat"].astype(np.float32))
    with torch.no_grad():
        out, value = model(obs)
    assert_close(out.numpy(), case.io["model_out"], "model_out", rtol=RTOL, atol=ATOL)
    assert_close(value.numpy(), case.io["value"], "value", rtol=RTOL, atol=ATOL)
    mark_io(case, "obs_flat", "model_out", "value")
    if "model_out_unmasked" in case.io:
        # Action masking: the internal model's logits before the mask, and its value.
        with torch.no_grad():
            logits, inner_value = model.base.unmasked(obs)
        assert_close(logits.numpy(), case.io["model_out_unmasked"], "model_out_unmasked", rtol=RTOL, atol=ATOL)
        assert_close(inner_value.numpy(), case.io["value"], "internal value", rtol=RTOL, atol=ATOL)
        mark_io(case, "model_out_unmasked")


def test_native_dtype_input_equals_float32(case):
    """Feeding obs_flat in its own dtype gives the same numbers: the model casts like RLlib."""
    model = _built(case)
    native = torch.from_numpy(np.ascontiguousarray(case.io["obs_flat"]))
    as_float = native.to(torch.float32)
    with torch.no_grad():
        out_native, value_native = model(native)
        out_float, value_float = model(as_float)
    torch.testing.assert_close(out_native, out_float, rtol=0, atol=0)
    torch.testing.assert_close(value_native, value_float, rtol=0, atol=0, equal_nan=True)

