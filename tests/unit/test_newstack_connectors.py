"""New-stack connectors: where each runs, what is refused (by name), FlattenObservations'
arithmetic, DQN's epsilon schedule, and a pipeline holding a connector nobody reproduces."""

from __future__ import annotations

import pickle
import shutil
import sys
import types
from pathlib import Path

import numpy as np
import pytest
from gymnasium import spaces as gs
from newstack_cases import case_ids, load_case, newstack_dir

from rlserve.models.checkpoint import CheckpointError
from rlserve.models.connectors import ConnectorPipeline, ConnectorPlanError, plan_connectors
from rlserve.models.connectors.flatten import flat_size, flatten_batch
from rlserve.models.filters import MeanStdFilter
from rlserve.models.newstack import CustomModuleError, read_module_checkpoint
from rlserve.models.newstack.dists import dqn_epsilon
from rlserve.models.newstack.layout import RL_MODULE_DIR

BOX4 = gs.Box(-1.0, 1.0, (4,), np.float32)
DICT = gs.Dict({"pos": gs.Box(-1.0, 1.0, (2,), np.float32), "mode": gs.Discrete(3)})


def _filter(shape: tuple[int, ...]) -> dict:
    filt = MeanStdFilter(shape)
    for x in np.random.default_rng(0).standard_normal((10, *shape)):
        filt.push(x)
    return filt.state_dict()


def test_flatten_sorts_dict_keys_and_one_hot_encodes() -> None:
    space = gs.Dict({"z": gs.Box(0.0, 1.0, (2, 1), np.float32),
                     "a": gs.Tuple([gs.Discrete(2), gs.MultiDiscrete([2, 3])])})
    obs = {"z": np.array([[0.25], [0.5]], np.float32), "a": (1, np.array([0, 2]))}
    # a (sorted first): one-hot(1) of 2, then one-hot(0) of 2 and one-hot(2) of 3; then z raveled.
    expected = [0, 1, 1, 0, 0, 0, 1, 0.25, 0.5]
    np.testing.assert_array_equal(flatten_batch(space, [obs])[0], expected)
    assert flat_size(space) == len(expected)


def test_observation_connectors_run_on_the_server_in_rllib_order() -> None:
    steps = [("FlattenObservations", {"keys_to_remove": []}), ("MeanStdFilter", {"filter": _filter((5,))})]
    layout = plan_connectors(steps, DICT, gs.Discrete(2), gs.Box(-10, 10, (5,), np.float32))
    assert [s["class"] for s in layout.server] == ["FlattenObservations", "MeanStdFilter"] and not layout.graph
    pipeline = ConnectorPipeline.from_json(layout.to_json(), DICT)
    out = pipeline.transform_batch([{"pos": np.array([0.5, -0.5], np.float32), "mode": 2}])
    flat = np.array([[0, 0, 1, 0.5, -0.5]], np.float32)  # mode (sorted first) one-hot, then pos
    np.testing.assert_array_equal(out, MeanStdFilter.from_state(steps[1][1]["filter"]).apply(flat))


def test_history_connectors_go_into_the_graph_after_a_flatten_of_the_observation() -> None:
    steps = [("PrevActionsPrevRewards", {"n_prev_actions": 2, "n_prev_rewards": 3}),
             ("FlattenObservations", {"keys_to_remove": []}), ("MeanStdFilter", {"filter": _filter((12,))})]
    layout = plan_connectors(steps, DICT, gs.Discrete(2), gs.Box(-10, 10, (12,), np.float32))
    assert [s["class"] for s in layout.server] == ["FlattenObservations"]  # the Dict obs, flattened first
    assert [s["class"] for s in layout.graph] == ["PrevActionsPrevRewards", "FlattenObservations", "MeanStdFilter"]
    assert layout.obs_shape == (5,) and layout.module_obs_shape == (12,)  # 5 + 2 * 2 + 3
    assert layout.prev == {"n_prev_actions": 2, "n_prev_rewards": 3, "action_width": 2}
    assert layout.to_json()["prev_action_encoding"] == "one_hot"


def test_frame_stacking_keeps_the_previous_frames() -> None:
    frames = gs.Box(0.0, 1.0, (8, 8, 1), np.float32)
    layout = plan_connectors([("FrameStacking", {"num_frames": 4})], frames, gs.Discrete(3),
                             gs.Box(0.0, 1.0, (8, 8, 4), np.float32))
    assert layout.frame_stack == {"class": "FrameStacking", "num_frames": 4, "frame_shape": [8, 8, 1]}
    assert layout.obs_shape == (8, 8, 1) and layout.to_json()["prev_action_encoding"] is None


