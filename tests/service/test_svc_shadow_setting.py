"""RLSERVE_SHADOW: the shapes a start refuses, the one it takes, and a shadow that cannot
start listed with the failures (an app built in process, no server)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from rlserve.service.app import create_app
from rlserve.service.settings import Settings


@pytest.mark.parametrize("value", [
    {"lstm": {"queue_rows": 4}},  # no candidate
    {"lstm": {"candidate": ""}},
    {"lstm": {"candidate": "lstm@2", "queue_rows": 0}},
    {"lstm": {"candidate": "lstm@2", "version": 1}},
    {"lstm": {"candidate": "lstm@2", "rows": 5}},  # an unknown key
])
def test_a_shadow_setting_of_the_wrong_shape_is_refused_naming_the_model(value):
    with pytest.raises(ValidationError, match="'lstm'"):
        Settings(shadow=value)


def test_a_shadow_setting_is_taken_as_given():
    value = {"lstm": {"candidate": "lstm@2", "version": "1", "queue_rows": 16}}
    assert Settings(shadow=value).shadow == value


def test_a_shadow_that_cannot_start_is_listed_with_the_failures_and_the_others_run():
    app = create_app(Settings(shadow={"cartpole": {"candidate": "nope"},
                                      "cartpole-memory": {"candidate": "cartpole"}}))
    registry = app.state.registry
    assert registry.failures["RLSERVE_SHADOW[cartpole]"].startswith("no model named 'nope'")
    assert "observation space" in registry.failures["RLSERVE_SHADOW[cartpole-memory]"]
    assert registry.shadows.shadows == {}
    app_with_one = create_app(Settings(shadow={"cartpole": {"candidate": "cartpole@1", "queue_rows": 8}}))
    shadow = app_with_one.state.registry.shadows.get("cartpole")
    try:
        assert (shadow.live, shadow.candidate, shadow.queue.capacity) == ("cartpole@1", "cartpole@1", 8)
    finally:
        app_with_one.state.registry.shadows.close()
