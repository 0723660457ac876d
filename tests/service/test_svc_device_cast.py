"""The device cast (``device_cast.py``) on the CPU: the hand-written ``Cast`` graph is a
valid ONNX model that casts as numpy does, and ``BoundRunner`` with a ``DeviceCast`` stages
integer inputs narrow and answers exactly what the host cast answers.

ONNX Runtime's CPU provider binds outputs to "cpu" as the CUDA provider binds them to
"cuda", so the same code runs here with the device named "cpu"; on CUDA,
tests/conformance/test_cuda_runtime.py and tests/e2e/test_cuda_server_e2e.py run it."""

from __future__ import annotations

import logging

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from rlserve.service.engine.runtime.device_cast import DeviceCast, cast_model, casts_on_device
from rlserve.service.engine.runtime.onnx_binding import BoundRunner, plain_runner
from rlserve.service.engine.runtime.staging import HostStaging

CPU = ["CPUExecutionProvider"]
SOURCES = [np.uint8, np.int8, np.uint16, np.int16, np.int32, np.int64, np.bool_]


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("target", [np.float32, np.float64, np.float16])
def test_the_cast_graph_is_valid_onnx_and_casts_as_numpy_does(source, target):
    rng = np.random.default_rng(0)
    info = np.iinfo(source) if np.dtype(source).kind in "iu" else None
    for shape in [(5,), (3, 84, 84, 4), (0, 2), (2, 3, 4, 5, 6), (7, 1)]:
        model = onnx.load_from_string(cast_model(np.dtype(source), np.dtype(target), len(shape)))
        onnx.checker.check_model(model, full_check=True)
        assert [n.op_type for n in model.graph.node] == ["Cast"]
        x = (rng.integers(info.min, info.max, shape, dtype=source, endpoint=True) if info is not None
             else rng.integers(0, 2, shape).astype(np.bool_))
        session = ort.InferenceSession(model.SerializeToString(), providers=CPU)
        (y,) = session.run(None, {"x": x})
        assert y.dtype == np.dtype(target) and y.shape == shape
        with np.errstate(over="ignore"):  # int32/int64 beyond float16's range: inf on both sides
            np.testing.assert_array_equal(y, x.astype(target))


def test_only_integers_to_floats_are_cast_on_the_device():
    assert casts_on_device(np.uint8, np.float32) and casts_on_device(np.bool_, np.float32)
    assert not casts_on_device(np.float64, np.float32)  # a float narrowing stays on the host
    assert not casts_on_device(np.float32, np.float32)
    assert not casts_on_device(np.uint8, np.int64)
    assert not casts_on_device(np.dtype("U3"), np.float32)


def _runners(bundle_store, name: str, cast: DeviceCast | None):
    session = ort.InferenceSession(str(bundle_store / name / "model.onnx"), providers=CPU)
    outputs = [o.name for o in session.get_outputs()]
    dtypes = {i.name: np.dtype(np.float32) for i in session.get_inputs()}
    staging = HostStaging()
    bound = BoundRunner(session, outputs, dtypes, staging, ort.RunOptions(), cast)
    return session, bound, plain_runner(session, outputs, ort.RunOptions()), staging


class _Failing:
    SessionOptions = ort.SessionOptions

    @staticmethod
    def InferenceSession(*args, **kwargs):  # noqa: N802 (ONNX Runtime's name)
        raise RuntimeError("CUDA failure 35: CUDA driver version is insufficient for CUDA runtime version")


@pytest.mark.parametrize("name", ["mlp", "lstm"])
def test_integer_inputs_are_staged_narrow_and_answer_as_the_host_cast_does(bundle_store, name):
    cast = DeviceCast(ort, CPU, "cpu", 0)
    session, bound, plain, staging = _runners(bundle_store, name, cast)
    rng = np.random.default_rng(5)
    for batch in (6, 2, 6, 40):
        feed = {i.name: rng.integers(0, 256, (batch, *i.shape[1:]), dtype=np.uint8) for i in session.get_inputs()}
        obs = next(iter(feed))
        # Float inputs beside the integer one (an LSTM's state) keep the host path.
        feed = {k: (v if k == obs else v.astype(np.float32) / 255) for k, v in feed.items()}
        wanted = plain({k: v.astype(np.float32) for k, v in feed.items()})
        got = bound(feed)
        for g, e in zip(got, wanted, strict=True):
            np.testing.assert_array_equal(g, e)
        assert staging.view(obs, feed[obs].shape, np.uint8).tolist() == feed[obs].tolist()  # narrow in its block
    assert cast.calls == 4  # one cast per batch: the integer input only


def test_a_device_cast_that_cannot_load_leaves_the_cast_to_the_host(bundle_store, caplog):
    """A session the provider cannot make (on a GPU: a CUDA library that fails to load; here
    an ``InferenceSession`` that raises as ONNX Runtime's would) is logged once, and that
    input is cast by the staging copy as before."""
    caplog.set_level(logging.WARNING, "rlserve.runtime")
    cast = DeviceCast(_Failing(), CPU, "cpu", 0)
    session, bound, plain, staging = _runners(bundle_store, "mlp", cast)
    x = np.arange(12, dtype=np.uint8).reshape(3, 4)
    for _ in range(2):
        for g, e in zip(bound({"obs": x}), plain({"obs": x.astype(np.float32)}), strict=True):
            np.testing.assert_array_equal(g, e)
    assert cast.calls == 0 and staging.view("obs", x.shape, np.float32).tolist() == x.astype(np.float32).tolist()
    warnings = [r.getMessage() for r in caplog.records if "cast on the host" in r.getMessage()]
    assert len(warnings) == 1 and "uint8 -> float32" in warnings[0], warnings


def test_a_device_cast_that_onnx_runtime_moved_to_another_provider_is_not_used(bundle_store, caplog):
    """ONNX Runtime makes a session on the next provider by itself when the first is not in
    its build (on the CPU wheel: CUDA's): that cast would not leave its output on the
    device, so the input is cast on the host."""
    caplog.set_level(logging.WARNING, "rlserve.runtime")
    absent = next(p for p in ort.get_all_providers() if p not in ort.get_available_providers())
    cast = DeviceCast(ort, [(absent, {"device_id": "0"}), "CPUExecutionProvider"], "cuda", 0)
    session, bound, plain, staging = _runners(bundle_store, "mlp", cast)
    x = np.arange(8, dtype=np.uint8).reshape(2, 4)
    for g, e in zip(bound({"obs": x}), plain({"obs": x.astype(np.float32)}), strict=True):
        np.testing.assert_array_equal(g, e)
    assert cast.calls == 0
    assert any(f"not {absent}" in r.getMessage() for r in caplog.records), absent