@pytest.mark.parametrize(("steps", "obs", "actions", "module_shape", "message"), [
    ([("PrevActionsPrevRewards", {"n_prev_actions": 1, "n_prev_rewards": 1}), ("FlattenObservations", {})],
     BOX4, gs.Box(-1.0, 1.0, (1,), np.float32), (6,), "one-hot encodes Discrete actions"),
    ([("PrevActionsPrevRewards", {"n_prev_actions": 1, "n_prev_rewards": 1})],
     BOX4, gs.Discrete(2), (7,), "a FlattenObservations must follow it"),
    ([("FrameStacking", {"num_frames": 2}), ("MeanStdFilter", {"filter": {}})],
     gs.Box(0.0, 1.0, (8, 8, 1), np.float32), gs.Discrete(2), (8, 8, 2), "put it last"),
    ([("MeanStdFilter", {"filter": {"shape": [2]}})], DICT, gs.Discrete(2), (5,), "only a filter over one Box"),
    ([], DICT, gs.Discrete(2), (5,), "add FlattenObservations"),
    ([("FlattenObservations", {})], DICT, gs.Discrete(2), (7,), "module was built for"),
    ([("FlattenObservations", {})], gs.Discrete(3, start=1), gs.Discrete(2), (3,), r"starts at \[1\]"),
])
def test_what_a_bundle_cannot_reproduce_is_refused_saying_why(steps, obs, actions, module_shape, message) -> None:
    with pytest.raises(ConnectorPlanError, match=message):
        plan_connectors(steps, obs, actions, gs.Box(-np.inf, np.inf, module_shape, np.float32))


def test_dqn_epsilon_follows_rllibs_piecewise_schedule() -> None:
    schedule = [[0, 1.0], [10000, 0.05]]
    assert dqn_epsilon(schedule, 0) == 1.0
    assert dqn_epsilon(schedule, 1000) == pytest.approx(0.905)
    assert dqn_epsilon(schedule, 10000) == 0.05 and dqn_epsilon(schedule, 10**6) == 0.05
    assert dqn_epsilon(0.1, 500) == 0.1 and dqn_epsilon(schedule, None) == 1.0


# --------------------------------------------------------------------------- refused in a checkpoint

class StrangeConnector:  # stands for a connector (or catalog) class a user wrote, named by reference
    pass


def _importable(monkeypatch: pytest.MonkeyPatch, dotted: str) -> type:
    """A class named ``dotted`` that pickle can name (modules made up in ``sys.modules``)."""
    module, _, name = dotted.rpartition(".")
    cls = type(name, (), {"__module__": module})
    parts = module.split(".")
    for i in range(1, len(parts) + 1):
        monkeypatch.setitem(sys.modules, ".".join(parts[:i]), types.ModuleType(".".join(parts[:i])))
    setattr(sys.modules[module], name, cls)
    return cls


def _single_agent_copy(tmp_path: Path) -> Path:
    ids = [i for i in case_ids() if not load_case(i).multi_agent]
    if not ids:
        pytest.fail(f"no single-agent new-stack case in {newstack_dir()}")
    out = tmp_path / "checkpoint"
    shutil.copytree(load_case(ids[0]).checkpoint, out, copy_function=shutil.copyfile)
    return out


def test_a_connector_nobody_reproduces_is_refused_at_export_by_name(tmp_path: Path) -> None:
    root = _single_agent_copy(tmp_path)
    ctor = root / "env_runner" / "env_to_module_connector" / "class_and_ctor_args.pkl"
    spaces = (BOX4, gs.Discrete(2))
    ctor.write_bytes(pickle.dumps({"class": StrangeConnector, "ctor_args_and_kwargs": (
        spaces, {"connectors": [(StrangeConnector, (), {"input_observation_space": None})]})}))
    with pytest.raises(CheckpointError, match=f"{__name__}.StrangeConnector cannot be reproduced"):
        read_module_checkpoint(root)


def test_a_default_module_with_a_custom_catalog_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = _single_agent_copy(tmp_path)
    from rlserve.models.checkpoint import load_pickle

    module_dir = next(p for p in (root / RL_MODULE_DIR).iterdir() if p.is_dir())
    ctor_file = module_dir / "class_and_ctor_args.pkl"
    data = load_pickle(ctor_file)
    stand_in = _importable(monkeypatch, data["class"].qualname)  # the default module's dotted name
    kwargs = {**data["ctor_args_and_kwargs"][1], "catalog_class": StrangeConnector}
    kwargs["observation_space"], kwargs["action_space"] = BOX4, gs.Discrete(2)
    ctor_file.write_bytes(pickle.dumps({"class": stand_in, "ctor_args_and_kwargs": ((), kwargs)}))
    with pytest.raises(CustomModuleError, match=f"custom catalog {__name__}.StrangeConnector"):
        read_module_checkpoint(root)
