"""``rlserve experience``: look at a log folder, or convert it for RLlib's old stack.

    rlserve experience summary DIR [--model NAME] [--json]
    rlserve experience to-json DIR OUT [--model NAME]
    rlserve experience evaluate DIR --model NAME --candidate BUNDLE  (``evaluation/cli.py``)

``summary`` prints, per model: transitions, episodes (whole ones: every step from the first
observation to the last), the return of each episode, the versions that served them, and
how many steps were taken with ``explore`` off, the steps a shadow candidate scored, and
the delayed rewards (those whose event id
no logged step has change nothing, and are counted). ``to-json`` writes RLlib's old-stack JSON
format (one ``SampleBatch`` per line, one per episode; ``input_="OUT"`` with the old API
stack's ``JsonReader``).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rlserve experience", description="Read an experience log folder "
                                     "(RLSERVE_EXPERIENCE_LOG; docs/experience.md). `rlserve experience evaluate "
                                     "--help`: off-policy evaluation of a candidate policy on it.")
    commands = parser.add_subparsers(dest="command", required=True)
    summary = commands.add_parser("summary", help="episodes, transitions, returns, models and versions")
    summary.add_argument("folder", type=Path)
    summary.add_argument("--model", help="only this model (default: every model in the folder)")
    summary.add_argument("--json", action="store_true", help="print JSON instead of text")
    to_json = commands.add_parser("to-json", help="RLlib's old-stack JSON SampleBatch files")
    to_json.add_argument("folder", type=Path)
    to_json.add_argument("out", type=Path, help="a folder; one .json file per model is written in it")
    to_json.add_argument("--model", help="only this model")
    return parser


def experience_main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        from rlserve.service.experience import reader
    except ImportError as exc:
        print(f"rlserve experience needs the [experience] extra (pip install 'rlserve[experience]'): {exc}",
              file=sys.stderr)
        return 2
    if not args.folder.is_dir():
        print(f"rlserve experience: {args.folder} is not a folder", file=sys.stderr)
        return 2
    names = [args.model] if args.model else reader.models(args.folder)
    if args.command == "summary":
        report = {name: summarize(args.folder, name) for name in names}
        print(json.dumps(report, indent=2) if args.json else _text(report))
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    for name in names:
        count = write_sample_batches(args.folder, name, args.out / f"{name}.json")
        print(f"{name}: {count} episodes -> {args.out / (name + '.json')}")
    return 0


def summarize(root: Path, model: str) -> dict[str, Any]:
    from rlserve.service.experience import reader

    table = reader.transitions(root, model)
    episodes = reader.episodes(root, model)
    infos = [] if table is None else table.column("infos").to_pylist()
    versions = Counter(info["version"] for info in infos)
    deterministic = sum(1 for info in infos if not info["explore"])
    whole = [e for e in episodes if e.whole]
    events = reader.read_form(root, model, "rewards")
    rewarded = [] if events is None else events.column("event_id").to_pylist()
    logged = {info["event_id"] for info in infos} | {i for episode in episodes for i in episode.event_ids}
    scores = reader.shadow_scores(root, model)
    scored = [] if scores is None else scores.column("event_id").to_pylist()
    transition_ids = {info["event_id"] for info in infos}
    return {
        "transitions": 0 if table is None else table.num_rows,
        "episodes": len({e.eps_id for e in episodes}),
        "whole_episodes": len(whole),
        "unfinished_or_partial": len(episodes) - len(whole),
        "returns": {e.eps_id: round(e.episode_return, 6) for e in whole},
        "mean_return": round(float(np.mean([e.episode_return for e in whole])), 6) if whole else None,
        "versions": dict(sorted(versions.items())),
        "steps_without_explore": deterministic,
        "delayed_rewards": len(rewarded),
        # Rewards for event ids no logged step has (never served, or served unlogged): they change nothing.
        "unmatched_rewards": sum(event_id not in logged for event_id in rewarded),
        # Transitions a shadow candidate scored (shadow/, joined by event id), and per candidate its scores.
        "shadowed_steps": len(transition_ids.intersection(scored)),
        "shadow_candidates": dict(sorted(Counter([] if scores is None
                                                 else scores.column("candidate").to_pylist()).items())),
    }


def _text(report: dict[str, dict[str, Any]]) -> str:
    lines = []
    for name, facts in report.items():
        lines.append(f"model {name}: {facts['transitions']} transitions, {facts['episodes']} episodes "
                     f"({facts['whole_episodes']} whole, {facts['unfinished_or_partial']} unfinished or partial)")
        versions = ", ".join(f"{v} ({n} steps)" for v, n in facts["versions"].items()) or "none"
        lines.append(f"  versions: {versions}; steps with explore off: {facts['steps_without_explore']}")
        if facts["shadow_candidates"]:
            candidates = ", ".join(f"{c} ({n} scores)" for c, n in facts["shadow_candidates"].items())
            lines.append(f"  shadowed steps: {facts['shadowed_steps']}; candidates: {candidates}")
        if facts["mean_return"] is not None:
            lines.append(f"  mean return of whole episodes: {facts['mean_return']}")
        if facts["delayed_rewards"]:
            lines.append(f"  delayed rewards: {facts['delayed_rewards']}, {facts['unmatched_rewards']} of them for "
                         "event ids no logged step has (they change nothing)")
        for eps_id, episode_return in facts["returns"].items():
            lines.append(f"  {eps_id}: return {episode_return}")
    return "\n".join(lines) if lines else "no models in this log"


def write_sample_batches(root: Path, model: str, out: Path) -> int:
    """Each episode (or partial run of one) as a line of RLlib's old-stack JSON format."""
    from rlserve.service.experience import reader

    episodes = reader.episodes(root, model)
    with open(out, "w") as handle:
        for index, episode in enumerate(episodes):
            handle.write(json.dumps(_sample_batch(episode, index)) + "\n")
    return len(episodes)


def _sample_batch(episode: Any, index: int) -> dict[str, Any]:
    n = len(episode)
    obs = [np.asarray(o).tolist() for o in episode.observations]
    logp = np.asarray(episode.action_logp, dtype=np.float64)
    ends = [False] * n
    return {
        "type": "SampleBatch",
        "eps_id": [episode.eps_id] * n,
        "unroll_id": [index] * n,
        "agent_index": [0] * n,
        "t": list(range(episode.t_started, episode.t_started + n)),
        "obs": obs[:-1],
        "new_obs": obs[1:],
        "actions": [np.asarray(a).tolist() for a in episode.actions],
        "rewards": [float(r) for r in episode.rewards],
        "terminateds": ends[:-1] + [episode.is_terminated] if n else [],
        "truncateds": ends[:-1] + [episode.is_truncated] if n else [],
        "action_logp": [None if np.isnan(x) else float(x) for x in logp],
        "action_prob": [None if np.isnan(x) else float(np.exp(x)) for x in logp],
    }
