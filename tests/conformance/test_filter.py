"""MeanStdFilter against RLlib's recorded run (every case of kind ``filter``).

The case pushes ``stream`` one row at a time (update=True), then applies the filter frozen
to a batch; a second, fresh filter is applied frozen after a single push (std = 0).
"""

from __future__ import annotations

import numpy as np
import pytest
from oracle import (
    NO_CASES_PREFIX,
    OracleCase,
    assert_close,
    cases_of_kind,
    load_case,
    oracle_dirs_text,
)

from conformance.keys_checked import mark_fields, mark_io
from rlserve.models.filters import MeanStdFilter


def _filter_case_names() -> list[str]:
    return cases_of_kind("filter")


@pytest.fixture(params=_filter_case_names())
def case(request) -> OracleCase:
    if request.param.startswith(NO_CASES_PREFIX):
        pytest.fail(f"no oracle filter cases (looked in {oracle_dirs_text()})")
    return load_case(request.param)


def _fresh(case: OracleCase) -> MeanStdFilter:
    spec = case.meta["filter"]
    assert spec["class"] == "MeanStdFilter"
    return MeanStdFilter(spec["shape"], demean=spec["demean"], destd=spec["destd"], clip=spec["clip"])


def test_stream_of_single_pushes(case: OracleCase) -> None:
    filt = _fresh(case)
    io = case.io
    for t, x in enumerate(io["stream"]):
        out = filt(x, update=True)
        assert out.dtype == io["stream_filtered"].dtype
        assert_close(out, io["stream_filtered"][t], f"stream_filtered[{t}]")
        assert_close(filt.mean, io["running_mean"][t], f"running_mean[{t}]", rtol=1e-12, atol=1e-12)
        assert filt.std.dtype == np.float32
        assert_close(filt.std, io["running_std"][t], f"running_std[{t}]")
        assert filt.num_pushes == io["running_n"][t]
    mark_io(case, "stream", "stream_filtered", "running_mean", "running_std", "running_n")
    mark_fields(case, "filter")


def test_final_statistics_and_frozen_batch(case: OracleCase) -> None:
    filt = _fresh(case)
    io = case.io
    for x in io["stream"]:
        filt(x, update=True)
    assert filt.num_pushes == int(io["final/num_pushes"])
    assert_close(filt.mean_array, io["final/mean_array"], "final/mean_array", rtol=1e-12, atol=1e-12)
    assert_close(
        filt.sum_sq_diff_array, io["final/sum_sq_diff_array"], "final/sum_sq_diff_array", rtol=1e-12, atol=1e-9
    )
    assert filt.var.dtype == io["final/var"].dtype
    assert_close(filt.var, io["final/var"], "final/var")
    assert_close(filt.std, io["final/std"], "final/std")
    frozen = filt(io["frozen_in"], update=False)
    assert frozen.dtype == io["frozen_out"].dtype
    assert_close(frozen, io["frozen_out"], "frozen_out")
    assert filt.num_pushes == int(io["final/num_pushes"])  # update=False leaves the stats alone
    mark_io(case, "frozen_in", "frozen_out", *case.keys_under("final"))


def test_one_push_has_zero_std(case: OracleCase) -> None:
    filt = _fresh(case)
    filt(case.io["stream"][0], update=True)
    np.testing.assert_array_equal(filt.std, 0.0)
    assert_close(filt(case.io["frozen_in"], update=False), case.io["one_push/out_frozen"], "one_push/out_frozen")
    mark_io(case, "one_push/out_frozen")
