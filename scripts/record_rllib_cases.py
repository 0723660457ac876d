"""Record conformance cases of RLlib's example custom models (old API stack) from real RLlib.

Not part of rlserve: it needs ray (run it with a separate environment, never the
project's), e.g.

    /work/rayenv/bin/python scripts/record_rllib_cases.py tests/fixtures/oracle \\
        --examples-dir /path/to/rllib/examples/_old_api_stack/models

The output folder gets the layout of ``shared/oracle/fixtures/`` (check_format.md):
``MANIFEST.json`` (versions, cases) and per case ``case.json``, ``weights.npz`` and
``io.npz``. The kinds recorded here and their io keys are described in
docs/recorded_cases.md.

RLlib's example model classes (``ray.rllib.examples._old_api_stack.models.<module>``) are
imported from ray when the installed ray has them; ray 2.60's wheel no longer ships
``rnn_model.py``, ``trajectory_view_utilizing_models.py`` and ``batch_norm_model.py``,
so ``--examples-dir`` names a folder holding those files from ray's source tree (the ray
commit is recorded in each case's notes from ``SOURCE.txt`` in that folder, when present).
They are loaded under their own dotted module names, so the class paths stored in
case.json are RLlib's.

Weights: RLlib's own init (``torch.manual_seed(seed)`` before ``get_model_v2``), then
perturbed (``W += N(0,1)*0.5/sqrt(fan_in)`` for dim>=2 parameters, ``+= N(0,0.2^2)`` for
1-D ones). Every case is recorded, its weights reloaded into a freshly built RLlib model
(another seed) and every io key recomputed: they must be bit-identical or the script fails.

The cases are listed in rllib_case_specs.py; the metadata of case.json (spaces and config as
JSON, the weights' perturbation and description, the distribution, the preprocessor) comes
from rllib_case_meta.py. This script loads the examples, builds and records the models and
checks the reload.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import platform
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from rllib_case_meta import (
    _dist_meta,
    _init_stats,
    _jsonable,
    _perturb,
    _preprocessor_meta,
    _reached_parameters,
    _weights_meta,
    space_json,
)
from rllib_case_specs import Spec, _specs

EXAMPLES = "ray.rllib.examples._old_api_stack.models"
FORMAT_VERSION = 1


# ---------------------------------------------------------------- loading the examples


def _example_module(stem: str, examples_dir: Path | None) -> Any:
    dotted = f"{EXAMPLES}.{stem}"
    try:
        return importlib.import_module(dotted)
    except ModuleNotFoundError:
        pass
    if examples_dir is None or not (examples_dir / f"{stem}.py").is_file():
        sys.exit(f"{dotted} is not in the installed ray; pass --examples-dir holding {stem}.py from ray's source")
    spec = importlib.util.spec_from_file_location(dotted, examples_dir / f"{stem}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[dotted] = module
    spec.loader.exec_module(module)
    return module


# ---------------------------------------------------------------- one case


class Recorder:
    """Builds the RLlib model of a spec, runs its kind's recording, checks the reload."""

    def __init__(self, spec: Spec, examples_dir: Path | None):
        self.spec = spec
        self.module = _example_module(spec.module, examples_dir)
        self.cls = getattr(self.module, spec.cls)
        from ray.rllib.models import MODEL_DEFAULTS, ModelCatalog

        ModelCatalog.register_custom_model(spec.registered_as, self.cls)
        self.overrides = {"custom_model": spec.registered_as, "custom_model_config": spec.custom_model_config,
                          **spec.model_overrides}
        # As a policy hands it over: MODEL_DEFAULTS merged with the overrides.
        self.config = {**MODEL_DEFAULTS, **self.overrides}
        self.dist_class: Any = None
        self.prep: Any = None

    def build(self, seed: int) -> tuple[Any, Any, Any, int]:
        import torch
        from ray.rllib.models import ModelCatalog

        dist_class, num_outputs = ModelCatalog.get_action_dist(self.spec.action_space, self.config, framework="torch")
        prep = ModelCatalog.get_preprocessor_for_space(self.spec.obs_space, self.config)
        torch.manual_seed(seed)
        model = ModelCatalog.get_model_v2(
            prep.observation_space, self.spec.action_space, num_outputs, self.config, framework="torch"
        )
        return model, dist_class, prep, num_outputs


