"""Check a recorded RLlib checkpoint case against RLlib itself, in a fresh process.

Not part of rlserve: it needs ray (the environment record_rllib_checkpoint.py ran with).

    PYTHONPATH=tests/fixtures/checkpoints-custom/custom_models_src \\
        /work/rayenv-old/bin/python scripts/check_rllib_checkpoint.py \\
        tests/fixtures/checkpoints-custom/ppo_cartpole_custom_fc [...]

For each case folder (the layout record_rllib_checkpoint.py writes): registers the custom
model that ``reference.json:custom_model`` names (``class`` imported from its module, under
``registered_name``, with the recorder's own ``register_custom_model``), reads the policy
back with RLlib's ``Policy.from_checkpoint`` and requires bit-identical answers (and the
module's sha256 to be the recorded ``module_sha256``):

- ``fixed``: ``Policy.compute_single_action`` (``explore=False``, initial state, zero
  previous action/reward) and the model's own forward on a batch of one give the recorded
  ``dist_inputs`` and ``value``; a batched forward of all the observations agrees within
  1e-5 (its max difference is printed: batching changes the last bits);
- ``episode`` (recurrent): each step fed the recorded ``state_in`` gives the recorded
  ``dist_inputs``, ``value`` and ``state_out``, through ``compute_single_action`` and through
  the model's forward (``seq_lens=[1]``); the recorded ``state_in`` of step 0 is the model's
  ``get_initial_state()`` and that of step t+1 the ``state_out`` of step t.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record_rllib_checkpoint import register_custom_model  # noqa: E402


def _register(case: Path, reference: dict) -> None:
    custom = reference.get("custom_model")
    if not custom:
        return
    module, _, cls = custom["class"].rpartition(".")
    args = argparse.Namespace(custom_model=f"{module}:{cls}", custom_name=custom["registered_name"], out=case.resolve())
    found = register_custom_model(args, dict(reference["model_overrides"]))
    if found is None or found["module_sha256"] != custom["module_sha256"]:
        raise SystemExit(f"{case.name}: the imported {module}.py is not the source the case was recorded with")


def _same(what: str, got, expected) -> None:
    got, expected = np.asarray(got), np.asarray(expected)
    if got.shape != expected.shape or not np.array_equal(got, expected):
        diff = np.max(np.abs(got.astype(np.float64) - expected)) if got.shape == expected.shape else "shape"
        raise SystemExit(f"{what}: differs from the recording ({diff})")


def _forward(policy, obs: np.ndarray, state: list, prev_action=None, prev_reward=None):
    import torch

    batch = {"obs": torch.as_tensor(obs)}
    if prev_action is not None:
        batch["prev_actions"] = torch.as_tensor(prev_action)
        batch["prev_rewards"] = torch.as_tensor(prev_reward)
    seq_lens = torch.ones(len(obs), dtype=torch.int32) if state else None
    with torch.no_grad():
        out, state_out = policy.model(batch, [torch.as_tensor(s) for s in state], seq_lens)
        value = policy.model.value_function()
    return out.numpy(), value.numpy(), [s.numpy() for s in state_out]


def check(case: Path) -> None:
    from ray.rllib.policy.policy import Policy

    reference = json.loads((case / "reference.json").read_text())
    arrays = np.load(case / "reference.npz")
    _register(case, reference)
    policy = Policy.from_checkpoint(str((case / "checkpoint" / "policies" / "default_policy").resolve()))
    policy.model.eval()
    initial = [np.asarray(s, np.float32) for s in policy.get_initial_state()]
    zero_action = np.zeros(policy.action_space.shape, policy.action_space.dtype)

    fixed_obs = np.asarray(reference["fixed"]["obs"], np.float32)
    for i, obs in enumerate(fixed_obs):
        _, _, extra = policy.compute_single_action(
            obs, state=initial, prev_action=zero_action, prev_reward=0.0, explore=False
        )
        _same(f"fixed[{i}] compute_single_action dist_inputs", extra["action_dist_inputs"],
              arrays["fixed_dist_inputs"][i])
        _same(f"fixed[{i}] compute_single_action value", extra["vf_preds"], arrays["fixed_value"][i])
        logits, value, _ = _forward(policy, obs[None], [s[None] for s in initial])
        _same(f"fixed[{i}] forward dist_inputs", logits[0], arrays["fixed_dist_inputs"][i])
        _same(f"fixed[{i}] forward value", value[0], arrays["fixed_value"][i])
    logits, value, _ = _forward(policy, fixed_obs, [np.stack([s] * len(fixed_obs)) for s in initial])
    batched = max(np.max(np.abs(logits - arrays["fixed_dist_inputs"])), np.max(np.abs(value - arrays["fixed_value"])))
    if batched > 1e-5:
        raise SystemExit(f"fixed: the batched forward differs by {batched}")
    print(f"{case.name}: fixed {len(fixed_obs)} observations identical (batched forward max diff {batched:.2g})")

    if not reference["recurrent"]:
        return
    states = np.load(case / "episode_states.npz")
    n_state = len([k for k in states.files if k.startswith("state_in/")])
    episode = reference["episode"]
    for i in range(n_state):
        _same(f"episode state_in/{i} at step 0 vs get_initial_state", states[f"state_in/{i}"][0], initial[i])
    for t, obs in enumerate(np.asarray(episode["obs"], np.float32)):
        state_in = [states[f"state_in/{i}"][t] for i in range(n_state)]
        prev_a = np.asarray(episode["prev_action"][t], policy.action_space.dtype)
        prev_r = np.float32(episode["prev_reward"][t])
        _, state_out, extra = policy.compute_single_action(
            obs, state=state_in, prev_action=prev_a, prev_reward=prev_r, explore=False
        )
        _same(f"episode[{t}] compute_single_action dist_inputs", extra["action_dist_inputs"],
              arrays["episode_dist_inputs"][t])
        _same(f"episode[{t}] compute_single_action value", extra["vf_preds"], arrays["episode_value"][t])
        logits, value, forward_out = _forward(
            policy, obs[None], [s[None] for s in state_in], prev_a[None], np.asarray([prev_r])
        )
        _same(f"episode[{t}] forward dist_inputs", logits[0], arrays["episode_dist_inputs"][t])
        _same(f"episode[{t}] forward value", value[0], arrays["episode_value"][t])
        for i in range(n_state):
            _same(f"episode[{t}] compute_single_action state_out/{i}", state_out[i], states[f"state_out/{i}"][t])
            _same(f"episode[{t}] forward state_out/{i}", forward_out[i][0], states[f"state_out/{i}"][t])
            if t + 1 < len(episode["obs"]):
                _same(f"episode[{t + 1}] state_in/{i} vs state_out of step {t}", states[f"state_in/{i}"][t + 1],
                      states[f"state_out/{i}"][t])
    print(f"{case.name}: episode {len(episode['obs'])} steps identical ({n_state} state tensors)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("cases", type=Path, nargs="+")
    for case in p.parse_args().cases:
        check(case)


if __name__ == "__main__":
    main()
