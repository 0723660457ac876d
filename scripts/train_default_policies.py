"""Train, verify and export the two policies rlserve ships in ``service/default_models/``.

    python scripts/train_default_policies.py                  # train both, verify, export
    python scripts/train_default_policies.py --only cartpole --skip-export
    python scripts/train_default_policies.py --evaluate       # score the saved weights

``cartpole``: an RLlib FCNet ([64, 64], tanh) for CartPole-v1. ``cartpole-memory``: an
RLlib LSTM wrapper (FCNet [64] -> LSTM 64) for CartPole-v1 without the velocity entries,
which only memory can solve. Training is plain torch PPO (``scripts/training/``) on modules
whose state_dict keys are RLlib's, so the saved ``weights.npz`` loads into the catalog
model (and into RLlib). The eager catalog model must reproduce the training module before
the bundle is exported; see docs/default_policies.md for the numbers.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

SCRIPTS = Path(__file__).resolve().parent
REPO = SCRIPTS.parent
sys.path[:0] = [str(REPO), str(SCRIPTS)]

from training.evaluate import average_return  # noqa: E402
from training.nets import FCPolicy, LSTMPolicy  # noqa: E402
from training.ppo import PPOConfig, train  # noqa: E402

from rlserve.client.envs import DEFAULT_POLICY_ENVS, make_env  # noqa: E402
from rlserve.models.spaces import space_from_json, space_to_json  # noqa: E402

DEFAULT_SOURCES = SCRIPTS / "training" / "policies"
DEFAULT_BUNDLES = REPO / "service" / "default_models"
EVAL_SEED = 100_000  # evaluation episodes are seeded apart from training and selection


@dataclass(frozen=True)
class PolicySpec:
    name: str
    model_config: dict
    ppo: PPOConfig
    seed: int


POLICIES = {
    "cartpole": PolicySpec(
        "cartpole",
        {"fcnet_hiddens": [64, 64], "fcnet_activation": "tanh"},
        PPOConfig(total_steps=100_000, n_envs=8, n_steps=32, epochs=20, reward_scale=0.1,
                  eval_every=10, eval_episodes=10),
        seed=0,
    ),
    "cartpole-memory": PolicySpec(
        "cartpole-memory",
        {"use_lstm": True, "fcnet_hiddens": [64], "fcnet_activation": "tanh",
         "lstm_cell_size": 64, "max_seq_len": 16},
        PPOConfig(total_steps=250_000, n_envs=8, n_steps=32, epochs=20, seq_len=16, reward_scale=0.1,
                  eval_every=20, eval_episodes=10, target_return=500.0),
        seed=0,
    ),
}


def training_module(config: dict, obs_dim: int, n_actions: int) -> torch.nn.Module:
    hiddens, act = list(config["fcnet_hiddens"]), config["fcnet_activation"]
    if config.get("use_lstm"):
        return LSTMPolicy(obs_dim, n_actions, hiddens, act, config["lstm_cell_size"])
    return FCPolicy(obs_dim, n_actions, hiddens, act)


def env_factory(name: str):
    return lambda: make_env(DEFAULT_POLICY_ENVS[name])


def train_policy(spec: PolicySpec, out: Path) -> Path:
    """Trains one policy and writes ``out/<name>/{weights.npz, spec.json, train_log.json}``."""
    env = env_factory(spec.name)()
    obs_space, action_space = env.observation_space, env.action_space
    env.close()
    torch.manual_seed(spec.seed)
    model = training_module(spec.model_config, obs_space.shape[0], int(action_space.n))
    log: list[dict] = []

    def record(entry: dict) -> None:
        log.append(entry)
        print(f"  [{spec.name}] " + "  ".join(f"{k}={_fmt(v)}" for k, v in entry.items()), flush=True)

    t0 = time.perf_counter()
    best, chosen = train(model, env_factory(spec.name), spec.ppo, spec.seed, record)
    wall = time.perf_counter() - t0
    _unscale_value_head(best, spec.ppo.reward_scale)
    folder = out / spec.name
    folder.mkdir(parents=True, exist_ok=True)
    weights = {k: v.detach().numpy().astype(np.float32) for k, v in best.state_dict().items()}
    np.savez(folder / "weights.npz", **weights)
    doc = {"observation_space": space_to_json(obs_space), "action_space": space_to_json(action_space),
           "model_config": spec.model_config}
    (folder / "spec.json").write_text(json.dumps(doc, indent=2) + "\n")
    meta = {"seed": spec.seed, "ppo": asdict(spec.ppo), "wall_s": round(wall, 1), "torch": torch.__version__,
            "chosen_checkpoint": chosen, "log": log}
    (folder / "train_log.json").write_text(json.dumps(meta, indent=1, default=_fmt) + "\n")
    print(f"  [{spec.name}] trained in {wall:.0f}s; checkpoint of update {chosen['update']} -> {folder}")
    return folder


def _unscale_value_head(model: torch.nn.Module, reward_scale: float) -> None:
    # The value head learned returns * reward_scale; rescaling its affine map is exact.
    with torch.no_grad():
        head = model._value_branch._model[0]
        head.weight /= reward_scale
        head.bias /= reward_scale


def _fmt(v):
    return round(v, 3) if isinstance(v, float) else v


def load_source(folder: Path) -> tuple[dict, dict[str, np.ndarray]]:
    doc = json.loads((folder / "spec.json").read_text())
    with np.load(folder / "weights.npz") as npz:
        return doc, {k: npz[k] for k in npz.files}


def catalog_model(folder: Path) -> tuple[torch.nn.Module, dict]:
    """The eager model rlserve's catalog builds for the spec, with the weights imported."""
    from rlserve.models.catalog import build_model
    from rlserve.models.rllib_import import load_rllib_weights

    doc, weights = load_source(folder)
    model = build_model(space_from_json(doc["observation_space"]), space_from_json(doc["action_space"]),
                        doc["model_config"])
    load_rllib_weights(model, weights)
    return model.eval(), doc


