"""rlserve.models.checkpoint: the data-only unpickler, RLlib's space forms, locating a policy,
filter statistics, msgpack, and the errors that name the file holding what is missing."""

from __future__ import annotations

import collections
import os
import pickle
import sys
import types
from pathlib import Path

import gymnasium.spaces as gs
import msgpack
import numpy as np
import pytest

from rlserve.models.checkpoint import (
    CheckpointError,
    UnsafePickleError,
    load_pickle_bytes,
    locate,
    read_checkpoint,
)
from rlserve.models.checkpoint.policy import plain_data
from rlserve.models.checkpoint.spaces import policy_space, rllib_space
from rlserve.models.filters import MeanStdFilter
from rlserve.models.spaces import Repeated, Simplex, spaces_equal

from .rllib_checkpoints import (
    filter_connector,
    gym_space_to_dict,
    policy_state,
    serialize_ndarray,
    write_algorithm_checkpoint,
)

OBS, ACT = gs.Box(-2.0, 2.0, (3,), np.float32), gs.Discrete(2)
MODEL = {"fcnet_hiddens": [8]}


class UnknownThing:
    def __init__(self, value: int) -> None:
        self.value = value


class _WritesFile:
    def __init__(self, target: Path) -> None:
        self.target = target

    def __reduce__(self):
        return (open, (str(self.target), "w"))


class _RunsCommand:
    def __reduce__(self):
        return (os.system, ("true",))


# --------------------------------------------------------------------------- unpickler

@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_plain_data_round_trips(protocol: int) -> None:
    counts = collections.defaultdict(int, {"a": 1})
    value = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "dtype": np.dtype("<i8"), "n": np.int64(3),
             "f": np.float32(0.5), "od": collections.OrderedDict(b=2), "counts": counts, "t": (1, "x", None),
             "s": {1, 2}, "b": b"\x00\x01", "c": 1 + 2j}
    loaded = load_pickle_bytes(pickle.dumps(value, protocol=protocol), "state.pkl")
    np.testing.assert_array_equal(loaded["w"], value["w"])
    assert loaded["w"].dtype == np.float32 and loaded["dtype"] == np.dtype("<i8")
    assert loaded["n"] == 3 and isinstance(loaded["n"], np.int64) and loaded["f"] == np.float32(0.5)
    assert loaded["od"] == value["od"] and loaded["counts"]["a"] == 1 and loaded["counts"].default_factory is int
    assert (loaded["t"], loaded["s"], loaded["b"], loaded["c"]) == (value["t"], value["s"], value["b"], value["c"])


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_an_object_of_an_unknown_class_is_refused_by_name(protocol: int) -> None:
    data = pickle.dumps({"weights": {}, "thing": UnknownThing(3)}, protocol=protocol)
    with pytest.raises(UnsafePickleError, match=rf"^state.pkl: refusing to build or call {__name__}\.UnknownThing"):
        load_pickle_bytes(data, "state.pkl")


@pytest.mark.parametrize("payload", ["file", "command"])
def test_a_pickle_that_would_run_code_is_refused_and_runs_nothing(tmp_path: Path, payload: str) -> None:
    target = tmp_path / "pwned"
    obj = _WritesFile(target) if payload == "file" else _RunsCommand()
    with pytest.raises(
        UnsafePickleError, match=r"refusing to build or call (io\.open|builtins\.open|posix\.system|nt\.system)"
    ):
        load_pickle_bytes(pickle.dumps({"x": obj}), "state.pkl")
    assert not target.exists()


def test_a_class_named_as_a_value_is_kept_as_its_dotted_name() -> None:
    # RLlib configs name classes (env, callbacks): naming one builds nothing.
    loaded = load_pickle_bytes(pickle.dumps({"env": UnknownThing, "callbacks": [UnknownThing]}), "state.pkl")
    assert plain_data(loaded) == {"env": f"{__name__}.UnknownThing", "callbacks": [f"{__name__}.UnknownThing"]}


