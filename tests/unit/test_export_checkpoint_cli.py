"""``rlserve export`` with RLlib checkpoints: the one-command form, the old flag form with
a checkpoint directory, flag overrides, and the near misses that must say which file holds
what is missing. Real checkpoints come from RLSERVE_CHECKPOINT_DIR (picked by content);
synthetic ones (``rllib_checkpoints.py``) reach the error paths."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import gymnasium.spaces as gs
import numpy as np
import pytest
from checkpoint_cases import case_ids, case_path

from rlserve.models.checkpoint import read_checkpoint
from rlserve.models.export.bundle import load_bundle
from rlserve.models.export.cli import export_main
from rlserve.models.spaces import space_to_json

from .rllib_checkpoints import filter_connector, policy_state, write_algorithm_checkpoint

OBS, ACT = gs.Box(-2.0, 2.0, (3,), np.float32), gs.Box(-2.0, 2.0, (1,), np.float32)
MODEL = {"fcnet_hiddens": [8]}


def _real_case_with_filter() -> Path:
    for case_id in case_ids():
        reference = json.loads((case_path(case_id) / "reference.json").read_text())
        if reference["observation_filter"] != "NoFilter" and (case_path(case_id) / "checkpoint" / "policies").is_dir():
            return case_path(case_id) / "checkpoint"
    pytest.fail("no algorithm checkpoint with an observation filter among the checkpoint cases")


def _export(argv: list[str], capsys) -> tuple[int, str]:
    rc = export_main([*argv, "--quiet", "--formats", "onnx"])
    return rc, capsys.readouterr().err


def _write_json(path: Path, value) -> Path:
    path.write_text(json.dumps(value))
    return path


def test_the_old_flag_form_takes_a_checkpoint_directory_and_keeps_its_filter(tmp_path: Path, capsys) -> None:
    checkpoint = _real_case_with_filter()
    read = read_checkpoint(checkpoint)
    obs = _write_json(tmp_path / "obs.json", space_to_json(read.observation_space))
    act = _write_json(tmp_path / "act.json", space_to_json(read.action_space))
    config = _write_json(tmp_path / "model.json", read.model_config)
    for i, weights in enumerate((checkpoint, checkpoint / "policies" / str(read.policy_id))):
        out = tmp_path / f"b{i}"
        rc, err = _export(["--obs-space", str(obs), "--action-space", str(act), "--config", str(config),
                           "--weights", str(weights), "--out", str(out)], capsys)
        assert rc == 0, err
        manifest = load_bundle(out).manifest
        assert manifest.filter == read.filter_state  # found in the checkpoint, not silently dropped
        assert manifest.normalize_actions == read.normalize_actions


def test_algorithm_state_pkl_as_weights_says_where_the_weights_are(tmp_path: Path, capsys) -> None:
    ckpt = write_algorithm_checkpoint(tmp_path / "ckpt", {"default_policy": policy_state(OBS, ACT, MODEL)})
    obs = _write_json(tmp_path / "obs.json", space_to_json(OBS))
    act = _write_json(tmp_path / "act.json", space_to_json(ACT))
    rc, err = _export(["--obs-space", str(obs), "--action-space", str(act), "--weights",
                       str(ckpt / "algorithm_state.pkl"), "--out", str(tmp_path / "b")], capsys)
    assert rc == 2
    assert "algorithm_state.pkl is the algorithm's state" in err
    assert f"{ckpt}/policies/<policy_id>/policy_state.pkl (policy ids here: ['default_policy'])" in err
    assert len(err.strip().splitlines()) == 1


def test_a_filter_the_config_names_but_the_checkpoint_lacks_is_an_error(tmp_path: Path, capsys) -> None:
    state = policy_state(OBS, ACT, MODEL, observation_filter="MeanStdFilter", agent_connectors=[])
    ckpt = write_algorithm_checkpoint(tmp_path / "ckpt", {"default_policy": state})
    rc, err = _export([str(ckpt), "--out", str(tmp_path / "b")], capsys)
    assert rc == 2 and not (tmp_path / "b").exists()
    assert "observation_filter is 'MeanStdFilter'" in err
    assert f"{ckpt}/policies/default_policy/policy_state.pkl (connector_configs)" in err
    assert f"{ckpt}/algorithm_state.pkl (worker.filters)" in err
    assert "--filter" in err
    # Saying explicitly that no filter applies is accepted.
    no_filter = _write_json(tmp_path / "nofilter.json", {"type": "NoFilter"})
    rc, err = _export([str(ckpt), "--filter", str(no_filter), "--out", str(tmp_path / "b")], capsys)
    assert rc == 0, err
    assert load_bundle(tmp_path / "b").manifest.filter is None


def test_policy_ids_flags_and_overrides(tmp_path: Path, capsys) -> None:
    observations = np.random.default_rng(0).normal(size=(30, 3))
    blue = policy_state(OBS, ACT, MODEL, seed=1)
    red = policy_state(OBS, ACT, {**MODEL, "free_log_std": False}, observation_filter="MeanStdFilter", seed=2,
                       agent_connectors=[filter_connector((3,), observations, clip=5.0)])
    ckpt = write_algorithm_checkpoint(tmp_path / "ckpt", {"blue": blue, "red": red})
    rc, err = _export([str(ckpt), "--out", str(tmp_path / "b")], capsys)
    assert rc == 2 and "holds policies ['blue', 'red']; pass --policy-id" in err

    rc, err = _export([str(ckpt), "--policy-id", "red", "--no-normalize-actions", "--clip-actions",
                       "--out", str(tmp_path / "b")], capsys)
    assert rc == 0, err
    manifest = load_bundle(tmp_path / "b").manifest
    assert manifest.source["policy_id"] == "red" and manifest.source["kind"] == "rllib_checkpoint"
    assert (manifest.normalize_actions, manifest.clip_actions) == (False, True)
    assert manifest.filter["num_pushes"] == 30 and manifest.filter["clip"] == 5.0

    # --config applies on top of the checkpoint's model config; weights that no longer fit say so.
    config = _write_json(tmp_path / "model.json", {"fcnet_hiddens": [4]})
    rc, err = _export([str(ckpt), "--policy-id", "blue", "--config", str(config), "--out", str(tmp_path / "c")], capsys)
    assert rc == 2 and "CHECKPOINT: weights do not fit" in err and "expected shape [4, 3]" in err


def test_a_checkpoint_that_would_run_code_is_refused(tmp_path: Path, capsys) -> None:
    class Payload:
        def __reduce__(self):
            return (open, (str(tmp_path / "pwned"), "w"))

    state = policy_state(OBS, ACT, MODEL)
    state["policy_spec"]["config"]["callbacks"] = Payload()
    ckpt = write_algorithm_checkpoint(tmp_path / "ckpt", {"default_policy": state})
    rc, err = _export([str(ckpt), "--out", str(tmp_path / "b")], capsys)
    assert rc == 2 and "policy_state.pkl: refusing to build or call" in err and "open" in err
    assert not (tmp_path / "pwned").exists()


def test_a_pre_2_0_checkpoint_file_still_exports_with_the_spaces_given(tmp_path: Path, capsys) -> None:
    weights = policy_state(OBS, ACT, MODEL)["weights"]
    legacy = tmp_path / "checkpoint-10"
    worker = pickle.dumps({"state": {"default_policy": {"weights": weights}}})
    legacy.write_bytes(pickle.dumps({"worker": worker}))
    obs = _write_json(tmp_path / "obs.json", space_to_json(OBS))
    act = _write_json(tmp_path / "act.json", space_to_json(ACT))
    config = _write_json(tmp_path / "model.json", MODEL)
    rc, err = _export(["--obs-space", str(obs), "--action-space", str(act), "--config", str(config),
                       "--weights", str(legacy), "--out", str(tmp_path / "b")], capsys)
    assert rc == 0, err
    rc, err = _export([str(legacy), "--out", str(tmp_path / "c")], capsys)
    assert rc == 2 and "pre-2.0 RLlib checkpoint stores no policy spec" in err


def test_export_checkpoint_function_equals_the_command(tmp_path: Path, capsys) -> None:
    from rlserve.models.checkpoint import CheckpointError
    from rlserve.models.export.from_checkpoint import export_checkpoint

    observations = np.random.default_rng(2).normal(size=(12, 3))
    state = policy_state(OBS, ACT, MODEL, observation_filter="MeanStdFilter", clip_actions=True,
                         agent_connectors=[filter_connector((3,), observations)])
    ckpt = write_algorithm_checkpoint(tmp_path / "ckpt", {"default_policy": state})
    bundle = export_checkpoint(ckpt, tmp_path / "api", formats=("onnx",))
    rc, err = _export([str(ckpt), "--out", str(tmp_path / "cli")], capsys)
    assert rc == 0, err
    api, cli = bundle.manifest.data, load_bundle(tmp_path / "cli").manifest.data
    for key in ("observation_space", "action_space", "model_config", "action_dist", "filter", "signature",
                "explore", "normalize_actions", "clip_actions", "source"):
        assert api[key] == cli[key], key
    assert api["normalize_actions"] is True and api["clip_actions"] is True
    _, outputs = bundle.reference()
    _, cli_outputs = load_bundle(tmp_path / "cli").reference()
    np.testing.assert_allclose(outputs["dist_inputs"], cli_outputs["dist_inputs"], rtol=1e-6)

    missing = policy_state(OBS, ACT, MODEL, observation_filter="MeanStdFilter", agent_connectors=[])
    with pytest.raises(CheckpointError, match="observation_filter is 'MeanStdFilter'"):
        export_checkpoint(write_algorithm_checkpoint(tmp_path / "m", {"p": missing}), tmp_path / "m-out")
