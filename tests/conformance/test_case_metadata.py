"""case.json facts that no output comparison covers: config merging and the weight layout.

- ``model_config`` is MODEL_DEFAULTS merged with ``model_config_overrides``, except that
  RLlib's VisionNetwork writes the default ``conv_filters`` it chose into the config; the
  VisionNetwork we build must have chosen the same filters.
- ``weights``: our model holds one tensor per unique RLlib tensor with RLlib's shapes; the
  ``aliased_keys`` groups are exactly the names one of our tensors loads from; the
  ``buffer_keys`` are buffers here too; the ``unreached_keys`` are exactly the parameters
  with no gradient path to the dist inputs or the value (in RLlib and here).
- ``model_num_outputs``, also of the recurrent wrappers (test_models.py covers feedforward).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from oracle import REGISTRATION_NOTES, OracleCase, case_dir, case_names, catalog_config, load_case, oracle_dirs_text

from conformance.keys_checked import mark_fields
from rlserve.models.catalog import build_model
from rlserve.models.config import merge_model_config
from rlserve.models.custom import get_custom_model
from rlserve.models.distributions import get_registered_action_dist
from rlserve.models.networks.visionnet import VisionNetwork
from rlserve.models.rllib_import import load_rllib_weights, rllib_key_candidates
from rlserve.models.spaces import space_from_json


def _model_case_names() -> list[str]:
    names = [n for n in case_names() if (case_dir(n) / "weights.npz").is_file()]
    return names or [f"<no cases with weights in {oracle_dirs_text()}>"]


@pytest.fixture(params=_model_case_names())
def case(request) -> OracleCase:
    if request.param.startswith("<no cases"):
        pytest.fail(request.param)
    return load_case(request.param)


def _built(case: OracleCase) -> torch.nn.Module:
    return _built_by_path(str(case.path))


@functools.cache
def _built_by_path(path: str) -> torch.nn.Module:
    """Built once per case: the tests below only read the model (no training, no mutation)."""
    case = load_case(Path(path).name)
    meta = case.meta
    model = build_model(
        space_from_json(meta["observation_space"]), space_from_json(meta["action_space"]),
        catalog_config(meta), num_outputs=meta["num_outputs"],
    )
    load_rllib_weights(model, case.weights)
    return model.eval()


def test_model_config_is_defaults_plus_overrides(case: OracleCase) -> None:
    meta = case.meta
    merged = merge_model_config(meta["model_config_overrides"], space_from_json(meta["action_space"]))
    recorded = _resolved_registrations(meta["model_config"], case)
    differing = sorted(k for k in set(merged) | set(recorded) if merged.get(k) != recorded.get(k))
    if differing == ["conv_filters"] and merged["conv_filters"] is None:
        # RLlib's VisionNetwork wrote the default filters it picked into the config.
        chosen = [m.conv_filters for m in _built(case).modules() if isinstance(m, VisionNetwork)]
        assert json.loads(json.dumps(recorded["conv_filters"])) in chosen, (
            f"RLlib chose conv_filters {recorded['conv_filters']}, our VisionNetworks {chosen}"
        )
    else:
        assert not differing, {k: (merged.get(k), recorded.get(k)) for k in differing}
    mark_fields(case, "model_config", "model_config_overrides")


def _resolved_registrations(recorded: dict, case: OracleCase) -> dict:
    """RLlib records a registered custom model/dist by its dotted class path, plus the name
    it was registered under (REGISTRATION_NOTES): that name must resolve to the class we
    serve for the path, and then stands for it (the overrides use the name)."""
    resolved = {k: v for k, v in recorded.items() if k not in REGISTRATION_NOTES}
    for note in REGISTRATION_NOTES:
        if note in recorded:
            key = note.removesuffix("_registered_as")
            lookup = get_custom_model if key == "custom_model" else get_registered_action_dist
            assert lookup(recorded[note]) is lookup(recorded[key]), f"{note}: {recorded[note]} != {recorded[key]}"
            resolved[key] = recorded[note]
    return resolved


def _rllib_names(model: torch.nn.Module, case: OracleCase) -> dict[str, list[str]]:
    """Our tensor name -> the RLlib names in this case's weights that load into it."""
    return {ours: [n for n in names if n in case.weights] for ours, names in rllib_key_candidates(model).items()}