def test_persistent_ids_are_refused() -> None:
    class WithPid(pickle.Pickler):
        def persistent_id(self, obj):
            return "storage-0" if isinstance(obj, UnknownThing) else None

    buf = __import__("io").BytesIO()
    WithPid(buf).dump({"x": UnknownThing(1)})
    with pytest.raises(UnsafePickleError, match="persistent id 'storage-0'"):
        load_pickle_bytes(buf.getvalue(), "state.pkl")


def test_pickled_gymnasium_spaces_are_rebuilt_through_their_constructors() -> None:
    spaces = [gs.Box(-1.0, np.array([1.0, 2.0], np.float32)), gs.Discrete(4, start=1), gs.MultiDiscrete([3, 2]),
              gs.MultiBinary(5), gs.Tuple([gs.Discrete(2), gs.Box(0, 1, (2,))]),
              gs.Dict({"b": gs.Discrete(3), "a": gs.Box(-1, 1, (1,))})]
    for space in spaces:
        space.sample()  # the pickle then carries a numpy Generator too
        record = load_pickle_bytes(pickle.dumps(space), "state.pkl")
        assert spaces_equal(rllib_space(record), space), space


# --------------------------------------------------------------------------- RLlib's space dicts

@pytest.mark.parametrize("space", [
    gs.Box(np.array([-4.8, -np.inf], np.float32), np.array([4.8, np.inf], np.float32)),
    gs.Box(0, 255, (2, 2, 3), np.uint8),
    gs.Discrete(3, start=0),
    gs.MultiDiscrete([3, 2]),
    gs.MultiBinary(4),
    gs.Tuple([gs.Discrete(2), gs.Box(-1, 1, (2,))]),
    gs.Dict([("pos", gs.Box(-1, 1, (2,))), ("mode", gs.Discrete(3))]),
])
def test_rllib_space_dicts(space: gs.Space) -> None:
    rebuilt = rllib_space(gym_space_to_dict(space))
    assert spaces_equal(rebuilt, space)
    if isinstance(space, gs.Dict):
        assert list(rebuilt.spaces) == list(space.spaces)  # the stored order, not sorted


def test_repeated_and_simplex_dicts() -> None:
    child = gym_space_to_dict(gs.Box(-1, 1, (2,)))
    assert spaces_equal(rllib_space({"space": "repeated", "child_space": child, "max_len": 4}),
                        Repeated(gs.Box(-1, 1, (2,)), 4))
    simplex = rllib_space({"space": "simplex", "shape": (3,), "concentration": np.array([1.0, 2.0, 3.0]),
                           "dtype": "<f4"})
    assert spaces_equal(simplex, Simplex((3,), [1.0, 2.0, 3.0]))


def test_policy_space_follows_original_space() -> None:
    raw = gs.Dict([("mode", gs.Discrete(3)), ("pos", gs.Box(-1, 1, (2,)))])
    node = {"space": gym_space_to_dict(gs.Box(-1, 1, (5,))), "original_space": {"space": gym_space_to_dict(raw)}}
    assert spaces_equal(policy_space(node, "spec"), raw)


def test_unknown_space_types_and_bad_arrays_name_the_place() -> None:
    with pytest.raises(CheckpointError, match=r"spec.observation_space: space type 'graph' is not supported"):
        policy_space({"space": "graph"}, "spec.observation_space")
    with pytest.raises(CheckpointError, match=r"x.low: not a serialized numpy array"):
        rllib_space({"space": "box", "low": "not base64!", "high": serialize_ndarray(np.ones(1))}, "x")


def test_arrays_needing_pickles_are_refused() -> None:
    with pytest.raises(CheckpointError, match="not a serialized numpy array"):
        rllib_space({"space": "box", "low": serialize_ndarray(np.array([None], dtype=object)),
                     "high": serialize_ndarray(np.ones(1))}, "x")


# --------------------------------------------------------------------------- locating a policy

def test_several_policies_need_an_id_and_the_error_lists_them(tmp_path: Path) -> None:
    ckpt = write_algorithm_checkpoint(tmp_path / "ckpt", {"blue": policy_state(OBS, ACT, MODEL, seed=1),
                                                          "red": policy_state(OBS, ACT, MODEL, seed=2)})
    with pytest.raises(CheckpointError, match=r"holds policies \['blue', 'red'\]; pass --policy-id"):
        read_checkpoint(ckpt)
    red = read_checkpoint(ckpt, policy_id="red")
    assert red.policy_id == "red"
    np.testing.assert_array_equal(red.weights["_logits._model.0.bias"],
                                  policy_state(OBS, ACT, MODEL, seed=2)["weights"]["_logits._model.0.bias"])
    with pytest.raises(CheckpointError, match=r"no policy 'green' under policies/; available: \['blue', 'red'\]"):
        read_checkpoint(ckpt, policy_id="green")


