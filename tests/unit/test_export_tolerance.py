"""Export and load verification admit float32 rounding on any CPU and still refuse real bugs.

The rule (rlserve.models.export.verify): ``|a - e| <= atol + rtol |e| + max_rtol max|e|`` per output.
Three things are shown here:

- two correct float32 evaluations of one dot product (a sequential sum, and the 8-lane sum a
  SIMD kernel does) differ at an element that cancels to ~0.1 among terms of order 100 by far
  more than a tolerance relative to that element allows, and the rule admits it. The data is
  fixed and every operation is an IEEE float32 add or multiply in a fixed order, so this holds
  on every CPU, not only on one without AVX-512;
- a policy whose logits are of order 100 (the e2e fuzz suite's image model) exports;
- the same bundle with one weight off by 1e-3 of its value, a transposed kernel, a missing bias
  or a missing layer is refused by the load-time check.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import gymnasium.spaces as gs
import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import numpy_helper

from rlserve.models.catalog import build_model
from rlserve.models.export.bundle import Bundle, BundleError, load_bundle, verify_reference
from rlserve.models.export.exporter import ATOL, RTOL, export_bundle
from rlserve.models.export.verify import (
    MAX_RTOL,
    RULE,
    UNIT_ROUNDOFF,
    compare_outputs,
    output_scale,
)

# The tolerance every bundle written before the rounding term had (still in their manifests).
OLD_RTOL, OLD_ATOL = 1e-4, 1e-5
DEFAULT_MODELS = Path(__file__).resolve().parents[2] / "service" / "default_models"


# --------------------------------------------------------------------------- the rule itself

def _sequential(terms: np.ndarray) -> np.float32:
    return np.cumsum(terms, dtype=np.float32)[-1]  # one float32 add after another


def _eight_lanes(terms: np.ndarray) -> np.float32:
    lanes = np.cumsum(terms.reshape(-1, 8), axis=0, dtype=np.float32)[-1]
    return np.cumsum(lanes, dtype=np.float32)[-1]


def _cancelling_logits() -> tuple[np.ndarray, np.ndarray]:
    """Logits (2, 4) of order 100 by two summation orders; [:, 3] cancels to about 0.1."""
    rng = np.random.default_rng(7)
    k = 968  # an 11x11x8 convolution's terms, like the fuzz suite's image model
    by_order: list[list[np.float32]] = [[], []]
    for _row in range(2):
        for col in range(4):
            x = rng.uniform(0, 255, k).astype(np.float32)  # image pixels
            w = rng.normal(0, 0.02, k).astype(np.float32)
            if col == 3:  # retune one weight so that the exact sum is about 0.1
                rest = float(np.dot(x[:-1].astype(np.float64), w[:-1].astype(np.float64)))
                w[-1] = np.float32((0.1 - rest) / float(x[-1]))
            terms = x * w  # float32 products, each exactly rounded
            by_order[0].append(_sequential(terms))
            by_order[1].append(_eight_lanes(terms))
    return (np.array(by_order[0], np.float32).reshape(2, 4), np.array(by_order[1], np.float32).reshape(2, 4))


def test_two_correct_summation_orders_pass_the_rule_but_not_an_elementwise_tolerance():
    seq, simd = _cancelling_logits()
    assert output_scale(seq) > 20 and np.abs(seq[:, 3]).max() < 1
    diff = np.abs(seq.astype(np.float64) - simd)
    # The orders disagree at the cancelling elements by more than rtol * |e| + atol allows ...
    with pytest.raises(BundleError, match=r"'dist_inputs' disagrees.*index \(\d, 3\)"):
        compare_outputs({"dist_inputs": simd}, {"dist_inputs": seq}, OLD_RTOL, OLD_ATOL, "old rule", max_rtol=0.0)
    # ... yet by some tens of float32 roundoffs of the output's magnitude (well inside the
    # 512 of MAX_RTOL), which the rule admits.
    assert diff.max() < 0.25 * MAX_RTOL * output_scale(seq)
    compare_outputs({"dist_inputs": simd}, {"dist_inputs": seq}, RTOL, ATOL, "new rule")
    compare_outputs({"dist_inputs": seq}, {"dist_inputs": simd}, RTOL, ATOL, "new rule, swapped")


def test_the_rounding_term_is_float32_roundoff_times_the_output_magnitude():
    e = np.array([[120.0, -3.0, 0.1194]], np.float32)
    allowed = ATOL + MAX_RTOL * 120.0
    assert MAX_RTOL == 512 * UNIT_ROUNDOFF == 2.0**-15
    compare_outputs({"x": e + np.float32(0.9 * allowed)}, {"x": e}, RTOL, ATOL, "within")
    with pytest.raises(BundleError, match=r"'x' disagrees.*max_rtol=3\.05e-05 of max \|expected\| 120"):
        compare_outputs({"x": e + np.float32(1.5 * allowed)}, {"x": e}, RTOL, ATOL, "beyond")


def test_masked_logits_and_a_wrong_answer_do_not_widen_the_tolerance():
    # RLlib's masking puts -3.4e38 (FLOAT_MIN plus the logit) in masked slots: compared, not scaled by.
    e = np.array([[-3.4e38, 1.0, 0.5]], np.float32)
    assert output_scale(e) == 1.0
    compare_outputs({"x": e.copy()}, {"x": e}, RTOL, ATOL, "masked")
    with pytest.raises(BundleError, match="'x' disagrees"):
        compare_outputs({"x": e + np.array([[0, 1e-3, 0]], np.float32)}, {"x": e}, RTOL, ATOL, "masked")
    # The magnitude comes from the reference, never from the answer being judged.
    with pytest.raises(BundleError, match="'x' disagrees.*max \\|expected\\| 1(?!\\d)"):
        compare_outputs({"x": np.array([[-3.4e38, 1e6, 0.5]], np.float32)}, {"x": e}, RTOL, ATOL, "huge")


# --------------------------------------------------------------------------- a real export

# The e2e fuzz suite's image model: uint8 pixels through ReLU convolutions, logits of order 100.
OBS = gs.Box(0, 255, (42, 42, 3), np.uint8)
ACT = gs.Discrete(4)
CONFIG = {"conv_filters": [[4, [4, 4], 2], [8, [4, 4], 2], [8, [11, 11], 1]]}


@pytest.fixture(scope="module")
def large_logits_bundle(tmp_path_factory) -> Bundle:
    torch.manual_seed(0)
    model = build_model(OBS, ACT, CONFIG)
    with torch.no_grad():  # RLlib starts biases at 0 (the ONNX graph then has none): give one a value
        model.base._value_branch._model[0].bias.uniform_(-1.0, 1.0)
    # On a CPU without AVX-512 this export failed under rtol 1e-4 / atol 1e-5 alone (issue 11).
    return export_bundle(model, obs_space=OBS, action_space=ACT, model_config=CONFIG,
                         out_dir=tmp_path_factory.mktemp("tol") / "image", name="image", formats=["onnx"])


def _ort_run(model: onnx.ModelProto) -> Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return lambda feed: dict(zip(names, session.run(None, feed), strict=True))


def test_a_policy_with_logits_of_order_100_is_accepted(large_logits_bundle: Bundle):
    ref = large_logits_bundle.manifest.reference
    assert (ref["rtol"], ref["atol"], ref["max_rtol"], ref["tolerance_rule"]) == (RTOL, ATOL, MAX_RTOL, RULE)
    assert ref["checked_batch_sizes"] == [1, 3, 64]
    _, expected = large_logits_bundle.reference()
    assert output_scale(expected["dist_inputs"]) > 50
    model = onnx.load(str(large_logits_bundle.path("model.onnx")))
    diffs = verify_reference(large_logits_bundle, _ort_run(model))
    assert diffs["dist_inputs"] <= MAX_RTOL * output_scale(expected["dist_inputs"])


def _initializer(model: onnx.ModelProto, suffix: str) -> tuple[int, np.ndarray]:
    hits = [(i, numpy_helper.to_array(t).copy()) for i, t in enumerate(model.graph.initializer)
            if t.name.endswith(suffix)]
    assert len(hits) == 1, f"expected one initializer named *{suffix}, got {[t.name for t in model.graph.initializer]}"
    return hits[0]


def _set(model: onnx.ModelProto, suffix: str, change: Callable[[np.ndarray], np.ndarray]) -> None:
    i, value = _initializer(model, suffix)
    name = model.graph.initializer[i].name
    model.graph.initializer[i].CopyFrom(numpy_helper.from_array(np.ascontiguousarray(change(value)), name))


def _off_by_a_thousandth(w: np.ndarray) -> np.ndarray:
    flat = w.reshape(-1)
    j = int(np.argmax(np.abs(flat)))
    flat[j] *= np.float32(1.001)
    return w


def _drop_first_relu(model: onnx.ModelProto) -> None:
    node = next(n for n in model.graph.node if n.op_type == "Relu")
    for other in model.graph.node:
        other.input[:] = [node.input[0] if x == node.output[0] else x for x in other.input]
    model.graph.node.remove(node)


CORRUPTIONS: dict[str, Callable[[onnx.ModelProto], None]] = {
    "a logits weight off by 1e-3": lambda m: _set(m, "_logits._model.1.weight", _off_by_a_thousandth),
    "a first-layer weight off by 1e-3": lambda m: _set(m, "_convs.0._model.1.weight", _off_by_a_thousandth),
    "the 8x8 kernel transposed": lambda m: _set(m, "_convs.2._model.0.weight", lambda w: w.transpose(1, 0, 2, 3)),
    "the value bias missing": lambda m: _set(m, "_value_branch._model.0.bias", np.zeros_like),
    "a ReLU layer missing": _drop_first_relu,
}


@pytest.mark.parametrize("corruption", list(CORRUPTIONS))
def test_a_corrupted_runtime_is_refused(large_logits_bundle: Bundle, corruption: str):
    model = onnx.load(str(large_logits_bundle.path("model.onnx")))
    CORRUPTIONS[corruption](model)
    with pytest.raises(BundleError, match=r"bundle 'image': output '(dist_inputs|value)' disagrees"):
        verify_reference(large_logits_bundle, _ort_run(model))


@pytest.mark.parametrize("name", sorted(p.name for p in DEFAULT_MODELS.iterdir() if p.is_dir()))
def test_bundles_written_before_the_rounding_term_still_load_and_verify(name: str):
    """The embedded bundles record rtol 1e-4 / atol 1e-5 and no max_rtol: they get today's."""
    bundle = load_bundle(DEFAULT_MODELS / name)
    ref = bundle.manifest.reference
    assert "max_rtol" not in ref and (ref["rtol"], ref["atol"]) == (OLD_RTOL, OLD_ATOL)
    diffs = verify_reference(bundle, _ort_run(onnx.load(str(bundle.runtime_path("onnx")))))
    assert set(diffs) == set(bundle.manifest.output_names)
    # Their recorded tolerance still binds: a reference output moved past it is refused.
    inputs, expected = bundle.reference()
    scale = output_scale(expected["dist_inputs"])
    moved = {k: v.copy() for k, v in expected.items()}
    moved["dist_inputs"][0, 0] += np.float32(2 * (OLD_ATOL + OLD_RTOL * scale + MAX_RTOL * scale))
    with pytest.raises(BundleError, match="'dist_inputs' disagrees"):
        verify_reference(bundle, lambda feed: moved)
