"""The pieces of a traced module's graph that need no RLlib: the observation a module reads
rebuilt from the server's flat row, the state nest, and how a distribution class is judged.

- ``ObsLayout.unflatten`` inverts ``FlattenObservations``' flattening (what the server does to
  a Dict/Tuple observation) for every leaf kind, on random samples of nested spaces;
- ``StateLayout`` keeps ``get_initial_state()``'s nest (dict keys sorted, lists in order),
  takes one-number leaves as the session's fill and keeps others as an offset;
- ``served_distribution`` serves a class that computes what rlserve's distribution computes
  and refuses one that does not, naming it (RLlib's own classes: tests/e2e, with ray).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gymnasium import spaces as gs

from rlserve.models.connectors.flatten import flatten_batch
from rlserve.models.traced import TraceError
from rlserve.models.traced.dists import served_distribution
from rlserve.models.traced.layout import ObsLayout, StateLayout

SPACES = {
    "dict": gs.Dict({"z": gs.Box(-1, 1, (2, 3), np.float32), "a": gs.Discrete(4), "m": gs.MultiDiscrete([2, 3])}),
    "nested": gs.Dict({"pos": gs.Box(-5, 5, (2,), np.float32),
                       "parts": gs.Tuple((gs.Discrete(3), gs.MultiBinary(4), gs.Box(0, 1, (1,), np.float32)))}),
    "mask": gs.Dict({"observations": gs.Box(-1, 1, (5,), np.float32), "action_mask": gs.Box(0, 1, (7,), np.float32)}),
}


def _same(rebuilt, sample, where: str) -> None:
    if isinstance(sample, dict):
        assert list(rebuilt) == list(sample), where  # the space's own key order, as RLlib hands it
        for key in sample:
            _same(rebuilt[key], sample[key], f"{where}.{key}")
    elif isinstance(sample, tuple):
        assert isinstance(rebuilt, tuple) and len(rebuilt) == len(sample), where
        for i, (r, s) in enumerate(zip(rebuilt, sample, strict=True)):
            _same(r, s, f"{where}[{i}]")
    else:
        np.testing.assert_allclose(rebuilt.numpy(), np.stack(sample), rtol=0, atol=0, err_msg=where)


@pytest.mark.parametrize("name", sorted(SPACES))
def test_unflatten_inverts_the_servers_flattening(name: str) -> None:
    space = SPACES[name]
    space.seed(7)
    samples = [space.sample() for _ in range(5)]
    layout = ObsLayout(space)
    row = torch.from_numpy(flatten_batch(space, samples))
    assert row.shape == (5, layout.width)
    rebuilt = layout.unflatten(row)
    batched = _batched(space, samples)
    _same(rebuilt, batched, name)


def _batched(space, samples):
    if isinstance(space, gs.Dict):
        return {k: _batched(space.spaces[k], [s[k] for s in samples]) for k in space.spaces}
    if isinstance(space, gs.Tuple):
        return tuple(_batched(sub, [s[i] for s in samples]) for i, sub in enumerate(space.spaces))
    return [np.asarray(s) for s in samples]


def test_a_row_of_another_width_is_refused() -> None:
    with pytest.raises(ValueError, match="flattens to"):
        ObsLayout(SPACES["dict"]).unflatten(torch.zeros(2, 99))


def test_the_state_nest_round_trips_and_says_what_starts_where() -> None:
    initial = {"lstm": {"h": np.zeros(4, np.float32), "c": np.zeros(4, np.float32)},
               "count": np.full(2, 3.0, np.float32), "ramp": [np.linspace(0, 1, 3, dtype=np.float32)]}
    layout = StateLayout.of(initial)
    assert [layout.name(i) for i in range(len(layout))] == ["count", "lstm/c", "lstm/h", "ramp/0"]
    assert layout.shapes == [(2,), (4,), (4,), (3,)]
    assert layout.fills == [3.0, 0.0, 0.0, None]
    offsets = layout.offsets()
    assert offsets[:3] == [None, None, None] and torch.equal(offsets[3], torch.linspace(0, 1, 3))
    tensors = [torch.full((2, *s), float(i)) for i, s in enumerate(layout.shapes)]
    nest = layout.nest(tensors)
    assert set(nest) == {"lstm", "count", "ramp"} and torch.equal(nest["lstm"]["h"], tensors[2])
    assert all(torch.equal(a, b) for a, b in zip(layout.flatten(nest), tensors, strict=True))
    with pytest.raises(ValueError, match="get_initial_state"):
        layout.flatten({"lstm": nest["lstm"], "count": nest["count"]})
    assert len(StateLayout.of(None)) == 0


class _Categorical:
    """A distribution class with RLlib's interface computing a categorical (not RLlib's own)."""

    def __init__(self, logits: torch.Tensor, scale: float = 1.0, squash_logp: bool = False):
        self._dist = torch.distributions.Categorical(logits=logits * scale)
        self._squash = squash_logp

    @classmethod
    def from_logits(cls, logits: torch.Tensor) -> _Categorical:
        return cls(logits)

    def logp(self, value: torch.Tensor) -> torch.Tensor:
        logp = self._dist.log_prob(value)
        return logp ** 2 if self._squash else logp

    def entropy(self) -> torch.Tensor:
        return self._dist.entropy()

    def to_deterministic(self):
        mode = torch.argmax(self._dist.logits, dim=-1)
        return type("Mode", (), {"sample": lambda _self: mode})()


class _SquashedLogp(_Categorical):
    @classmethod
    def from_logits(cls, logits: torch.Tensor) -> _Categorical:
        return cls(logits, squash_logp=True)


class _Member:
    def __init__(self, dist):
        self.dist = dist

    def get_inference_action_dist_cls(self):
        return self.dist

    def get_exploration_action_dist_cls(self):
        return self.dist


def test_a_class_that_computes_rlservess_numbers_is_served_as_it_is() -> None:
    served = served_distribution(_Member(_Categorical), gs.Discrete(5))
    assert served.spec.name == "TorchCategorical" and served.spec.num_outputs == 5 and not served.folded


def test_a_class_that_computes_other_numbers_is_refused_naming_it() -> None:
    with pytest.raises(TraceError, match=r"test_traced_layout\._SquashedLogp computes other numbers"):
        served_distribution(_Member(_SquashedLogp), gs.Discrete(5))


def test_exploring_with_another_class_than_acting_is_refused() -> None:
    member = _Member(_Categorical)
    member.get_exploration_action_dist_cls = lambda: _SquashedLogp  # type: ignore[method-assign]
    with pytest.raises(TraceError, match="explores with"):
        served_distribution(member, gs.Discrete(5))