def test_algorithm_state_file_says_where_the_weights_are(tmp_path: Path) -> None:
    ckpt = write_algorithm_checkpoint(tmp_path / "ckpt", {"default_policy": policy_state(OBS, ACT, MODEL)})
    with pytest.raises(CheckpointError) as info:
        locate(ckpt / "algorithm_state.pkl")
    message = str(info.value)
    assert f"{ckpt}/policies/policy_state.pkl" not in message
    assert f"{ckpt}/policies/<policy_id>/policy_state.pkl (policy ids here: ['default_policy'])" in message
    assert f"pass the checkpoint directory {ckpt}" in message


def test_every_form_of_the_path_finds_the_same_policy(tmp_path: Path) -> None:
    ckpt = write_algorithm_checkpoint(tmp_path / "ckpt", {"default_policy": policy_state(OBS, ACT, MODEL)})
    policy_dir = ckpt / "policies" / "default_policy"
    for path in (ckpt, policy_dir, policy_dir / "policy_state.pkl"):
        files = locate(path)
        assert files.policy_state == policy_dir / "policy_state.pkl"
        assert files.policy_id == "default_policy" and files.algorithm_state == ckpt / "algorithm_state.pkl"
    with pytest.raises(CheckpointError, match=r"does not exist"):
        locate(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(
        CheckpointError, match=r"empty: no policy found: expected policies/<policy_id>/policy_state.pkl"
    ):
        locate(tmp_path / "empty")


# --------------------------------------------------------------------------- what read_checkpoint returns

def test_read_checkpoint_returns_spaces_config_filter_and_settings(tmp_path: Path) -> None:
    observations = np.random.default_rng(0).normal(size=(50, 3))
    state = policy_state(OBS, ACT, {**MODEL, "vf_share_layers": False}, observation_filter="MeanStdFilter",
                         agent_connectors=[("ObsPreprocessorConnector", None), filter_connector((3,), observations)],
                         normalize_actions=False, clip_actions=True)
    ckpt = read_checkpoint(write_algorithm_checkpoint(tmp_path / "ckpt", {"default_policy": state}))
    assert spaces_equal(ckpt.observation_space, OBS) and spaces_equal(ckpt.action_space, ACT)
    assert ckpt.model_config["fcnet_hiddens"] == [8] and ckpt.model_config["vf_share_layers"] is False
    assert ckpt.model_config["lstm_cell_size"] == 256  # merged over MODEL_DEFAULTS
    assert (ckpt.normalize_actions, ckpt.clip_actions, ckpt.explore) == (False, True, True)
    assert ckpt.filter_missing is None and "connector_configs" in str(ckpt.filter_source)
    restored = MeanStdFilter.from_state(ckpt.filter_state)
    assert restored.num_pushes == 50 and restored.clip is None
    np.testing.assert_allclose(restored.mean, observations.mean(axis=0))
    np.testing.assert_allclose(restored.std, observations.std(axis=0, ddof=1), rtol=1e-6)


def test_a_filter_the_config_names_but_nobody_holds_is_reported(tmp_path: Path) -> None:
    state = policy_state(OBS, ACT, MODEL, observation_filter="MeanStdFilter", agent_connectors=[])
    ckpt = read_checkpoint(write_algorithm_checkpoint(tmp_path / "ckpt", {"default_policy": state}))
    assert ckpt.filter_state is None
    assert "observation_filter is 'MeanStdFilter'" in ckpt.filter_missing
    assert "policy_state.pkl (connector_configs)" in ckpt.filter_missing
    assert "algorithm_state.pkl (worker.filters)" in ckpt.filter_missing


@pytest.fixture
def fake_rllib_filter_module(monkeypatch: pytest.MonkeyPatch):
    """Classes pickled under RLlib's names, so a test can write the worker's filters as RLlib does."""
    names = ["ray", "ray.rllib", "ray.rllib.utils", "ray.rllib.utils.filter"]
    modules = {n: types.ModuleType(n) for n in names}
    for name in names:
        monkeypatch.setitem(sys.modules, name, modules[name])
    module = modules["ray.rllib.utils.filter"]
    for cls_name in ("MeanStdFilter", "RunningStat"):
        cls = type(cls_name, (), {"__module__": "ray.rllib.utils.filter"})
        setattr(module, cls_name, cls)
    return module


def test_the_worker_filter_is_used_when_the_connectors_hold_none(tmp_path: Path, fake_rllib_filter_module) -> None:
    observations = np.random.default_rng(1).normal(size=(20, 3))
    stat = fake_rllib_filter_module.RunningStat()
    stat.num_pushes, stat.mean_array = 20, observations.mean(axis=0)
    stat.sum_sq_diff_array = ((observations - observations.mean(axis=0)) ** 2).sum(axis=0)
    filt = fake_rllib_filter_module.MeanStdFilter()
    filt.shape, filt.demean, filt.destd, filt.clip, filt.running_stats = np.array([3]), True, True, 5.0, stat
    algorithm_state = {"worker": {"filters": {"default_policy": filt}}}
    state = policy_state(OBS, ACT, MODEL, observation_filter="MeanStdFilter")
    ckpt = read_checkpoint(write_algorithm_checkpoint(tmp_path / "ckpt", {"default_policy": state}, algorithm_state))
    assert "algorithm_state.pkl worker.filters['default_policy']" in ckpt.filter_source
    assert ckpt.filter_state["num_pushes"] == 20 and ckpt.filter_state["clip"] == 5.0


def test_non_torch_policies_are_refused_with_the_reason(tmp_path: Path) -> None:
    state = policy_state(OBS, ACT, MODEL)
    state["policy_spec"]["config"]["framework"] = "tf2"
    with pytest.raises(CheckpointError, match=r"policy_state.pkl: policy_spec.config.framework is 'tf2'"):
        read_checkpoint(write_algorithm_checkpoint(tmp_path / "ckpt", {"default_policy": state}))


def test_an_invalid_model_config_names_the_file(tmp_path: Path) -> None:
    state = policy_state(OBS, ACT, MODEL)
    state["policy_spec"]["config"]["model"]["fcnet_hidens"] = [4]
    with pytest.raises(CheckpointError, match=r"policy_state.pkl: policy_spec.config.model: .*'fcnet_hidens'"):
        read_checkpoint(write_algorithm_checkpoint(tmp_path / "ckpt", {"default_policy": state}))


# --------------------------------------------------------------------------- msgpack

def _msgpack_array(array: np.ndarray) -> dict:
    return {b"nd": True, b"type": array.dtype.str, b"kind": b"", b"shape": list(array.shape), b"data": array.tobytes()}


def test_msgpack_policy_checkpoints_are_read(tmp_path: Path) -> None:
    state = policy_state(OBS, ACT, MODEL, normalize_actions=False)
    state["weights"] = {k: _msgpack_array(v) for k, v in state["weights"].items()}
    state["global_timestep"] = {b"nd": False, b"type": "<i8", b"data": np.int64(10).tobytes()}
    (tmp_path / "policy_state.msgpck").write_bytes(msgpack.packb(state))
    ckpt = read_checkpoint(tmp_path)
    assert ckpt.files.format == "msgpack" and ckpt.normalize_actions is False
    expected = policy_state(OBS, ACT, MODEL)["weights"]
    for key, value in expected.items():
        np.testing.assert_array_equal(ckpt.weights[key], value)


def test_msgpack_object_arrays_are_refused(tmp_path: Path) -> None:
    state = {"weights": {"w": {b"nd": True, b"type": "|O", b"kind": b"O", b"shape": [1], b"data": b"\x80\x04."}}}
    (tmp_path / "policy_state.msgpck").write_bytes(msgpack.packb(state))
    with pytest.raises(CheckpointError, match=r"policy_state.msgpck: an array of kind b'O'"):
        read_checkpoint(tmp_path)
