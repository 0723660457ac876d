"""`rlserve serve --checkpoint DIR` where DIR is no single-policy checkpoint: refused before
anything loads, saying what `serve` itself accepts instead.

- a checkpoint of several policies (either stack): a policy set (`--policy-set` with a
  mapping) or one policy's own directory; never `--module-id`/`--policy-id`, which only
  `rlserve export` takes;
- a folder above the checkpoint (the fixture's layout, `.../ppo_cartpole_msgpack/checkpoint`):
  no RLlib checkpoint is there, and the folder below that looks like one is named.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rlserve.service.errors import BundleInvalid
from rlserve.service.serving.checkpoints import bundle_from_checkpoint
from rlserve.service.startup import StartRefused, check_start, load_settings

REPO = Path(__file__).resolve().parents[2]
CHECKPOINTS = REPO / "tests" / "fixtures" / "checkpoints"
OLD_STACK_SET = CHECKPOINTS / "ppo_rps_multiagent" / "checkpoint"
RL_MODULE = Path("learner_group") / "learner" / "rl_module"


def _new_stack_set(root: Path) -> Path:
    """The layout of a new-stack algorithm checkpoint with modules p0 and p1 (files only:
    the refusal is told from the layout, before any file is read)."""
    (root / "class_and_ctor_args.pkl").parent.mkdir(parents=True)
    (root / "class_and_ctor_args.pkl").write_bytes(b"")
    for module in ("p0", "p1"):
        folder = root / RL_MODULE / module
        folder.mkdir(parents=True)
        (folder / "class_and_ctor_args.pkl").write_bytes(b"")
        (folder / "module_state.pkl").write_bytes(b"")
    return root


def _refusal(spec: str) -> str:
    with pytest.raises(StartRefused) as info:
        check_start(load_settings({"checkpoints": [spec]}), given={"checkpoints"})
    (line,) = info.value.lines
    return line


@pytest.mark.parametrize("stack", ["old", "new"])
def test_a_checkpoint_of_several_policies_names_what_serve_accepts(stack: str, tmp_path: Path) -> None:
    checkpoint = OLD_STACK_SET if stack == "old" else _new_stack_set(tmp_path / "algo")
    one = checkpoint / ("policies" if stack == "old" else RL_MODULE) / "p0"
    line = _refusal(f"rps={checkpoint}")
    assert line.startswith(f"--checkpoint rps={checkpoint}: expected an RLlib checkpoint of one policy"), line
    assert "holds 2 policies (p0, p1)" in line
    assert f"--policy-set NAME={checkpoint} with an agent mapping (--map AGENT=POLICY" in line
    assert f"--checkpoint NAME={one}" in line
    assert "--module-id" not in line and "--policy-id" not in line


def test_a_multi_policy_checkpoint_in_a_repository_says_the_same(tmp_path: Path) -> None:
    """A repository's checkpoint is exported when it loads; the export says it too."""
    with pytest.raises(BundleInvalid) as info:
        bundle_from_checkpoint(OLD_STACK_SET, "rps", cache=tmp_path / "cache")
    message = info.value.message
    assert "holds 2 policies (p0, p1)" in message and "--policy-set" in message, message
    assert "--module-id" not in message and "--policy-id" not in message


def test_a_folder_above_the_checkpoint_names_the_one_below() -> None:
    above = CHECKPOINTS / "ppo_cartpole_msgpack"
    line = _refusal(f"mine={above}")
    assert line == (f"--checkpoint mine={above}: expected an RLlib checkpoint directory, received {str(above)!r}: "
                    f"no RLlib checkpoint is there; the folder below, {str(above / 'checkpoint')!r}, looks like "
                    "one: pass it")
    line = _refusal(str(CHECKPOINTS))  # two levels above: several, each named
    assert "no RLlib checkpoint is there; these folders below look like one: " in line
    assert repr(str(above / "checkpoint")) in line and "manifest" not in line


def test_a_folder_with_no_checkpoint_anywhere_below(tmp_path: Path) -> None:
    (tmp_path / "notes").mkdir()
    line = _refusal(str(tmp_path))
    assert line.endswith("no RLlib checkpoint is there (rllib_checkpoint.json or class_and_ctor_args.pkl), "
                         "nor any folder below it"), line


def test_a_bundle_and_a_single_policy_checkpoint_pass_the_check() -> None:
    for path in (REPO / "service" / "default_models" / "cartpole", CHECKPOINTS / "ppo_cartpole_msgpack" / "checkpoint",
                 OLD_STACK_SET / "policies" / "p0"):
        check_start(load_settings({"checkpoints": [str(path)]}), given={"checkpoints"})
