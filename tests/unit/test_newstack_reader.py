"""Reading new-API-stack checkpoints as data: detection, locating a module, what is read.

Every case of ``newstack_cases`` (RLSERVE_NEWSTACK_DIR plus tests/fixtures/newstack) is read
from each entry point (algorithm directory, ``learner_group/learner/rl_module``, the module's
own directory) and compared with what RLlib recorded about it in ``reference.json``: the
spaces the module sees, the effective model config, the state-dict keys and shapes, the
user connectors and the action settings. Pickles that would run code are refused before
anything runs.
"""

from __future__ import annotations

import os
import pickle
import shutil
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from checkpoint_cases import case_ids as old_case_ids
from checkpoint_cases import load_checkpoint_case
from newstack_cases import case_ids, load_case, module_pairs, newstack_dir

from rlserve.models.checkpoint import CheckpointError, UnsafePickleError
from rlserve.models.newstack import (
    CustomModuleError,
    checkpoint_module_ids,
    is_new_stack,
    locate_module,
    read_module_checkpoint,
)
from rlserve.models.newstack.layout import RL_MODULE_DIR
from rlserve.models.spaces import space_from_json


def _ids() -> list[str]:
    return case_ids() or [f"<no new-stack cases in {newstack_dir()}>"]


def _pairs() -> list[tuple[str, str]]:
    return module_pairs() or [(f"<no new-stack cases in {newstack_dir()}>", "")]


def _case(case_id: str):
    if case_id.startswith("<no new-stack"):
        pytest.fail(f"no new-stack cases found: set RLSERVE_NEWSTACK_DIR (looked in {newstack_dir()})")
    return load_case(case_id)


@pytest.mark.parametrize("case_id", _ids())
def test_every_entry_point_is_detected_and_finds_the_same_module(case_id: str) -> None:
    case = _case(case_id)
    root = case.checkpoint
    rl_module = root / RL_MODULE_DIR
    for module_id in case.module_ids:
        picked = module_id if case.multi_agent else None
        for entry in (root, rl_module, rl_module / module_id):
            assert is_new_stack(entry), entry
            files = locate_module(entry, picked)
            assert files.directory == rl_module / module_id and files.module_id == module_id
            # From any entry point the module's algorithm (and its connectors) is found.
            assert files.algorithm == root and files.env_to_module is not None


@pytest.mark.parametrize("case_id", _ids())
def test_the_modules_of_every_entry_point_are_listed(case_id: str) -> None:
    """What a policy set exports from the checkpoint: every module RLlib recorded."""
    case = _case(case_id)
    root = case.checkpoint
    assert checkpoint_module_ids(root) == checkpoint_module_ids(root / RL_MODULE_DIR) == sorted(case.module_ids)
    for module_id in case.module_ids:
        assert checkpoint_module_ids(root / RL_MODULE_DIR / module_id) == [module_id]


def test_old_stack_checkpoints_are_not_new_stack() -> None:
    dirs = [load_checkpoint_case(i).checkpoint for i in old_case_ids()]
    assert dirs
    for directory in dirs:
        assert not is_new_stack(directory), directory
        assert checkpoint_module_ids(directory) == []


@pytest.mark.parametrize(("case_id", "module_id"), _pairs())
def test_what_is_read_matches_what_rllib_recorded(case_id: str, module_id: str) -> None:
    case = _case(case_id)
    ref = case.reference["modules"][module_id]
    ckpt = read_module_checkpoint(case.checkpoint, module_id)
    assert ckpt.module_class == ref["env_runner_module_class"]
    assert ckpt.observation_space == space_from_json(ref["observation_space"])
    assert ckpt.action_space == space_from_json(ref["action_space"])
    for key, value in ref["model_config_effective"].items():
        ours = ckpt.model_config[key]
        assert _plain(ours) == _plain(value), key
    shapes = {k: list(v.shape) for k, v in ckpt.weights.items()}
    recorded = case.reference["layout"]["module_state_dicts"]
    state_file = next(v for k, v in recorded.items() if k.startswith(f"{RL_MODULE_DIR}/{module_id}/"))
    assert shapes == {k: v["shape"] for k, v in state_file.items()}
    # The module RLlib builds from the checkpoint holds a subset (DQN drops its target nets).
    assert set(ref["full_state_dict"]) <= set(shapes)
    assert all(v.dtype == np.float32 for v in ckpt.weights.values())
    plan = ckpt.connectors
    assert [s.name for s in plan.env_to_module] == (case.reference.get("env_to_module_user_connectors") or [])
    assert plan.multi_agent == case.multi_agent
    for key in ("normalize_actions", "clip_actions"):
        if key in case.reference:
            assert getattr(ckpt, key) == case.reference[key], key
    assert ckpt.source_json()["module_id"] == module_id


def _plain(value):
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _filter_cases() -> list[str]:
    return [i for i in case_ids() if load_case(i).reference.get("mean_std_filter_state_decoded")]