def _torch(x: np.ndarray) -> Any:
    import torch

    return torch.from_numpy(np.ascontiguousarray(x))


def _dist_keys(dist_class: Any, model: Any, logits: Any, out: dict[str, list[np.ndarray]], sample_seed: int) -> Any:
    """dist/* keys of one step; returns the sampled action (the one the episode takes)."""
    import torch

    dist = dist_class(logits, model)
    with torch.no_grad():
        det = dist.deterministic_sample()
        out.setdefault("dist/deterministic_sample", []).append(det.numpy())
        out.setdefault("dist/entropy", []).append(dist.entropy().numpy())
        torch.manual_seed(sample_seed)
        sample = dist.sample()
        out.setdefault("dist/actions/dist_sample", []).append(sample.numpy())
        out.setdefault("dist/logp/dist_sample", []).append(dist.logp(sample).numpy())
    return sample


def record_custom_recurrent(rec: Recorder, model: Any, dist_class: Any) -> dict[str, np.ndarray]:
    """T steps, one observation per call (seq_lens = 1), state carried from get_initial_state()."""
    import torch

    spec = rec.spec
    rng = np.random.default_rng(spec.seed)
    spec.obs_space.seed(spec.seed)
    obs = np.stack([np.stack([spec.obs_space.sample() for _ in range(spec.batch)]) for _ in range(spec.steps)])
    seq_lens = np.ones(spec.batch, np.int32)
    state = [torch.as_tensor(np.tile(np.asarray(s.detach() if hasattr(s, "detach") else s)[None], (spec.batch, 1)))
             for s in model.get_initial_state()]
    out: dict[str, list[np.ndarray]] = {}
    for t in range(spec.steps):
        obs_t = _torch(obs[t])
        for i, s in enumerate(state):
            out.setdefault(f"state_in/{i}", []).append(s.numpy().copy())
        with torch.no_grad():
            logits, state = model({"obs": obs_t, "obs_flat": obs_t}, state, _torch(seq_lens))
            value = model.value_function()
        out.setdefault("model_out", []).append(logits.numpy())
        out.setdefault("value", []).append(value.numpy())
        for i, s in enumerate(state):
            out.setdefault(f"state_out/{i}", []).append(s.numpy().copy())
        taken = _dist_keys(dist_class, model, logits, out, sample_seed=int(rng.integers(1 << 30)))
        # The episode goes on with the sampled action and a made-up reward (what a session reports).
        out.setdefault("actions_taken", []).append(taken.numpy())
        out.setdefault("rewards", []).append(rng.normal(size=spec.batch).astype(np.float32))
    io = {k: np.stack(v) for k, v in out.items()}
    return {"seq_lens": seq_lens, "obs": obs, "obs_flat": obs.astype(np.float32), **io}


def _state_meta_custom_recurrent(model: Any) -> dict[str, Any]:
    init = [np.asarray(s.detach() if hasattr(s, "detach") else s) for s in model.get_initial_state()]
    return {
        "type": "custom_recurrent",
        "num_state_tensors": len(init),
        "state_shapes_per_row": [list(s.shape) for s in init],
        "initial_state": "zeros" if all(not s.any() for s in init) else [s.tolist() for s in init],
    }


