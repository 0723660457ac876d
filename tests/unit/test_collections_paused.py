"""The exporter runs with a higher first-generation collector threshold, and puts back
whatever was set before, also when exports overlap in threads or one fails."""

from __future__ import annotations

import gc
import threading

import pytest

from rlserve.models.export import collections_paused, exporter
from rlserve.models.export.collections_paused import FIRST_GENERATION_THRESHOLD, fewer_collections


@pytest.fixture(autouse=True)
def _known_threshold():
    before = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    yield
    gc.set_threshold(*before)


def test_raised_inside_and_put_back_after_even_on_an_error() -> None:
    with fewer_collections():
        assert gc.get_threshold() == (FIRST_GENERATION_THRESHOLD, 10, 10)
    assert gc.get_threshold() == (700, 10, 10)
    with pytest.raises(RuntimeError), fewer_collections():
        raise RuntimeError("the export failed")
    assert gc.get_threshold() == (700, 10, 10)


def test_a_higher_threshold_someone_set_is_kept() -> None:
    gc.set_threshold(50_000, 5, 5)
    with fewer_collections():
        assert gc.get_threshold() == (50_000, 5, 5)
    assert gc.get_threshold() == (50_000, 5, 5)


def test_overlapping_exports_in_threads_put_back_the_first_setting() -> None:
    inside, leave = threading.Barrier(3), threading.Event()
    seen: list[tuple[int, ...]] = []

    def export() -> None:
        with fewer_collections():
            inside.wait()
            leave.wait()
            seen.append(gc.get_threshold())

    threads = [threading.Thread(target=export) for _ in range(2)]
    for t in threads:
        t.start()
    inside.wait()  # both inside at once
    assert collections_paused._inside == 2
    leave.set()
    for t in threads:
        t.join()
    assert seen == [(FIRST_GENERATION_THRESHOLD, 10, 10)] * 2
    assert gc.get_threshold() == (700, 10, 10) and collections_paused._inside == 0


def test_export_bundle_builds_inside_it(monkeypatch, tmp_path) -> None:
    """Fails when export_bundle stops using it: the build sees the raised threshold."""
    from rlserve.models.catalog import build_model
    from rlserve.models.spaces import space_from_json

    seen: list[tuple[int, ...]] = []
    real_build = exporter._build

    def build(*args, **kwargs):
        seen.append(gc.get_threshold())
        return real_build(*args, **kwargs)

    monkeypatch.setattr(exporter, "_build", build)
    obs = space_from_json({"type": "Box", "low": -1.0, "high": 1.0, "shape": [3], "dtype": "float32"})
    act = space_from_json({"type": "Discrete", "n": 2})
    config = {"fcnet_hiddens": [8]}
    exporter.export_bundle(build_model(obs, act, config), obs_space=obs, action_space=act, model_config=config,
                           out_dir=tmp_path / "b", formats=["onnx"])
    assert seen == [(FIRST_GENERATION_THRESHOLD, 10, 10)]
    assert gc.get_threshold() == (700, 10, 10)
