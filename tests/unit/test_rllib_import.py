"""RLlib weight import: key mapping, error lists, aliases, buffers and weight files."""

from __future__ import annotations

import pickle
from collections import OrderedDict

import gymnasium.spaces as gs
import numpy as np
import pytest
import torch
from torch import nn

from rlserve.models.catalog import build_model
from rlserve.models.networks.complex_input import ComplexInputNetwork, components_for
from rlserve.models.networks.fcnet import FullyConnectedNetwork
from rlserve.models.networks.policy import FeedForwardPolicy
from rlserve.models.rllib_import import (
    WeightImportError,
    load_rllib_weights,
    read_weights_file,
    rllib_key_candidates,
)

torch.set_num_threads(1)
CONFIG = {"fcnet_hiddens": [4], "fcnet_activation": "tanh", "vf_share_layers": True}


def _policy() -> FeedForwardPolicy:
    return FeedForwardPolicy(FullyConnectedNetwork(3, 2, CONFIG))


def _rllib_state(seed: int = 0) -> dict[str, np.ndarray]:
    """What RLlib's FCNet state_dict looks like for CONFIG: top-level keys (no 'base.')."""
    rng = np.random.default_rng(seed)
    shapes = {
        "_hidden_layers.0._model.0.weight": (4, 3), "_hidden_layers.0._model.0.bias": (4,),
        "_logits._model.0.weight": (2, 4), "_logits._model.0.bias": (2,),
        "_value_branch._model.0.weight": (1, 4), "_value_branch._model.0.bias": (1,),
    }
    return {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}


def test_prefix_map_loads_top_level_keys_and_values_arrive():
    model, state = _policy(), _rllib_state()
    load_rllib_weights(model, state)
    for key, value in state.items():
        np.testing.assert_array_equal(model.state_dict()["base." + key].numpy(), value)
    obs = torch.randn(2, 3)
    hidden = torch.tanh(obs @ torch.from_numpy(state["_hidden_layers.0._model.0.weight"]).T
                        + torch.from_numpy(state["_hidden_layers.0._model.0.bias"]))
    expected = hidden @ torch.from_numpy(state["_logits._model.0.weight"]).T + torch.from_numpy(
        state["_logits._model.0.bias"]
    )
    torch.testing.assert_close(model(obs)[0], expected)


def test_missing_and_unexpected_keys_are_listed():
    state = _rllib_state()
    del state["_logits._model.0.bias"]
    state["_extra.weight"] = np.zeros(3, np.float32)
    with pytest.raises(WeightImportError) as info:
        load_rllib_weights(_policy(), state)
    message = str(info.value)
    assert "missing keys (1): ['_logits._model.0.bias']" in message
    assert "unexpected keys (1): ['_extra.weight']" in message


def test_shape_mismatch_names_both_shapes_and_changes_nothing():
    model = _policy()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    state = _rllib_state()
    state["_logits._model.0.weight"] = np.zeros((3, 4), np.float32)
    with pytest.raises(
        WeightImportError, match=r"'_logits._model.0.weight': expected shape \[2, 4\], received \[3, 4\]"
    ):
        load_rllib_weights(model, state)
    for key, value in model.state_dict().items():
        torch.testing.assert_close(value, before[key])


def test_non_strict_ignores_missing_and_unexpected():
    state = _rllib_state()
    del state["_value_branch._model.0.bias"]
    state["_extra"] = np.zeros(1, np.float32)
    model = load_rllib_weights(_policy(), state, strict=False)
    np.testing.assert_array_equal(
        model.base._logits._model[0].weight.detach().numpy(), state["_logits._model.0.weight"]
    )


def test_float64_arrays_are_cast():
    state = {k: v.astype(np.float64) for k, v in _rllib_state().items()}
    model = load_rllib_weights(_policy(), state)
    assert model.base._logits._model[0].weight.dtype == torch.float32


def _complex() -> FeedForwardPolicy:
    components = components_for(gs.Tuple((gs.Box(-1, 1, (3,)), gs.Discrete(2))))
    return FeedForwardPolicy(ComplexInputNetwork(5, 2, {"fcnet_hiddens": [4]}, components))


def _complex_state(model: FeedForwardPolicy, alias: bool, primary: bool) -> dict[str, np.ndarray]:
    """RLlib-style state: sub-model keys under our name, RLlib's alias, or both."""
    state = {}
    for key, value in model.base.state_dict().items():
        aliased = key.replace("flatten.0.", "flatten_0.").replace("one_hot.1.", "one_hot_1.")
        if primary or aliased == key:
            state[key] = value.numpy() + 1.0
        if alias and aliased != key:
            state[aliased] = value.numpy() + 1.0
    return state


@pytest.mark.parametrize(("alias", "primary"), [(True, True), (True, False), (False, True)])
def test_aliased_keys_either_or_both(alias, primary):
    model = _complex()
    state = _complex_state(model, alias, primary)
    expected = {k: v.numpy() + 1.0 for k, v in model.base.state_dict().items()}
    load_rllib_weights(model, state)
    for key, value in model.base.state_dict().items():
        np.testing.assert_array_equal(value.numpy(), expected[key])


def test_disagreeing_aliases_are_an_error():
    model = _complex()
    state = _complex_state(model, alias=True, primary=True)
    state["flatten_0._hidden_layers.0._model.0.bias"] = state["flatten_0._hidden_layers.0._model.0.bias"] + 1
    with pytest.raises(WeightImportError, match="flatten.0._hidden_layers.0._model.0.bias.*different values"):
        load_rllib_weights(model, state)


class _WithBuffers(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 2)
        self.register_buffer("inverse_freq", torch.zeros(2))
        self.register_buffer("scratch", torch.zeros(3), persistent=False)


