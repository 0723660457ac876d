"""Off-policy evaluation of a candidate on a model's logged episodes (``rlserve experience
evaluate``; docs/experience.md, "Evaluate a candidate offline").

Which episodes count: whole ones (from the first step to a ``terminated`` or ``truncated``
last observation) whose every step was served with ``explore`` on and has a logp. An
episode with a step served with ``explore`` off is left out whole: that step's action was
the mode, with no behaviour probability, and RLlib's per-decision weights multiply every
later step's ratio by it (its estimators need ``action_prob`` on every row of an episode).
Every exclusion is counted in the report.

Where the candidate's logp of each logged action comes from: the shadow's columns
(``experience/shadow_logps.py``) when they name the candidate and cover every evaluated
step; otherwise the candidate bundle run over the episodes (``candidate_probs.py``). A step
served by the candidate's own version (the log's model name and version equal the
candidate's) takes ratio exactly 1: its logged logp is the candidate's, and running the
bundle again in other batches need not reproduce it to the last float32 bit.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rlserve.models.export.bundle import load_bundle
from rlserve.service.evaluation.candidate_probs import Candidate, CandidateRefused
from rlserve.service.experience import reader
from rlserve.service.experience.estimators import Estimate, Estimators, Padded
from rlserve.service.experience.shadow_logps import shadow_logps
from rlserve.service.serving.loading import discover_bundles


@dataclass
class Evaluation:
    model: str
    candidate: str  # "<name>@<version>"
    source: str  # "shadow" | "bundle" | "served" (every step served by the candidate's version)
    gamma: float
    clip: float | None
    bootstrap: int
    seed: int
    level: float
    episodes: int  # evaluated
    steps: int
    behaviour: Estimate
    estimates: dict[str, Estimate]
    excluded: dict[str, int] = field(default_factory=dict)
    served_by_candidate_steps: int = 0  # steps whose ratio is 1 because the candidate served them

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["behaviour"] = _estimate_dict(self.behaviour)
        out["estimates"] = {name: _estimate_dict(e) for name, e in self.estimates.items()}
        return out


def _estimate_dict(estimate: Estimate) -> dict[str, Any]:
    return {"estimate": estimate.value, "ci_low": estimate.low, "ci_high": estimate.high, "ess": estimate.ess}


def evaluate(log: Path, model: str, candidate: str | Path, *, bundles: Path | None = None, gamma: float = 1.0,
             clip: float | None = None, bootstrap: int = 1000, seed: int = 0, level: float = 0.95) -> Evaluation:
    """Estimate ``candidate``'s expected discounted return on ``model``'s logged episodes.

    ``candidate``: a bundle directory or ``.rlsb`` archive, or ``"<name>@<version>"`` /
    ``"<version>"`` (of ``model``), found in the shadow's columns or among ``bundles`` (a
    model repository folder). Raises ``CandidateRefused`` with one line when it cannot."""
    _check_arguments(gamma, clip, bootstrap, level)
    episodes, excluded = select_episodes(Path(log), model)
    path, label = _resolve(candidate, model, bundles)
    served = [np.array([f"{model}@{v}" == label for v in e.versions]) for e in episodes]
    behaviour_logp = [np.asarray(e.action_logp, np.float64) for e in episodes]
    logp, values, source = _candidate_logps(Path(log), model, episodes, path, label, served)
    ratios = [np.where(s, 1.0, np.exp(new - old)) for s, new, old in zip(served, logp, behaviour_logp, strict=True)]
    data = Padded.from_lists([np.asarray(e.rewards, np.float64) for e in episodes], ratios, values)
    results = Estimators(data, gamma, clip).estimate(bootstrap, seed, level)
    behaviour = results.pop("behaviour")
    return Evaluation(model, label, source, gamma, clip, bootstrap, seed, level, len(episodes),
                      sum(len(e) for e in episodes), behaviour, results, excluded,
                      int(sum(s.sum() for s in served)))


def select_episodes(log: Path, model: str) -> tuple[list[reader.Episode], dict[str, int]]:
    """The episodes evaluated, and how many of each kind were left out (and why)."""
    if not log.is_dir():
        raise CandidateRefused(f"the log {log} is not a folder")
    if not (log / model).is_dir():
        raise CandidateRefused(f"the log {log} has no episodes of model {model!r} "
                               f"(models there: {', '.join(reader.models(log)) or 'none'})")
    try:
        found = reader.episodes(log, model)
    except KeyError as exc:  # an episodes form written before the field existed
        raise CandidateRefused(f"the episodes of {model!r} in {log} have no {exc} field (a log of an older "
                               "format): evaluate needs each step's logp and explore flag") from exc
    whole = [e for e in found if e.whole]
    explore_off = [e for e in whole if not all(e.explore)]
    kept = [e for e in whole if all(e.explore)]
    no_logp = [e for e in kept if not np.isfinite(e.action_logp).all()]
    kept = [e for e in kept if np.isfinite(e.action_logp).all()]
    excluded = {
        "unfinished_or_partial_episodes": len(found) - len(whole),
        "explore_off_episodes": len(explore_off),
        "explore_off_steps": sum(len(e.explore) - sum(e.explore) for e in explore_off),
        "steps_of_explore_off_episodes": sum(len(e) for e in explore_off),
        "no_logp_episodes": len(no_logp),
    }
    if not found:
        raise CandidateRefused(f"the log {log} has no episodes of model {model!r}")
    if no_logp and not kept:
        raise CandidateRefused(f"the log of {model!r} has no behaviour logp (action_logp is NaN on every "
                               "step): importance sampling needs the probability of each logged action")
    if not kept:
        raise CandidateRefused(f"no episode of {model!r} can be evaluated: " + ", ".join(
            f"{v} {k.replace('_', ' ')}" for k, v in excluded.items() if v) + " (see docs/experience.md)")
    return kept, excluded


def _resolve(candidate: str | Path, model: str, bundles: Path | None) -> tuple[Path | None, str]:
    """The candidate's bundle path (None: only by name) and its ``name@version``."""
    given = Path(candidate)
    if isinstance(candidate, Path) or given.exists():
        if not given.exists():
            raise CandidateRefused(f"the candidate bundle {given} does not exist")
        return given, _label_of(given)
    label = str(candidate) if "@" in str(candidate) else f"{model}@{candidate}"
    if bundles is not None:
        for path in discover_bundles(Path(bundles)):
            if _label_of(path) == label:
                return path, label
    return None, label