def test_tensors_and_shapes_match_rllib(case: OracleCase) -> None:
    recorded = case.meta["weights"]
    model = _built(case)
    names = _rllib_names(model, case)
    assert recorded["num_keys"] == len(case.weights)
    assert {k: list(v.shape) for k, v in case.weights.items()} == {k: list(v) for k, v in recorded["shapes"].items()}
    tensors = dict(model.state_dict(keep_vars=True))
    assert len(tensors) == recorded["num_unique_tensors"] == len(names)
    for ours, rllib in names.items():
        for name in rllib:
            assert list(tensors[ours].shape) == recorded["shapes"][name], f"{ours} <- {name}"
    params = sum(p.numel() for p in model.parameters())
    assert params == recorded["num_parameters_unique"]
    mark_fields(
        case, "weights.num_keys", "weights.shapes", "weights.num_unique_tensors", "weights.num_parameters_unique"
    )


def test_aliases_and_buffers_match_rllib(case: OracleCase) -> None:
    recorded = case.meta["weights"]
    model = _built(case)
    names = _rllib_names(model, case)
    ours_groups = sorted(sorted(group) for group in names.values() if len(group) > 1)
    assert ours_groups == sorted(sorted(group) for group in recorded["aliased_keys"])
    buffers = {name for ours, _ in model.named_buffers() for name in names[ours]}
    assert buffers == set(recorded["buffer_keys"])
    mark_fields(case, "weights.aliased_keys", "weights.buffer_keys")


def _zero_inputs(case: OracleCase, model: torch.nn.Module) -> list[torch.Tensor]:
    """Recorded observations of one step, zero state and zero previous actions/rewards."""
    sig = model.signature()
    obs = case.io["obs_flat"]
    obs = obs[0] if sig.is_recurrent else obs  # recurrent cases are [T, B, ...]
    batch = len(obs)
    inputs = [torch.from_numpy(np.ascontiguousarray(obs)).to(torch.float32)]
    inputs += [torch.full((batch, *s.shape), s.initial_value) for s in sig.state]
    window = (sig.prev.n_prev_actions,) if sig.prev.windowed else ()
    if sig.uses_prev_actions:
        inputs.append(torch.zeros((batch, *window, sig.prev.action_width)))
    if sig.uses_prev_rewards:
        inputs.append(torch.zeros((batch, sig.prev.n_prev_rewards) if sig.prev.windowed else (batch,)))
    return inputs


def test_unreached_parameters_match_rllib(case: OracleCase) -> None:
    model = _built(case)
    names = _rllib_names(model, case)
    params = dict(model.named_parameters())
    with torch.enable_grad():
        dist_inputs, value, *_ = model(*_zero_inputs(case, model))
        grads = torch.autograd.grad(dist_inputs.sum() + value.sum(), list(params.values()), allow_unused=True)
    unreached = {name for ours, g in zip(params, grads, strict=True) if g is None for name in names[ours]}
    assert unreached == set(case.meta["weights"]["unreached_keys"]), (
        f"only ours: {sorted(unreached - set(case.meta['weights']['unreached_keys']))}, "
        f"only RLlib's: {sorted(set(case.meta['weights']['unreached_keys']) - unreached)}"
    )
    mark_fields(case, "weights.unreached_keys")


def test_model_num_outputs(case: OracleCase) -> None:
    # For the wrappers this is the wrapper's own head width, not the wrapped model's.
    assert _built(case).num_outputs == case.meta["model_num_outputs"]
    mark_fields(case, "model_num_outputs")
