"""``rlserve export`` of a policy set (every policy of a multi-policy checkpoint, or listed
bundles, with an agent mapping) and ``rlserve inspect`` of one; the set refuses to load a
member that is not the one it was written with."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import gymnasium.spaces as gs
import numpy as np
import pytest
from newstack_cases import case_ids as newstack_case_ids
from newstack_cases import load_case as load_newstack_case

from rlserve.models.checkpoint import CheckpointError
from rlserve.models.export.bundle import load_bundle
from rlserve.models.export.cli import export_main, inspect_main
from rlserve.models.export.errors import BundleError
from rlserve.models.export.policy_set_export import checkpoint_policy_ids
from rlserve.models.multiagent.mapping import AgentMapping
from rlserve.models.multiagent.policy_set import load_policy_set

from .rllib_checkpoints import policy_state, write_algorithm_checkpoint

OBS, ACT = gs.Box(-1.0, 1.0, (3,), np.float32), gs.Discrete(2)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("ckpt") / "checkpoint"
    states = {"blue": policy_state(OBS, ACT, {"fcnet_hiddens": [8]}, seed=1),
              "red": policy_state(OBS, ACT, {"fcnet_hiddens": [8], "use_lstm": True, "lstm_cell_size": 4,
                                             "lstm_use_prev_action": True}, seed=2)}
    return write_algorithm_checkpoint(root, states)


def _export(argv: list[str], capsys) -> tuple[int, str, str]:
    rc = export_main([*argv, "--quiet", "--formats", "onnx"])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def test_a_multi_policy_checkpoint_exports_as_a_set_with_its_mapping(checkpoint, tmp_path, capsys) -> None:
    mapping = tmp_path / "mapping.json"
    mapping.write_text(json.dumps({"agents": {"hero": "red"}, "patterns": [["red_*", "red"]]}))
    out = tmp_path / "team"
    rc, stdout, err = _export([str(checkpoint), "--out", str(out), "--mapping", str(mapping), "--map", "b*=blue",
                               "--default-policy", "blue", "--name", "team"], capsys)
    assert rc == 0, err
    assert "policy set 'team' with policies ['blue', 'red']" in stdout
    with load_policy_set(out) as team:
        assert team.mapping == AgentMapping({"hero": "red"}, [("red_*", "red"), ("b*", "blue")], "blue")
        assert team.bundles["red"].manifest.name == "team.red"
        assert team.bundles["red"].manifest.source["policy_id"] == "red"  # each exported as on its own
        assert team.bundles["red"].manifest.signature.state  # the recurrent one
        assert not team.bundles["blue"].manifest.signature.state
    rc = inspect_main([str(out)])
    text = capsys.readouterr().out
    assert rc == 0 and "policy set  team (version 1)" in text
    assert "mapping     'hero' -> red; 'red_*' -> red; 'b*' -> blue; any other agent -> blue" in text
    assert "red (served as team.red)" in text and text.count("member ") == 2
    assert inspect_main([str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["mapping"]["default"] == "blue"


def test_mapping_errors_and_a_mapping_naming_a_missing_policy(checkpoint, tmp_path, capsys) -> None:
    rc, _, err = _export([str(checkpoint), "--out", str(tmp_path / "a"), "--map", "x=green"], capsys)
    assert rc == 2 and "names policies ['green'] that the set does not have" in err
    rc, _, err = _export([str(checkpoint), "--out", str(tmp_path / "b"), "--map", "nonsense"], capsys)
    assert rc == 2 and "--map: expected AGENT=POLICY" in err
    rc, _, err = _export([str(checkpoint), "--out", str(tmp_path / "c")], capsys)
    assert rc == 2 and "--map AGENT=POLICY" in err  # a multi-policy checkpoint without a mapping says how


def test_a_set_of_listed_bundles_and_a_tampered_member(checkpoint, tmp_path, capsys) -> None:
    for policy in ("blue", "red"):
        rc, _, err = _export([str(checkpoint), "--policy-id", policy, "--out", str(tmp_path / policy)], capsys)
        assert rc == 0, err
    out = tmp_path / "pair"
    rc, _, err = _export(["--bundle", f"one={tmp_path / 'blue'}", "--bundle", f"two={tmp_path / 'red'}",
                          "--default-policy", "one", "--out", str(out)], capsys)
    assert rc == 0, err
    with load_policy_set(out) as pair:
        assert pair.policy_ids == ["one", "two"] and pair.mapping.policy_for("anyone") == "one"
    # A member replaced by another bundle is refused: the set records each member's digest.
    shutil.rmtree(out / "policies" / "one")
    shutil.copytree(tmp_path / "red", out / "policies" / "one")
    with pytest.raises(BundleError, match="not the one the set was written with"):
        load_policy_set(out)
    rc, _, err = _export(["--bundle", f"x={tmp_path / 'nowhere'}", "--default-policy", "x",
                          "--out", str(tmp_path / "bad")], capsys)
    assert rc == 2 and "does not exist" in err
    assert load_bundle(tmp_path / "blue").manifest.name == "blue"


def _new_stack_multi_agent() -> list[str]:
    return [i for i in newstack_case_ids() if load_newstack_case(i).multi_agent]


@pytest.mark.parametrize("case_id", _new_stack_multi_agent() or ["<none>"])
def test_a_new_stack_checkpoints_modules_are_its_policies(case_id: str, tmp_path, capsys) -> None:
    """The modules of a MultiRLModule are the set's policies; a mapping naming another is
    refused before anything is exported (the export itself: tests/e2e/test_newstack_multiagent_e2e.py)."""
    if case_id == "<none>":
        pytest.fail("no multi-agent new-stack case: set RLSERVE_NEWSTACK_DIR")
    case = load_newstack_case(case_id)
    assert checkpoint_policy_ids(case.checkpoint) == sorted(case.module_ids)
    rc, _, err = _export([str(case.checkpoint), "--out", str(tmp_path / "a"), "--map", "0=nope"], capsys)
    assert rc == 2 and "names policies ['nope'] that the set does not have" in err
    assert not (tmp_path / "a" / "policies").exists()


def test_a_checkpoint_without_policies_is_refused(tmp_path, capsys) -> None:
    module = tmp_path / "algo"
    module.mkdir()
    (module / "class_and_ctor_args.pkl").write_bytes(b"")  # new stack, but no module under it
    with pytest.raises(CheckpointError, match="no RLModule here"):
        checkpoint_policy_ids(module)
    with pytest.raises(CheckpointError, match="no policies/<policy_id>/ here"):
        checkpoint_policy_ids(tmp_path)
    rc, _, err = _export([str(module), "--out", str(tmp_path / "out"), "--default-policy", "p"], capsys)
    assert rc == 2 and "no RLModule here" in err


@pytest.mark.parametrize("policy_id", ["p0\n", "", "../p", "a/b", ".p", "x" * 65])
def test_a_policy_id_is_a_plain_name_to_its_last_character(policy_id) -> None:
    """re.match's '$' matched before a final newline, so 'p0\\n' passed as a policy id."""
    from rlserve.models.multiagent.mapping import MappingError
    from rlserve.models.multiagent.policy_set import check_policy_id

    assert check_policy_id("p0") == "p0" and check_policy_id("team.red-1") == "team.red-1"
    with pytest.raises(MappingError, match="policy id"):
        check_policy_id(policy_id)
