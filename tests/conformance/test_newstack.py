"""``rlserve export CHECKPOINT`` on new-API-stack checkpoints reproduces RLlib's recorded answers.

Every module of every case of ``newstack_cases`` (RLSERVE_NEWSTACK_DIR plus
tests/fixtures/newstack; a multi-agent case's modules one by one with ``--module-id``) is
exported with the real command line and nothing else, once per run (``exported_module``;
the end-to-end server of ``test_newstack_e2e.py`` serves the same bundles). The bundle is
loaded with checksums verified and run the way the server runs it: the server's own pipeline built from the
manifest (the connector stages), ONNX Runtime (and TorchScript on the fixed observations),
the server's action distribution, and the session's windows of one-hot previous actions
and rewards kept as the server keeps them:

- ``fixed``: each raw observation alone from a fresh episode: the server stages' output
  against RLlib's module input where no stage runs in the graph; dist inputs (Q-values for
  DQN), value, the deterministic action, the action for the environment (after
  NormalizeAndClipActions), its logp, and an LSTM's state against the full module's;
- ``episode`` (recurrent cases): every recorded step in order, the state carried by the
  bundle itself and the previous actions/rewards RLlib's episode held: dist inputs, the logp
  of the action RLlib sampled, the trained critic's value and both states.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from newstack_cases import NewStackCase, episode_ids, exported_module, load_case, module_pairs, newstack_dir
from served_bundle import ServedBundle, agent_of, check_episode, check_fixed

from rlserve.models.export.bundle import Bundle, load_bundle


def _pairs() -> list[tuple[str, str]]:
    return module_pairs() or [(f"<no new-stack cases in {newstack_dir()}>", "")]


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory):
    cache: dict[tuple[str, str], Bundle] = {}

    def get(case: NewStackCase, module_id: str) -> Bundle:
        key = (case.id, module_id)
        if key not in cache:
            cache[key] = load_bundle(exported_module(tmp_path_factory, case, module_id))  # checksums verified
        return cache[key]

    return get


def _case(case_id: str) -> NewStackCase:
    if case_id.startswith("<no new-stack"):
        pytest.fail(f"no new-stack cases found: set RLSERVE_NEWSTACK_DIR (looked in {newstack_dir()})")
    return load_case(case_id)


@pytest.mark.parametrize(("case_id", "module_id"), _pairs())
def test_fixed_observations_match_rllib(case_id: str, module_id: str, exported) -> None:
    case = _case(case_id)
    bundle = exported(case, module_id)
    agent = agent_of(case, module_id)
    fixed = case.fixed(agent)
    observations = case.observations(agent)
    assert observations
    for runtime in ("onnx", "torchscript"):
        served = ServedBundle(bundle, runtime)
        for i, obs in enumerate(observations):
            served.reset()
            got = served.step(obs)
            check_fixed(served, got, fixed, i, f"{case_id}:{module_id} fixed[{i}] ({runtime})")


@pytest.mark.parametrize("case_id", episode_ids())
def test_recurrent_episode_matches_rllib_step_by_step(case_id: str, exported) -> None:
    case = _case(case_id)
    check_episode(ServedBundle(exported(case, case.module_ids[0])), case.reference["episode"], case_id)


def test_the_cases_folder_is_found() -> None:
    assert Path(newstack_dir()).is_dir() and module_pairs(), f"no new-stack cases in {newstack_dir()}"
