"""The traffic split's rules without a server: the draw, the weights' checks, promotion,
rollback, unloading a weighted version, the guard, and the live results it reads."""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, field

import pytest

from rlserve.service.engine.live_results import LiveResults, VersionResults
from rlserve.service.errors import BadRequest, ModelNotFound, NoTraffic, VersionConflict
from rlserve.service.serving.traffic import Guard, Traffic, check_guard, check_weights, unit


@dataclass
class _Entry:
    name: str = "m"
    current: str = "2"
    versions: OrderedDict = field(default_factory=lambda: OrderedDict((("1", 1), ("2", 2))))


def test_no_split_draws_nothing_and_the_draw_follows_the_weights():
    traffic = Traffic(_Entry())
    assert traffic.draw("a") is None and traffic.effective() == {"1": 0.0, "2": 100.0}
    traffic.set_weights({"1": 90, "2": 10}, "test")
    drawn = [traffic.draw(f"session-{i}") for i in range(20_000)]
    share = drawn.count("2") / len(drawn)
    assert 0.09 < share < 0.11
    assert [traffic.draw(f"session-{i}") for i in range(100)] == drawn[:100]  # deterministic per id
    assert unit("m", "x") != unit("other", "x")  # members of a set draw apart


def test_changing_the_weights_keeps_ids_that_stay_below_the_boundary():
    traffic = Traffic(_Entry())
    traffic.set_weights({"1": 50, "2": 50}, "test")
    ids = [f"s{i}" for i in range(1000)]
    first = {i: traffic.draw(i) for i in ids}
    traffic.set_weights({"1": 100, "2": 0}, "test")
    assert {traffic.draw(i) for i in ids} == {"1"}
    assert "2" in first.values()


@pytest.mark.parametrize("raw,field", [({}, "weights"), ([1], "weights"), ({"1": 0, "2": 0}, "weights"),
                                       ({"1": -1}, "weights.1"), ({"1": math.inf}, "weights.1"),
                                       ({"1": True}, "weights.1"), ({"3": 1}, "weights.3"),
                                       ({"1": "5"}, "weights.1"), ({"1": 2e12}, "weights.1")])
def test_bad_weights_name_the_field(raw, field):
    with pytest.raises((BadRequest, ModelNotFound, NoTraffic)) as caught:
        check_weights(raw, _Entry().versions, "m")
    assert caught.value.field == field and caught.value.received is not None or raw == {}


@pytest.mark.parametrize("raw,field", [({"margin": -1, "min_episodes": 1}, "margin"),
                                       ({"margin": math.nan, "min_episodes": 1}, "margin"),
                                       ({"margin": 1, "min_episodes": 0}, "min_episodes"),
                                       ({"margin": 1, "min_episodes": 2.5}, "min_episodes"),
                                       ({"margin": 1e13, "min_episodes": 1}, "margin"),
                                       ({"margin": 1}, "min_episodes"), ("x", "body")])
def test_bad_guards_name_the_field(raw, field):
    with pytest.raises(BadRequest) as caught:
        check_guard(raw)
    assert caught.value.field == field


def test_an_integral_float_is_a_count():
    assert check_guard({"margin": 0, "min_episodes": 30.0}) == Guard(0.0, 30)


def test_promote_rollback_and_unload():
    entry = _Entry()
    traffic = Traffic(entry)
    traffic.set_weights({"1": 90, "2": 10}, "canary")
    traffic.promote("1", "done")
    assert entry.current == "1" and traffic.weights is None and traffic.draw("x") is None
    traffic.rollback("oops")
    assert entry.current == "2" and traffic.weights == {"1": 90.0, "2": 10.0}
    traffic.rollback("again")
    assert traffic.weights is None
    with pytest.raises(VersionConflict):
        traffic.rollback("nothing left")
    with pytest.raises(ModelNotFound):
        traffic.promote("9", "no such version")
    traffic.set_weights({"1": 90, "2": 10}, "canary")
    del entry.versions["2"]
    traffic.unloaded("2")
    assert traffic.weights == {"1": 90.0} and {traffic.draw(f"k{i}") for i in range(50)} == {"1"}
    assert [c["action"] for c in traffic.changes] == ["weights", "promote", "rollback", "rollback", "weights",
                                                      "unload"]


def test_the_guard_fires_only_past_the_margin_with_enough_episodes():
    traffic = Traffic(_Entry())
    traffic.set_weights({"1": 90, "2": 10}, "canary")
    traffic.set_guard(Guard(margin=5, min_episodes=3), "test")
    results = {"1": VersionResults(), "2": VersionResults()}
    for _ in range(3):
        results["1"].episode(100.0, 100)
    for _ in range(2):
        results["2"].episode(10.0, 10)
    traffic.check_guard(results.__getitem__)
    assert traffic.weights == {"1": 90.0, "2": 10.0}  # version 2 has 2 episodes only
    results["2"].episode(96.0, 96)  # mean 38.7: below 100 - 5
    traffic.check_guard(results.__getitem__)
    assert traffic.weights == {"1": 90.0, "2": 0.0}
    assert traffic.changes[-1]["action"] == "guard"


def test_live_results_mean_and_spread():
    live = LiveResults()
    for value, length in ((1.0, 1), (2.0, 2), (6.0, 3)):
        live.episode("m", "1", value, length)
    live.episode("m", "1", math.inf, 4)  # not a result
    got = live.summary("m", ["1", "2"])
    assert got["1"]["episodes"] == 3 and got["1"]["return_mean"] == pytest.approx(3.0)
    assert got["1"]["return_std"] == pytest.approx(math.sqrt(((1 - 3) ** 2 + (2 - 3) ** 2 + (6 - 3) ** 2) / 3))
    assert got["1"]["episode_length_mean"] == 2.0
    assert got["2"]["episodes"] == 0 and got["2"]["return_mean"] is None
