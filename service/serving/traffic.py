"""A model's traffic split between its loaded versions: weights, the draw, promotion, rollback, the guard.

``Traffic`` (one per model name, on its ``ModelEntry``) holds the weights, or None: no
split, every new episode goes to the model's current version, as before. The draw:

- a new session (or a multi-agent episode's member) draws from its id: the first 8 bytes
  of BLAKE2b of ``model NUL id`` as a number in [0, 1), placed on the cumulative weights
  in version load order. Deterministic, so replicas with the same weights put the same id
  on the same version with no coordination, and a retried creation lands where the first
  try did. The draw happens once, when the session starts; the session's record names its
  version from then on, so no later change of weights moves it;
- a stateless request draws per request from Python's ``random`` (no id to hash);
- a request that names a version is not drawn.

Every change (weights, promote, rollback, the guard firing, a weighted version unloaded)
is logged (``rlserve.traffic``) and kept (``changes``, the last ``MAX_CHANGES``) with its
time and reason; each keeps the state before it so ``rollback`` can restore it.
"""

from __future__ import annotations

import bisect
import hashlib
import logging
import math
import random
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from rlserve.service.engine.live_results import VersionResults
from rlserve.service.errors import BadRequest, ModelNotFound, NoTraffic, VersionConflict, quoted

log = logging.getLogger("rlserve.traffic")

MAX_CHANGES = 100  # changes listed in the summary
MAX_UNDO = 100  # states ``rollback`` can go back through
_SCALE = float(1 << 64)
MAX_WEIGHT = 1e12  # the largest weight, and the largest guard margin


class Versions(Protocol):
    """What traffic needs of a model entry: its name, loaded versions and current version."""

    current: str

    @property
    def name(self) -> str: ...

    @property
    def versions(self) -> Mapping[str, Any]: ...


@dataclass(frozen=True)
class Guard:
    """Roll a canary back when its mean return falls below the baseline's by more than
    ``margin`` (an absolute return), once both have ``min_episodes`` finished episodes."""

    margin: float
    min_episodes: int

    def as_json(self) -> dict[str, Any]:
        return {"margin": self.margin, "min_episodes": self.min_episodes}