@pytest.mark.parametrize("case_id", _filter_cases())
def test_the_mean_std_filter_statistics_are_decoded(case_id: str) -> None:
    case = _case(case_id)
    decoded = case.reference["mean_std_filter_state_decoded"]["None"]
    stats = decoded["running_stats"][0]
    step = next(s for s in read_module_checkpoint(case.checkpoint).connectors.env_to_module
                if s.name == "MeanStdFilter")
    state = step.params["filter"]
    assert state["num_pushes"] == stats["num_pushes"]
    np.testing.assert_array_equal(state["mean"], stats["mean_array (float64)"])
    np.testing.assert_array_equal(state["sum_sq_diff"], stats["sum_sq_diff_array (float64)"])
    assert state["clip"] == decoded["clip_by_value"]


def _multi_agent_ids() -> list[str]:
    return [i for i in case_ids() if load_case(i).multi_agent]


@pytest.mark.parametrize("case_id", _multi_agent_ids())
def test_several_modules_need_a_module_id_and_the_ids_are_listed(case_id: str) -> None:
    case = _case(case_id)
    for entry in (case.checkpoint, case.checkpoint / RL_MODULE_DIR):
        with pytest.raises(CheckpointError, match="--module-id") as info:
            locate_module(entry)
        for module_id in case.module_ids:
            assert repr(module_id) in str(info.value)
    with pytest.raises(CheckpointError, match="no module 'nope'; available"):
        locate_module(case.checkpoint, "nope")


# --------------------------------------------------------------------------- code in pickles

class _RunsCommand:
    def __init__(self, target: Path):
        self.target = target

    def __reduce__(self):
        return (os.system, (f"touch {self.target}",))


def _copy(case_id: str, tmp_path: Path) -> Path:
    out = tmp_path / "checkpoint"
    shutil.copytree(_case(case_id).checkpoint, out, copy_function=shutil.copyfile)
    return out


def _first_single_agent() -> str:
    ids = [i for i in case_ids() if not load_case(i).multi_agent]
    if not ids:
        pytest.fail(f"no single-agent new-stack case in {newstack_dir()}")
    return ids[0]


@pytest.mark.parametrize("poisoned", [
    f"{RL_MODULE_DIR}/default_policy/class_and_ctor_args.pkl",
    f"{RL_MODULE_DIR}/default_policy/module_state.pkl",
    "env_runner/env_to_module_connector/class_and_ctor_args.pkl",
    "env_runner/module_to_env_connector/class_and_ctor_args.pkl",
    "class_and_ctor_args.pkl",
])
def test_a_pickle_that_would_run_code_is_refused_and_runs_nothing(tmp_path: Path, poisoned: str) -> None:
    root = _copy(_first_single_agent(), tmp_path)
    target = tmp_path / "pwned"
    (root / poisoned).write_bytes(pickle.dumps({"class": _RunsCommand(target), "x": _RunsCommand(target)}))
    with pytest.raises(UnsafePickleError, match=r"refusing to build or call (posix|nt)\.system"):
        read_module_checkpoint(root)
    assert not target.exists()


class MyOwnModule:  # stands for a user's RLModule subclass, named in the pickle by reference
    pass


def test_a_custom_module_class_is_refused_naming_it_and_how_to_serve_it(tmp_path: Path) -> None:
    root = _copy(_first_single_agent(), tmp_path)
    ctor_file = root / RL_MODULE_DIR / "default_policy" / "class_and_ctor_args.pkl"
    from rlserve.models.checkpoint import load_pickle

    original = load_pickle(ctor_file)
    kwargs = {"observation_space": gym.spaces.Box(-1.0, 1.0, (4,), np.float32), "action_space": gym.spaces.Discrete(2),
              "model_config": {"hidden": [7]}, "inference_only": False}
    ctor_file.write_bytes(pickle.dumps({"class": MyOwnModule, "ctor_args_and_kwargs": ((), kwargs)}))
    with pytest.raises(CustomModuleError, match=f"{__name__}.MyOwnModule") as info:
        read_module_checkpoint(root)
    assert "--trust-code" in str(info.value) and "\n" not in str(info.value)
    assert original["class"] is not None  # the file really held a class reference before
    # With the user's word, the same files read as a module to trace, its config as stored.
    traced = read_module_checkpoint(root, trust_code=True)
    assert traced.kind == "custom" and traced.module_class == f"{__name__}.MyOwnModule"
    assert traced.model_config == {"hidden": [7]}  # a custom module's own keys, not RLlib's defaults


def test_the_export_cache_key_of_a_module_covers_its_algorithms_connectors(tmp_path: Path) -> None:
    """A served module directory is exported with the connectors of the algorithm around it,
    so a change there must give another kept export."""
    from rlserve.service.serving.export_cache import export_key

    root = _copy(_first_single_agent(), tmp_path)
    module_dir = next(p for p in (root / RL_MODULE_DIR).iterdir() if p.is_dir())
    before = [export_key(path, "m", None) for path in (root, root / RL_MODULE_DIR, module_dir)]
    assert len(set(before)) == 3  # the folder served is part of the key
    pipeline = root / "env_runner" / "module_to_env_connector" / "state.pkl"
    pipeline.write_bytes(pipeline.read_bytes() + b"\n")
    after = [export_key(path, "m", None) for path in (root, root / RL_MODULE_DIR, module_dir)]
    assert all(a != b for a, b in zip(before, after, strict=True))