class _Outer(nn.Module):
    rllib_prefix_map = {"inner.": "wrapped_"}

    def __init__(self):
        super().__init__()
        self.inner = _Inner()


class _Inner(nn.Module):
    rllib_prefix_map = {"core.": ""}

    def __init__(self):
        super().__init__()
        self.core = _WithBuffers()


def test_nested_prefix_maps_and_buffers():
    model = _Outer()
    candidates = rllib_key_candidates(model)
    assert candidates["inner.core.lin.weight"] == ["wrapped_lin.weight"]
    assert candidates["inner.core.scratch"] == ["wrapped_scratch"]
    state = {
        "wrapped_lin.weight": np.full((2, 2), 2.0, np.float32), "wrapped_lin.bias": np.ones(2, np.float32),
        "wrapped_inverse_freq": np.array([1.0, 0.5], np.float32), "wrapped_scratch": np.arange(3, dtype=np.float32),
    }
    load_rllib_weights(model, state)
    np.testing.assert_array_equal(model.inner.core.inverse_freq.numpy(), [1.0, 0.5])
    np.testing.assert_array_equal(model.inner.core.scratch.numpy(), [0, 1, 2])
    np.testing.assert_array_equal(model.inner.core.lin.weight.detach().numpy(), np.full((2, 2), 2.0))


def test_npz_roundtrip(tmp_path):
    state = _rllib_state(3)
    np.savez(tmp_path / "w.npz", **state)
    read = read_weights_file(tmp_path / "w.npz")
    assert read.keys() == state.keys()
    model = load_rllib_weights(_policy(), read)
    np.testing.assert_array_equal(model.base._hidden_layers[0]._model[0].bias.detach().numpy(),
                                  state["_hidden_layers.0._model.0.bias"])


class _Payload:
    """Unpickling this with a normal unpickler would create a file (stand-in for any code)."""

    def __init__(self, target):
        self.target = target

    def __reduce__(self):
        return (open, (str(self.target), "w"))


def _write_policy_state(directory, weights, payload_target, protocol=pickle.HIGHEST_PROTOCOL):
    directory.mkdir(parents=True)
    state = {"weights": OrderedDict(weights), "policy_spec": _Payload(payload_target), "global_timestep": 7}
    (directory / "policy_state.pkl").write_bytes(pickle.dumps(state, protocol=protocol))


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_checkpoint_that_would_run_code_is_refused_by_name(tmp_path, protocol):
    target = tmp_path / "pwned"
    _write_policy_state(tmp_path / "ckpt" / "policies" / "default_policy", _rllib_state(4), target, protocol)
    for path in (tmp_path / "ckpt", tmp_path / "ckpt" / "policies" / "default_policy",
                 tmp_path / "ckpt" / "policies" / "default_policy" / "policy_state.pkl"):
        with pytest.raises(WeightImportError, match=r"policy_state.pkl: refusing to build or call (io|builtins)\.open"):
            read_weights_file(path)
        assert not target.exists()


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_checkpoint_pickle_is_read_as_data(tmp_path, protocol):
    weights = _rllib_state(4)
    directory = tmp_path / "ckpt" / "policies" / "default_policy"
    directory.mkdir(parents=True)
    state = {"weights": OrderedDict(weights), "global_timestep": np.int64(7), "spec": {"n": (1, 2.5, "x")}}
    (directory / "policy_state.pkl").write_bytes(pickle.dumps(state, protocol=protocol))
    for path in (tmp_path / "ckpt", directory, directory / "policy_state.pkl"):
        read = read_weights_file(path)
        assert read.keys() == weights.keys()
        for key in weights:
            np.testing.assert_array_equal(read[key], weights[key])


def test_checkpoint_with_several_policies_needs_an_id(tmp_path):
    for pid, seed in (("a", 1), ("b", 2)):
        directory = tmp_path / "ckpt" / "policies" / pid
        directory.mkdir(parents=True)
        (directory / "policy_state.pkl").write_bytes(pickle.dumps({"weights": _rllib_state(seed)}))
    with pytest.raises(WeightImportError, match=r"holds policies \['a', 'b'\]"):
        read_weights_file(tmp_path / "ckpt")
    read = read_weights_file(tmp_path / "ckpt", policy_id="b")
    np.testing.assert_array_equal(read["_logits._model.0.bias"], _rllib_state(2)["_logits._model.0.bias"])


def test_checkpoint_with_non_array_weights_is_refused(tmp_path):
    directory = tmp_path / "p"
    directory.mkdir()
    (directory / "policy_state.pkl").write_bytes(pickle.dumps({"weights": {"w": [0.0, 1.0]}}))
    with pytest.raises(WeightImportError, match="numeric arrays"):
        read_weights_file(directory)


def test_checkpoint_with_torch_tensors_is_refused_by_name(tmp_path):
    directory = tmp_path / "p"
    directory.mkdir()
    (directory / "policy_state.pkl").write_bytes(pickle.dumps({"weights": {"w": torch.zeros(2)}}))
    with pytest.raises(WeightImportError, match=r"refusing to build or call torch\."):
        read_weights_file(directory)


def test_weights_from_a_catalog_model_roundtrip():
    """A state_dict renamed to RLlib's names loads back into a fresh catalog model."""
    source = build_model(gs.Box(-1, 1, (4,)), gs.Discrete(2), {"fcnet_hiddens": [8]})
    state = {k.removeprefix("base."): v.numpy() for k, v in source.state_dict().items()}
    target = load_rllib_weights(build_model(gs.Box(-1, 1, (4,)), gs.Discrete(2), {"fcnet_hiddens": [8]}), state)
    obs = torch.randn(3, 4)
    for got, want in zip(target(obs), source(obs), strict=True):
        torch.testing.assert_close(got, want)