def unit(model: str, key: str) -> float:
    """``key``'s deterministic draw in [0, 1) for ``model``."""
    digest = hashlib.blake2b(f"{model}\0{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / _SCALE


def check_weights(raw: object, loaded: Mapping[str, Any], model: str, field: str = "weights") -> dict[str, float]:
    """``raw`` as weights over ``loaded`` versions; a ``BadRequest``/``ModelNotFound`` naming
    the field, what was expected and what was received."""
    if not isinstance(raw, dict) or not raw:
        raise BadRequest(f"{field}: expected an object of version -> weight", field=field,
                         expected="an object such as {\"1\": 90, \"2\": 10}", received=raw)
    weights: dict[str, float] = {}
    for version, weight in raw.items():
        name = f"{field}.{version}" if len(str(version)) <= 64 else field
        if version not in loaded:
            raise ModelNotFound(f"{name}: model {model!r} has no version {quoted(version)}; loaded: {list(loaded)}",
                                field=name, expected=list(loaded), received=version)
        if isinstance(weight, bool) or not isinstance(weight, int | float) or not 0 <= weight <= MAX_WEIGHT:
            raise BadRequest(f"{name}: a weight is a number in 0..{MAX_WEIGHT:g}; got {quoted(weight)}", field=name,
                             expected=f"a number in 0..{MAX_WEIGHT:g}", received=weight)
        weights[version] = float(weight)
    total = sum(weights.values())
    if not total > 0 or not math.isfinite(total):
        raise NoTraffic(f"{field}: the weights must sum to a positive finite number; they sum to {total}",
                         field=field, expected="weights summing to a positive number", received=raw)
    return weights


def check_guard(raw: object, field: str = "") -> Guard:
    """``raw`` as a guard; ``BadRequest`` naming the field (under ``field.`` when given)."""
    prefix = f"{field}." if field else ""
    if not isinstance(raw, dict):
        raise BadRequest(f"{field or 'guard'}: expected an object {{\"margin\": ..., \"min_episodes\": ...}}",
                         field=field or "body", expected="{\"margin\": number >= 0, \"min_episodes\": integer >= 1}",
                         received=raw)
    for key in ("margin", "min_episodes"):
        if key not in raw:
            raise BadRequest(f"{prefix}{key} is required", field=prefix + key, expected=f"the field {key!r}",
                             received=None)
    margin, episodes = raw["margin"], raw["min_episodes"]
    if isinstance(margin, bool) or not isinstance(margin, int | float) or not 0 <= margin <= MAX_WEIGHT:
        raise BadRequest(f"{prefix}margin: a return difference in 0..{MAX_WEIGHT:g}; got {quoted(margin)}",
                         field=prefix + "margin", expected=f"a number in 0..{MAX_WEIGHT:g}", received=margin)
    if isinstance(episodes, float) and episodes.is_integer():  # JSON's 30.0 is the integer 30
        episodes = int(episodes)
    if isinstance(episodes, bool) or not isinstance(episodes, int) or not 1 <= episodes <= 1_000_000_000:
        raise BadRequest(f"{prefix}min_episodes: an integer in 1..1000000000; got {quoted(episodes)}",
                         field=prefix + "min_episodes", expected="an integer in 1..1000000000", received=episodes)
    return Guard(float(margin), int(episodes))


class Traffic:
    """One model name's split of new episodes between its versions."""

    def __init__(self, entry: Versions):
        self.entry = entry
        self.weights: dict[str, float] | None = None  # None: every new episode to the current version
        self.guard: Guard | None = None
        self.changes: deque[dict[str, Any]] = deque(maxlen=MAX_CHANGES)
        self._undo: deque[tuple[dict[str, float] | None, str]] = deque(maxlen=MAX_UNDO)
        self._versions: list[str] = []
        self._bounds: list[float] = []

    # ------------------------------------------------------------------ the draw

    def draw(self, key: str | None) -> str | None:
        """The version a new episode with id ``key`` (None: a stateless request) goes to;
        None where there is no split (the current version)."""
        if self.weights is None:
            return None
        point = random.random() if key is None else unit(self.entry.name, key)
        return self._versions[min(bisect.bisect_right(self._bounds, point), len(self._versions) - 1)]

    def effective(self) -> dict[str, float]:
        """The weights as they act now (percent per loaded version)."""
        if self.weights is None:
            return {v: (100.0 if v == self.entry.current else 0.0) for v in self.entry.versions}
        total = sum(self.weights.values())
        return {v: 100.0 * self.weights.get(v, 0.0) / total for v in self.entry.versions}

    # ------------------------------------------------------------------ changes

    def set_weights(self, weights: dict[str, float], reason: str) -> None:
        self._remember()
        self._apply(weights)
        self._note("weights", reason)

    def promote(self, version: str, reason: str) -> None:
        if version not in self.entry.versions:
            raise ModelNotFound(f"model {self.entry.name!r} has no version {quoted(version)}; "
                                f"loaded: {list(self.entry.versions)}",
                                field="version", expected=list(self.entry.versions), received=version)
        self._remember()
        self.entry.current = version
        self._apply(None)
        self._note("promote", reason)

    def rollback(self, reason: str) -> None:
        while self._undo:
            weights, current = self._undo.pop()
            if current in self.entry.versions and (weights is None or any(v in self.entry.versions for v in weights)):
                self.entry.current = current
                self._apply(None if weights is None else {v: w for v, w in weights.items() if v in self.entry.versions})
                self._note("rollback", reason)
                return
        raise VersionConflict(f"model {self.entry.name!r}: no earlier traffic state to roll back to", field="model",
                              received=self.entry.name)

    def set_guard(self, guard: Guard | None, reason: str) -> None:
        self.guard = guard
        self._note("guard", reason)

    def unloaded(self, version: str) -> None:
        """``version`` unloads: its weight goes, the others renormalise (none left with
        weight: the split ends, the current version takes every new episode)."""
        if self.weights is None or version not in self.weights:
            return
        had = self.weights[version]
        rest = {v: w for v, w in self.weights.items() if v != version}
        self._apply(rest if sum(rest.values()) > 0 else None)
        if had > 0:
            self._note("unload", f"version {version!r} unloaded; the others renormalised")

    def check_guard(self, results: Callable[[str], VersionResults]) -> None:
        """After an episode finished: roll back every canary the guard finds worse than the
        baseline (the version with the largest weight)."""
        guard, weights = self.guard, self.weights
        if guard is None or weights is None:
            return
        baseline = max(weights, key=lambda v: weights[v])
        base = results(baseline)
        if base.episodes < guard.min_episodes:
            return
        for version, weight in weights.items():
            if version == baseline or weight <= 0:
                continue
            canary = results(version)
            if canary.episodes >= guard.min_episodes and canary.return_mean < base.return_mean - guard.margin:
                self._remember()
                self._apply({**weights, version: 0.0})
                self._note("guard", f"guard: version {version!r} mean return {canary.return_mean:.4g} over "
                                    f"{canary.episodes} episodes is below version {baseline!r}'s "
                                    f"{base.return_mean:.4g} over {base.episodes} by more than {guard.margin:g}")
                return

    # ------------------------------------------------------------------ internals

    def _remember(self) -> None:
        self._undo.append((None if self.weights is None else dict(self.weights), self.entry.current))

    def _apply(self, weights: dict[str, float] | None) -> None:
        self.weights = weights
        if weights is None:
            self._versions, self._bounds = [], []
            return
        total = sum(weights.values())
        versions = [v for v in self.entry.versions if weights.get(v, 0.0) > 0]
        bounds, running = [], 0.0
        for version in versions:
            running += weights[version] / total
            bounds.append(running)
        self._versions, self._bounds = versions, bounds

    def _note(self, action: str, reason: str) -> None:
        weights = {v: round(w, 6) for v, w in self.effective().items()}
        change = {"at": time.time(), "action": action, "reason": reason, "weights": weights,
                  "current": self.entry.current, "guard": None if self.guard is None else self.guard.as_json()}
        self.changes.append(change)
        log.info("traffic %s: %s: weights %s (current %s): %s", self.entry.name, action, weights,
                 self.entry.current, reason)

    def as_json(self) -> dict[str, Any]:
        return {"model": self.entry.name, "weights": self.effective(), "split": self.weights is not None,
                "current": self.entry.current, "guard": None if self.guard is None else self.guard.as_json()}