def initial_state(model: torch.nn.Module) -> list[torch.Tensor]:
    return [torch.full((1, *s.shape), s.initial_value) for s in model.signature().state]


@torch.no_grad()
def verify_catalog(folder: Path, steps: int = 200) -> float:
    """Max |catalog - training module| over logits, values and state along one episode."""
    catalog, doc = catalog_model(folder)
    _, weights = load_source(folder)
    obs_dim = space_from_json(doc["observation_space"]).shape[0]
    n_actions = space_from_json(doc["action_space"]).n
    trained = training_module(doc["model_config"], obs_dim, n_actions)
    trained.load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()}, strict=True)
    env = env_factory(folder.name)()
    obs, _ = env.reset(seed=EVAL_SEED)
    s_cat, s_tr = initial_state(catalog), initial_state(catalog)
    worst = 0.0
    for _ in range(steps):
        x = torch.as_tensor(obs, dtype=torch.float32).unsqueeze(0)
        a, b = catalog(x, *s_cat), trained(x, *s_tr)
        worst = max(worst, *(float((p - q).abs().max()) for p, q in zip(a, b, strict=True)))
        s_cat, s_tr = list(a[2:]), list(b[2:])
        obs, _, terminated, truncated, _ = env.step(int(a[0].argmax()))
        if terminated or truncated:
            obs, _ = env.reset()
            s_cat, s_tr = initial_state(catalog), initial_state(catalog)
    return worst


def evaluate(folder: Path, episodes: int) -> dict:
    """Average returns of the eager catalog model: greedy, sampled, and without memory."""
    model, _ = catalog_model(folder)
    state = initial_state(model)
    make = env_factory(folder.name)
    scores = {}
    for label, sample in (("greedy", False), ("sampled", True)):
        scores[label], _ = average_return(model, make, state, episodes, EVAL_SEED, sample)
        if state:  # memory ablation: the initial state fed at every step
            scores[f"{label}_state_reset_every_step"], _ = average_return(
                model, make, state, episodes, EVAL_SEED, sample, reset_state_every_step=True)
    return scores


def export(folder: Path, bundles: Path) -> Path:
    from rlserve.models.export.exporter import export_bundle

    model, doc = catalog_model(folder)
    target = bundles / folder.name
    if target.exists():
        shutil.rmtree(target)
    export_bundle(model, obs_space=space_from_json(doc["observation_space"]),
                  action_space=space_from_json(doc["action_space"]), model_config=doc["model_config"],
                  out_dir=target, name=folder.name)
    return target


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", choices=sorted(POLICIES), action="append", help="policy to train (repeatable)")
    p.add_argument("--out", type=Path, default=DEFAULT_SOURCES, help="weights/spec/log folder per policy")
    p.add_argument("--bundles", type=Path, default=DEFAULT_BUNDLES, help="where bundles are exported")
    p.add_argument("--skip-export", action="store_true", help="train (and verify) but write no bundle")
    p.add_argument("--evaluate", action="store_true", help="only score the saved weights, no training")
    p.add_argument("--episodes", type=int, default=20, help="evaluation episodes per mode")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    names = args.only or list(POLICIES)
    for name in names:
        folder = args.out / name
        if not args.evaluate:
            print(f"training {name} (seed {POLICIES[name].seed})", flush=True)
            train_policy(POLICIES[name], args.out)
            diff = verify_catalog(folder)
            print(f"  [{name}] catalog model vs training module: max abs diff {diff:.2e}")
            if diff >= 1e-5:
                raise SystemExit(f"{name}: the catalog model does not reproduce the trained module ({diff})")
            if not args.skip_export:
                print(f"  [{name}] exported {export(folder, args.bundles)}")
        scores = evaluate(folder, args.episodes)
        print(f"{name}: average return over {args.episodes} episodes: "
              + ", ".join(f"{k} {v:.1f}" for k, v in scores.items()), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