def _label_of(path: Path) -> str:
    try:
        bundle = load_bundle(path)
    except (OSError, ValueError) as exc:
        raise CandidateRefused(f"the candidate {path} is not a bundle: {exc}") from exc
    try:
        return f"{bundle.manifest.name}@{bundle.manifest.version}"
    finally:
        bundle.close()


def _candidate_logps(log: Path, model: str, episodes: list[reader.Episode], path: Path | None, label: str,
                     served: list[np.ndarray]) -> tuple[list[np.ndarray], list[np.ndarray] | None, str]:
    """Per episode the candidate's logp of each logged action, its values (for the doubly
    robust estimator, when the bundle is run and has a value head), and where they came from."""
    needed = [e for e, s in zip(episodes, served, strict=True) if not s.all()]
    shadow = shadow_logps(log, model, label) if needed else {}
    if not needed and path is None:
        return [np.asarray(e.action_logp, np.float64) for e in episodes], None, "served"
    if all(i in shadow for e in needed for i in e.event_ids) and (needed or path is None):
        logp = [np.array([shadow.get(i, np.nan) for i in e.event_ids], np.float64) for e in episodes]
        return logp, None, "shadow"
    if path is None:
        missing = sum(i not in shadow for e in needed for i in e.event_ids)
        raise CandidateRefused(
            f"candidate {label!r}: {missing} evaluated steps have no shadow logp in the log and no bundle of it "
            "was given (pass a bundle path as --candidate, or --bundles with a folder holding it)")
    candidate = Candidate(path)
    try:
        outputs = candidate.run(episodes, want_value=True)
    finally:
        candidate.close()
    return outputs.logp, outputs.values, "bundle" if needed else "served"


def _check_arguments(gamma: float, clip: float | None, bootstrap: int, level: float) -> None:
    if not 0.0 <= gamma <= 1.0:
        raise CandidateRefused(f"--gamma must be in [0, 1], got {gamma}")
    if clip is not None and not clip > 0:
        raise CandidateRefused(f"--clip must be a positive number, got {clip}")
    if bootstrap < 0:
        raise CandidateRefused(f"--bootstrap must be 0 or more resamples, got {bootstrap}")
    if not 0.0 < level < 1.0:
        raise CandidateRefused(f"--level must be in (0, 1), got {level}")