def _collector(model: Any, spec: Spec) -> Any:
    """RLlib's sampler-side AgentCollector with the model's view requirements and a policy's
    standard columns (they do not change the windows: the model's shifts are the widest)."""
    from ray.rllib.evaluation.collectors.agent_collector import AgentCollector
    from ray.rllib.policy.sample_batch import SampleBatch as SB
    from ray.rllib.policy.view_requirement import ViewRequirement as VR

    reqs = dict(model.view_requirements)
    for col, req in {
        SB.ACTIONS: VR(space=spec.action_space, used_for_compute_actions=False),
        SB.REWARDS: VR(used_for_compute_actions=False),
        SB.TERMINATEDS: VR(used_for_compute_actions=False),
        SB.TRUNCATEDS: VR(used_for_compute_actions=False),
        SB.NEXT_OBS: VR(data_col=SB.OBS, shift=1, space=spec.obs_space, used_for_compute_actions=False),
    }.items():
        reqs.setdefault(col, req)
    return AgentCollector(reqs, max_seq_len=1, disable_action_flattening=False, intial_states=[],
                          is_policy_recurrent=False, is_training=False)


def _observations(spec: Spec, rng: Any, rows: int) -> list[Any]:
    samples = [spec.obs_space.sample() for _ in range(rows)]
    return [spec.fix_obs(o, rng, i) for i, o in enumerate(samples)] if spec.fix_obs else samples


def _leaves(space: Any, values: list[Any]) -> dict[str, np.ndarray]:
    """io keys ``obs[/path]`` of a batch of raw observations (Dict keys in space order)."""
    from gymnasium import spaces as gs

    if isinstance(space, gs.Dict):
        out = {}
        for key, sub in space.spaces.items():
            out.update({f"/{key}{path}": v for path, v in _leaves(sub, [x[key] for x in values]).items()})
        return out
    return {"": np.stack([np.asarray(v, dtype=space.dtype) for v in values])}


def record_feedforward(rec: Recorder, model: Any, dist_class: Any) -> dict[str, np.ndarray]:
    """One batch of B observations through RLlib's model as a policy calls it in inference."""
    import torch

    spec = rec.spec
    rng = np.random.default_rng(spec.seed)
    spec.obs_space.seed(spec.seed)
    raw = _observations(spec, rng, spec.batch)
    obs_flat = np.stack([rec.prep.transform(o) for o in raw])
    with torch.no_grad():
        logits, _ = model({"obs": _torch(obs_flat)}, [], None)
        value = model.value_function()
    out: dict[str, list[np.ndarray]] = {}
    _dist_keys(dist_class, model, logits, out, sample_seed=int(rng.integers(1 << 30)))
    io = {f"obs{path}": v for path, v in _leaves(spec.obs_space, raw).items()}
    return {**io, "obs_flat": obs_flat, "model_out": logits.numpy(), "value": value.numpy(),
            **{k: v[0] for k, v in out.items()}}


def _warm_up(rec: Recorder, model: Any) -> None:
    """Training-mode passes, as RLlib's learner runs them: they update batch-norm statistics."""
    import torch

    spec = rec.spec
    rng = np.random.default_rng(spec.seed + 7)
    spec.obs_space.seed(spec.seed + 7)
    for rows in spec.warmup_batches:
        batch = np.stack([rec.prep.transform(o) for o in _observations(spec, rng, rows)])
        with torch.no_grad():
            model({"obs": _torch(batch), "is_training": True}, [], None)


VIEW_COLUMNS = ("prev_n_obs", "prev_n_actions", "prev_n_rewards")


