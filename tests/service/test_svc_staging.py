"""The GPU path's host side, on the CPU: staging blocks reused across batches, and ONNX
Runtime's I/O binding (the CUDA runner) giving exactly what ``session.run`` gives.

ONNX Runtime's CPU provider accepts CPU memory bound through an ``IOBinding`` as the CUDA
provider does, so ``BoundRunner`` runs here unchanged; only the pinning of the blocks
needs CUDA (``cuda_host_allocator``, exercised by tests/e2e/test_cuda_server_e2e.py)."""

from __future__ import annotations

import logging

import numpy as np
import onnxruntime as ort
import pytest

from rlserve.service.engine.runtime.onnx_binding import BoundRunner, plain_runner
from rlserve.service.engine.runtime.staging import MIN_BLOCK, HostStaging, cuda_host_allocator, pinned_staging


class CountingAllocator:
    def __init__(self):
        self.sizes: list[int] = []

    def __call__(self, nbytes: int) -> np.ndarray:
        self.sizes.append(nbytes)
        return np.full(nbytes, 0xAB, dtype=np.uint8)  # not zeroed: a stale byte would show


def test_a_block_is_reused_by_every_batch_that_fits_and_grows_to_a_power_of_two():
    allocate = CountingAllocator()
    staging = HostStaging(allocate, kind="test")
    rows = np.arange(40 * 16, dtype=np.float32).reshape(40, 16)
    first = staging.stage("obs", rows)
    assert np.array_equal(first, rows) and first.flags.c_contiguous and first.dtype == np.float32
    for n in (1, 7, 40, 3):
        assert np.array_equal(staging.stage("obs", rows[:n]), rows[:n])
    assert allocate.sizes == [MIN_BLOCK]  # 40 x 16 x 4 bytes fit in one page
    big = np.ones((300, 16), np.float32)  # 19,200 bytes: the next power of two is 32 KiB
    assert np.array_equal(staging.stage("obs", big), big)
    assert allocate.sizes == [MIN_BLOCK, 32768] and staging.allocations == 2
    staging.stage("state_in_0", np.zeros((3, 8), np.float32))
    assert staging.allocations == 3 and staging.nbytes() == 32768 + MIN_BLOCK


def test_staged_views_share_the_block_and_cast_to_the_wanted_dtype():
    staging = HostStaging(CountingAllocator())
    a = staging.stage("obs", np.array([[1.5, 2.5]], dtype=np.float64), np.dtype(np.float32))
    assert a.dtype == np.float32 and a.tolist() == [[1.5, 2.5]]
    b = staging.stage("obs", np.array([[7.0, 8.0]], dtype=np.float32))
    assert np.shares_memory(a, b) and a.tolist() == [[7.0, 8.0]]  # the same block, reused
    with pytest.raises(TypeError):  # no silent float -> int truncation
        staging.stage("obs", np.array([[1.5]]), np.dtype(np.int32))


def test_pinned_staging_falls_back_to_pageable_memory_and_says_why(caplog):
    allocate, why = cuda_host_allocator()
    caplog.set_level(logging.WARNING, "rlserve.runtime")
    staging = pinned_staging()
    if allocate is None:  # no CUDA runtime library, or one without a driver (a CPU machine)
        assert ("libcudart" in why or "cudaHostAlloc" in why) and staging.kind == "pageable"
        assert any("pageable memory" in r.getMessage() and why in r.getMessage() for r in caplog.records)
    else:
        assert why == "" and staging.kind == "pinned"
        block = allocate(MIN_BLOCK * 3)
        block[:] = 7
        assert block.nbytes == MIN_BLOCK * 3 and int(block.sum()) == 7 * MIN_BLOCK * 3


def _session(path):
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _feed(session, batch: int, rng) -> dict[str, np.ndarray]:
    return {i.name: rng.standard_normal((batch, *i.shape[1:])).astype(np.float32) for i in session.get_inputs()}


@pytest.mark.parametrize("name", ["mlp", "lstm"])
def test_bound_runs_answer_exactly_what_session_run_answers(bundle_store, name):
    session = _session(bundle_store / name / "model.onnx")
    outputs = [o.name for o in session.get_outputs()]
    dtypes = {i.name: np.dtype(np.float32) for i in session.get_inputs()}
    allocate = CountingAllocator()
    bound = BoundRunner(session, outputs, dtypes, HostStaging(allocate), ort.RunOptions())
    plain = plain_runner(session, outputs, ort.RunOptions())
    rng = np.random.default_rng(0)
    kept = []
    for batch in (5, 3, 5, 1):
        feed = _feed(session, batch, rng)
        got, expected = bound(feed), plain(feed)
        for g, e in zip(got, expected, strict=True):
            np.testing.assert_array_equal(g, e)
        kept.append((got, expected))
    assert len(allocate.sizes) == len(dtypes)  # one block per input, reused by every batch
    # Answers are the caller's: later batches (which reuse the blocks) do not change them.
    for got, expected in kept:
        for g, e in zip(got, expected, strict=True):
            np.testing.assert_array_equal(g, e)
    feed = _feed(session, 600, rng)  # larger than the first blocks: those inputs grow once
    for g, e in zip(bound(feed), plain(feed), strict=True):
        np.testing.assert_array_equal(g, e)
    grown = [name for name, array in feed.items() if array.nbytes > MIN_BLOCK]
    assert grown and len(allocate.sizes) == len(dtypes) + len(grown)


def test_bound_runs_read_inputs_that_numpy_does_not_own(bundle_store):
    """A binary request's rows are a read-only view of its body: staging copies them."""
    session = _session(bundle_store / "mlp" / "model.onnx")
    outputs = [o.name for o in session.get_outputs()]
    bound = BoundRunner(session, outputs, {"obs": np.dtype(np.float32)}, HostStaging(), ort.RunOptions())
    rows = np.random.default_rng(1).standard_normal((4, 4)).astype(np.float32)
    body = np.frombuffer(rows.tobytes(), dtype=np.float32).reshape(4, 4)
    assert not body.flags.writeable
    for g, e in zip(bound({"obs": body}), session.run(outputs, {"obs": rows}), strict=True):
        np.testing.assert_array_equal(g, e)
