"""The action distribution a traced module is served with, established by comparison (torch).

A module names its distribution classes (``get_inference_action_dist_cls``,
``get_exploration_action_dist_cls``). rlserve serves the distribution in numpy
(``models/distributions``), so what a class computes is established, not assumed:

1. The candidate is rlserve's distribution for the action space, as RLlib's catalog picks it
   (``newstack/dists.py``: Categorical, MultiCategorical, DiagGaussian, their Dict/Tuple
   combination; SquashedGaussian where the class is RLlib's squashed Gaussian).
2. The module's class and the candidate are compared on random dist inputs (wide ones too):
   the deterministic action, the log-probability of it and of sampled actions, the entropy.
   RLlib's own classes agree, and are served with the module's dist inputs as they are.
3. A class that disagrees (a subclass whose constructor transforms its inputs, e.g. a
   temperature) is tried once more with its constructor in the graph: the graph then
   outputs the parameters the class holds (a categorical's logits, a Gaussian's mean and
   log std), and the comparison is repeated on those. If it agrees, that is how it is served
   (the answer's ``dist_inputs`` are then those parameters); otherwise the export is refused
   naming the class.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from gymnasium import spaces as gs

from rlserve.models.distributions import ActionDistSpec
from rlserve.models.newstack.dists import module_action_dist
from rlserve.models.traced.loader import TraceError

__all__ = ["ServedDist", "served_distribution"]

_RLLIB_DISTS = "ray.rllib.core.distribution"
_TOL = 1e-5
Fold = Callable[[torch.Tensor], torch.Tensor]


@dataclass
class ServedDist:
    spec: ActionDistSpec
    label: str  # the module's class, dotted
    fold: Fold | None  # the class's constructor as a graph step (None: dist inputs as they are)

    @property
    def folded(self) -> bool:
        return self.fold is not None


def _label(cls: Any) -> str:
    return f"{getattr(cls, '__module__', '?')}.{getattr(cls, '__qualname__', type(cls).__name__)}"


def _rllib_base(cls: Any) -> str:
    """The first of RLlib's own distribution classes in ``cls``' ancestry ('' if none)."""
    for base in getattr(cls, "__mro__", ()):
        if base.__module__.startswith(_RLLIB_DISTS) and base.__name__.startswith("Torch"):
            return base.__name__
    return ""


def _candidate(cls: Any, action_space: gs.Space) -> ActionDistSpec:
    if _rllib_base(cls) == "TorchSquashedGaussian":
        return module_action_dist("sac", action_space, {})
    return module_action_dist("ppo", action_space, {})


def _torch(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _torch(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_torch(v) for v in value)
    return torch.as_tensor(np.asarray(value))


def _flat(value: Any) -> np.ndarray:
    if isinstance(value, dict):
        return np.concatenate([_flat(value[k]) for k in sorted(value)], axis=-1)
    if isinstance(value, list | tuple):
        return np.concatenate([_flat(v) for v in value], axis=-1)
    arr = value.detach().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)
    return arr.reshape(len(arr), -1).astype(np.float64)


def _disagreement(cls: Any, spec: ActionDistSpec, inputs: np.ndarray, fold: Fold | None) -> str:
    """'' when the class and the spec compute the same numbers on ``inputs``; else what differs."""
    with torch.no_grad():
        raw = torch.from_numpy(inputs.copy())
        theirs = cls.from_logits(raw.clone())
        params = fold(raw.clone()).numpy() if fold is not None else inputs
    ours = spec.build(params.astype(np.float32))
    mode = ours.deterministic_sample()
    checks = {"the deterministic action": (theirs.to_deterministic().sample(), mode)}
    samples = [mode, *(ours.sample(np.random.default_rng(seed)) for seed in range(3))]
    for i, action in enumerate(samples):
        checks[f"logp of action set {i}"] = (theirs.logp(_torch(action)), ours.logp(action))
    try:
        checks["the entropy"] = (theirs.entropy(), ours.entropy())
    except NotImplementedError:
        pass
    for what, (a, b) in checks.items():
        a, b = _flat(a), _flat(b)
        if a.shape != b.shape or not np.allclose(a, b, rtol=_TOL, atol=_TOL):
            return what
    return ""


def _fold_of(cls: Any) -> Fold | None:
    """The class's constructor as a graph step giving rlserve's parameters, where it has one."""
    base = _rllib_base(cls)
    if base == "TorchCategorical":
        def categorical(x: torch.Tensor) -> torch.Tensor:
            dist = cls.from_logits(x)
            return dist.logits if dist.logits is not None else torch.log(dist.probs)
        return categorical
    if base == "TorchDiagGaussian":
        def gaussian(x: torch.Tensor) -> torch.Tensor:
            inner = cls.from_logits(x)._dist
            return torch.cat([inner.loc, torch.log(inner.scale)], dim=-1)
        return gaussian
    return None


def _probe_inputs(width: int) -> list[np.ndarray]:
    rng = np.random.default_rng(20261129)
    return [rng.standard_normal((32, width)).astype(np.float32) * scale for scale in (0.5, 3.0)]


def served_distribution(member: Any, action_space: gs.Space) -> ServedDist:
    """How ``member``'s action distribution is served (``TraceError`` if it cannot be, exactly)."""
    try:
        inference = member.get_inference_action_dist_cls()
        exploration = member.get_exploration_action_dist_cls()
    except Exception as exc:  # RLlib raises ValueError/NotImplementedError where it has none
        raise TraceError(f"the module names no action distribution ({type(exc).__name__}: {exc})") from None
    label = _label(inference)
    if inference is not exploration and _label(exploration) != label:
        raise TraceError(f"the module explores with {_label(exploration)} and acts with {label}; a bundle serves "
                         "one distribution for both")
    try:
        spec = _candidate(inference, action_space)
    except ValueError as exc:
        raise TraceError(f"{label}: no rlserve distribution for the action space ({exc})") from None
    probes = _probe_inputs(spec.num_outputs)
    differs = next((d for x in probes if (d := _disagree_safely(inference, spec, x, None))), "")
    if not differs:
        return ServedDist(spec, label, None)
    fold = _fold_of(inference)
    if fold is not None and not any(_disagree_safely(inference, spec, x, fold) for x in probes):
        return ServedDist(spec, label, fold)
    raise TraceError(f"the action distribution class {label} computes other numbers than rlserve's {spec.name} "
                     f"({differs} differs on random inputs, also with its constructor in the graph); rlserve "
                     "cannot serve it exactly")


def _disagree_safely(cls: Any, spec: ActionDistSpec, inputs: np.ndarray, fold: Fold | None) -> str:
    try:
        return _disagreement(cls, spec, inputs, fold)
    except Exception as exc:  # the user's class failed on our inputs: it is not what we serve
        return f"calling it ({type(exc).__name__}: {str(exc).strip()[:120]})"