def record_trajectory_view(rec: Recorder, model: Any, dist_class: Any) -> dict[str, np.ndarray]:
    """T steps of B episodes; each row's windows are built by its own AgentCollector."""
    import torch
    from ray.rllib.policy.sample_batch import SampleBatch as SB

    spec = rec.spec
    rng = np.random.default_rng(spec.seed)
    spec.obs_space.seed(spec.seed)
    obs = np.stack([np.stack([spec.obs_space.sample() for _ in range(spec.batch)]) for _ in range(spec.steps)])
    collectors = [_collector(model, spec) for _ in range(spec.batch)]
    for b, c in enumerate(collectors):
        c.add_init_obs(episode_id=b, agent_index=0, env_id=0, init_obs=obs[0, b], t=-1)
    out: dict[str, list[np.ndarray]] = {}
    for t in range(spec.steps):
        built = [c.build_for_inference() for c in collectors]
        views = {k: np.concatenate([np.asarray(x[k]) for x in built]) for k in VIEW_COLUMNS}
        for k, v in views.items():
            out.setdefault(k, []).append(v)
        input_dict = {"obs": _torch(obs[t]), "obs_flat": _torch(obs[t]), **{k: _torch(v) for k, v in views.items()}}
        with torch.no_grad():
            logits, _ = model(input_dict, [], None)
            value = model.value_function()
        out.setdefault("model_out", []).append(logits.numpy())
        out.setdefault("value", []).append(value.numpy())
        taken = _dist_keys(dist_class, model, logits, out, sample_seed=int(rng.integers(1 << 30))).numpy()
        rewards = rng.normal(size=spec.batch).astype(np.float32)
        out.setdefault("actions_taken", []).append(taken)
        out.setdefault("rewards", []).append(rewards)
        nxt = obs[t + 1] if t + 1 < spec.steps else obs[t]
        for b, c in enumerate(collectors):
            c.add_action_reward_next_obs({SB.ACTIONS: taken[b], SB.REWARDS: float(rewards[b]), SB.NEXT_OBS: nxt[b],
                                          SB.TERMINATEDS: False, SB.TRUNCATEDS: False})
    io = {k: np.stack(v) for k, v in out.items()}
    return {"obs": obs, "obs_flat": obs.astype(np.float32), **io}


RECORDERS: dict[str, tuple[Callable[..., dict[str, np.ndarray]], Callable[[Any], dict[str, Any]] | None]] = {
    "custom_recurrent": (record_custom_recurrent, _state_meta_custom_recurrent),
    "trajectory_view": (record_trajectory_view, None),
    "batch_norm": (record_feedforward, None),
    "parametric_actions": (record_feedforward, None),
}


def _reached(rec: Recorder, model: Any) -> set[str]:
    """Gradient paths from one step of the recording's inputs (fresh graph, with grad)."""
    import torch

    spec = rec.spec
    rng = np.random.default_rng(spec.seed + 11)
    obs = _torch(np.stack([rec.prep.transform(o) for o in _observations(spec, rng, 2)]).astype(np.float32))
    state = [torch.zeros((2, *np.asarray(s.detach() if hasattr(s, "detach") else s).shape))
             for s in model.get_initial_state()]
    views = {}
    if spec.kind == "trajectory_view":
        views = {k: _torch(v[0, :2]) for k, v in record_trajectory_view(rec, model, rec.dist_class).items()
                 if k in VIEW_COLUMNS}
    logits, _ = model({"obs": obs, "obs_flat": obs, **views}, state, torch.ones(2, dtype=torch.int32))
    return _reached_parameters(model, [logits, model.value_function()])


