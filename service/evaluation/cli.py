"""``rlserve experience``: ``evaluate`` here, the log's other commands in ``experience/cli.py``.

    rlserve experience evaluate LOG --model M --candidate BUNDLE_OR_VERSION [--bundles DIR]
        [--gamma G] [--clip C] [--bootstrap N] [--seed S] [--level L] [--json]

Exit status 2 with one line on stderr when the log or the candidate cannot be evaluated.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from rlserve.service.errors import ServiceError
from rlserve.service.experience.cli import experience_main as log_main

EXIT_REFUSED = 2

_NAMES = {
    "is": "IS, per-decision (RLlib ImportanceSampling)",
    "wis": "WIS, per-decision (RLlib WeightedImportanceSampling)",
    "is_trajectory": "IS, trajectory-wise",
    "wis_trajectory": "WIS, trajectory-wise",
    "dr": "doubly robust (RLlib DoublyRobust, Q = candidate's V)",
}


def experience_main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] != ["evaluate"]:
        return log_main(args)
    return evaluate_main(args[1:])


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rlserve experience evaluate",
        description="Estimate a candidate policy's return on a model's logged episodes (off-policy "
                    "evaluation; docs/experience.md, 'Evaluate a candidate offline').")
    parser.add_argument("log", type=Path, help="the experience log folder (RLSERVE_EXPERIENCE_LOG)")
    parser.add_argument("--model", required=True, help="the logged model whose episodes are evaluated")
    parser.add_argument("--candidate", required=True,
                        help="a bundle directory or .rlsb archive, or NAME@VERSION / VERSION (of --model) "
                             "found in the log's shadow columns or in --bundles")
    parser.add_argument("--bundles", type=Path, help="a model repository folder to find a candidate named by version")
    parser.add_argument("--gamma", type=float, default=1.0, help="discount (default 1)")
    parser.add_argument("--clip", type=float, help="cap every cumulative importance weight at this value")
    parser.add_argument("--bootstrap", type=int, default=1000, help="resamples of episodes for the intervals")
    parser.add_argument("--seed", type=int, default=0, help="seed of the resampling")
    parser.add_argument("--level", type=float, default=0.95, help="the intervals' level (default 0.95)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    return parser


def evaluate_main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        from rlserve.service.evaluation.evaluate import CandidateRefused, evaluate
    except ImportError as exc:
        print(f"rlserve experience evaluate needs the [experience] extra (pip install 'rlserve[experience]'): {exc}",
              file=sys.stderr)
        return EXIT_REFUSED
    try:
        result = evaluate(args.log, args.model, args.candidate, bundles=args.bundles, gamma=args.gamma,
                          clip=args.clip, bootstrap=args.bootstrap, seed=args.seed, level=args.level)
    except CandidateRefused as exc:
        print(f"rlserve experience evaluate: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    except ServiceError as exc:  # a candidate bundle that does not load
        print(f"rlserve experience evaluate: {exc.message}", file=sys.stderr)
        return EXIT_REFUSED
    print(json.dumps(result.to_dict(), indent=2) if args.json else table(result))
    return 0


def table(result: Any) -> str:
    """An ``Evaluation`` as text: one line per estimator, the behaviour's own return first."""
    pct = round(result.level * 100)
    lines = [
        f"candidate {result.candidate} on {result.episodes} episodes ({result.steps} steps) of {result.model}; "
        f"logp from {result.source}; gamma {result.gamma}"
        + (f", weights clipped at {result.clip}" if result.clip is not None else ""),
        f"{'estimator':<55} {'estimate':>12} {f'{pct}% CI':>27} {'ESS':>9}",
    ]
    rows = [("behaviour (observed return)", result.behaviour)] + [
        (_NAMES[name], estimate) for name, estimate in result.estimates.items()]
    for name, e in rows:
        ess = "" if e.ess is None else f"{e.ess:.1f}"
        lines.append(f"{name:<55} {e.value:>12.4f} [{e.low:>11.4f}, {e.high:>11.4f}] {ess:>9}")
    excluded = ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in result.excluded.items() if v)
    lines.append(f"left out: {excluded or 'nothing'}; steps served by the candidate's own version "
                 f"(ratio 1): {result.served_by_candidate_steps}")
    return "\n".join(lines)