def record_case(spec: Spec, out_dir: Path, examples_dir: Path | None, versions: dict[str, str]) -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)
    rec = Recorder(spec, examples_dir)
    record, state_meta = RECORDERS[spec.kind]
    model, dist_class, prep, num_outputs = rec.build(spec.seed)
    rec.dist_class, rec.prep = dist_class, prep
    init_stats = _init_stats(model.state_dict())
    _perturb(model, torch.Generator().manual_seed(spec.seed + 1))
    _warm_up(rec, model)
    model.eval()
    weights = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    io = record(rec, model, dist_class)

    # The reload check: a fresh model with another init, the weights loaded, the same io.
    fresh, _, _, _ = rec.build(spec.seed + 1000)
    fresh.load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()})
    fresh.eval()
    again = record(rec, fresh, dist_class)
    for key, value in io.items():
        if not np.array_equal(value, again[key]):
            raise SystemExit(f"{spec.name}: reloading weights.npz does not reproduce io key {key!r}")

    # The dotted class path stands for the registered name (check_format.md); the name is in the notes.
    named = {"custom_model": f"{EXAMPLES}.{spec.module}.{spec.cls}"}
    config = {**dict(model.model_config), **named}
    meta: dict[str, Any] = {
        "format_version": FORMAT_VERSION, "case": spec.name, "kind": spec.kind, "description": spec.description,
        "seed": spec.seed, "versions": versions, "torch_num_threads": 1,
        "observation_space": space_json(spec.obs_space), "action_space": space_json(spec.action_space),
        "model_config_overrides": _jsonable({**rec.overrides, **named}),
        "model_config": _jsonable(config),
        "model_class": type(model).__name__,
        "model_class_mro": [c.__name__ for c in type(model).__mro__ if c.__name__ not in ("Module", "object")],
        "num_outputs": int(num_outputs), "model_num_outputs": int(model.num_outputs),
        "action_dist": _dist_meta(dist_class),
        "preprocessor": _preprocessor_meta(prep, spec.obs_space),
        "model_obs_space": {**space_json(prep.observation_space),
                            "has_original_space": hasattr(prep.observation_space, "original_space")},
        "batch_size": spec.batch,
    }
    if "state_in/0" in io or spec.kind == "trajectory_view":
        meta["T"] = spec.steps
    if state_meta is not None:
        meta["state"] = state_meta(model)
    meta["weights"] = _weights_meta(model, init_stats, _reached(rec, model))
    meta["dist_errors"] = {}
    meta["io_keys"] = {k: {"shape": list(v.shape), "dtype": str(v.dtype)} for k, v in io.items()}
    meta["notes"] = [f"registered with ModelCatalog.register_custom_model({spec.registered_as!r}, {spec.cls})",
                     *spec.notes, *_source_notes(examples_dir, spec.module)]

    case_dir = out_dir / spec.name
    case_dir.mkdir(parents=True, exist_ok=True)
    (case_dir / "case.json").write_text(json.dumps(meta, indent=1) + "\n")
    np.savez_compressed(case_dir / "weights.npz", **weights)
    np.savez_compressed(case_dir / "io.npz", **io)
    return {"kind": spec.kind, "model_class": meta["model_class"], "action_dist": meta["action_dist"]["class"],
            "dist_errors": {}}


def _source_notes(examples_dir: Path | None, stem: str) -> list[str]:
    try:
        importlib.import_module(f"{EXAMPLES}.{stem}")
        if sys.modules[f"{EXAMPLES}.{stem}"].__file__ and examples_dir is None:
            return []
    except ModuleNotFoundError:
        pass
    source = examples_dir / "SOURCE.txt" if examples_dir else None
    text = source.read_text().strip() if source and source.is_file() else "ray's source tree"
    return [f"{stem}.py is not in ray 2.60's wheel; loaded from {text}"]


def _versions() -> dict[str, str]:
    import gymnasium
    import ray
    import torch

    return {"ray": ray.__version__, "torch": torch.__version__, "gymnasium": gymnasium.__version__,
            "numpy": np.__version__, "python": platform.python_version()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--examples-dir", type=Path, default=None)
    p.add_argument("--kind", action="append", help="record only these kinds (repeatable)")
    args = p.parse_args()
    versions = _versions()
    args.out.mkdir(parents=True, exist_ok=True)
    manifest_path = args.out / "MANIFEST.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.is_file() else {"cases": {}}
    manifest.update(format_version=FORMAT_VERSION, versions=versions)
    for spec in _specs():
        if args.kind and spec.kind not in args.kind:
            continue
        manifest["cases"][spec.name] = record_case(spec, args.out, args.examples_dir, versions)
        print(f"recorded {spec.name} ({spec.kind})")
    manifest_path.write_text(json.dumps(manifest, indent=1) + "\n")


if __name__ == "__main__":
    main()
