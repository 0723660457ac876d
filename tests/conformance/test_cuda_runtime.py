"""The server's runtimes on CUDA reproduce RLlib's recorded numbers within the export
tolerance, for every oracle case that test_export.py replays on the CPU.

Each case is exported as in test_export.py, opened with the server's own runtime classes
on ``cuda`` (ONNX Runtime's CUDA provider through I/O binding, TorchScript on CUDA) and
replayed the same way (recurrent cases step by step, state carried through the graph's
outputs), every output held to ``|a - e| <= atol + max_rtol * max|e|`` against RLlib, as
a bundle is held at load. The load-time check itself (``verify_reference``, full and
pruned policy graph) runs on CUDA too.

Measured, not asserted: each output's difference in float32 roundoffs of its largest
value, for the GPU and the CPU runtime against RLlib and for the GPU against the CPU on the
same inputs. They go to the JUnit report (``--junitxml``) as properties; scripts/
gpu_device_check.sh prints their table for docs/export.md.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from cuda_check import needs, onnx_cuda_missing, roundoffs, torch_cuda_missing, within_export_tolerance
from oracle import OracleCase, load_case

from conformance.test_export import _cases_with_weights, _check_feedforward, _check_recurrent, _export_case
from rlserve.models.export.bundle import Bundle, verify_reference
from rlserve.service.engine.runtime import Runtime, open_runtime

pytestmark = pytest.mark.gpu

MISSING = {"onnx": onnx_cuda_missing, "torchscript": torch_cuda_missing}
Run = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory):
    cache: dict[str, Bundle] = {}

    def get(case: OracleCase) -> Bundle:
        if case.name not in cache:
            cache[case.name] = _export_case(case, tmp_path_factory.mktemp(case.name))
        return cache[case.name]

    return get


def _open(bundle: Bundle, kind: str, device: str) -> Runtime:
    manifest = bundle.manifest
    return open_runtime(kind, bundle.runtime_path(kind), input_names=manifest.input_names,
                        output_names=manifest.output_names, intra_op_threads=1, device=device,
                        policy_path=bundle.policy_path(kind))


def _replay(case: OracleCase, bundle: Bundle, run: Run, kind: str, check) -> None:
    if bundle.manifest.signature.is_recurrent:
        _check_recurrent(case, bundle, run, kind, check)
    else:
        _check_feedforward(case, run, kind, check)


def _worst(into: dict[str, float], key: str) -> Callable[[np.ndarray, np.ndarray, str], None]:
    def record(actual: np.ndarray, expected: np.ndarray, what: str) -> None:
        into[key] = max(into.get(key, 0.0), roundoffs(actual, expected))

    return record


def _paired(gpu: Runtime, cpu: Runtime, worst: dict[str, float]) -> Run:
    """The GPU's answer, with the CPU runtime run on the same inputs for comparison."""

    def run(feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        out, ref = gpu.run(feed), cpu.run(feed)
        for name, value in out.items():
            _worst(worst, "gpu_vs_cpu")(value, ref[name], name)
        return out

    return run


@pytest.mark.parametrize("kind", ["onnx", "torchscript"])
@pytest.mark.parametrize("case_name", _cases_with_weights())
def test_cuda_runtime_reproduces_rllib_within_the_export_tolerance(case_name: str, kind: str, exported,
                                                                   record_property) -> None:
    missing = MISSING[kind]()
    if missing is not None:
        pytest.skip(missing)
    case = load_case(case_name)
    bundle = exported(case)
    gpu, cpu = _open(bundle, kind, "cuda"), _open(bundle, kind, "cpu")
    assert gpu.device == "cuda:0" and cpu.device == "cpu", (gpu.describe(), cpu.describe())
    worst: dict[str, float] = {}

    def check(actual: np.ndarray, expected: np.ndarray, what: str) -> None:
        _worst(worst, "gpu_vs_rllib")(actual, expected, what)
        within_export_tolerance(actual, expected, what)

    _replay(case, bundle, _paired(gpu, cpu, worst), kind, check)
    _replay(case, bundle, cpu.run, kind, _worst(worst, "cpu_vs_rllib"))
    # What the server checks before it serves the bundle, here on CUDA.
    verify_reference(bundle, gpu.run)
    verify_reference(bundle, gpu.run_policy, outputs=bundle.manifest.signature.policy_output_names)
    for key, value in sorted(worst.items()):
        record_property(f"roundoffs_{key}", round(value, 2))
    record_property("device", gpu.describe())


@needs(onnx_cuda_missing())
def test_the_cuda_provider_stages_inputs_in_pinned_memory(exported) -> None:
    """The ONNX runtime on CUDA binds its inputs from pinned host blocks that later,
    smaller batches reuse."""
    name = next(n for n in _cases_with_weights() if not n.startswith("<"))
    bundle = exported(load_case(name))
    runtime = _open(bundle, "onnx", "cuda")
    described = runtime.describe()
    assert described["device"] == "cuda:0" and described["providers"][0] == "CUDAExecutionProvider", described
    assert described["input_staging"] == "pinned", described
    staging = runtime.staging  # type: ignore[attr-defined]
    rng = np.random.default_rng(0)
    shapes = _input_shapes(runtime)
    for batch in (64, 8, 64, 1):
        runtime.run({name: rng.standard_normal((batch, *shape)).astype(np.float32) for name, shape in shapes.items()})
    assert staging.allocations == len(shapes)


@needs(onnx_cuda_missing())
def test_the_cuda_provider_casts_integer_inputs_on_the_device(exported) -> None:
    """uint8 rows reach the ONNX runtime on CUDA narrow (as the batch step leaves uint8
    frames), are staged as uint8 and cast by the device; the answers equal the same run fed
    the float32 values, and the staging block holds the uint8 rows."""
    name = next(n for n in _cases_with_weights() if not n.startswith("<"))
    bundle = exported(load_case(name))
    runtime = _open(bundle, "onnx", "cuda")
    assert runtime.describe()["inputs_cast_on_device"] is True, runtime.describe()
    shapes = _input_shapes(runtime)
    rng = np.random.default_rng(1)
    cast = runtime._device_cast  # type: ignore[attr-defined]
    for batch in (64, 3, 64):
        narrow = {n: rng.integers(0, 256, (batch, *shape), dtype=np.uint8) for n, shape in shapes.items()}
        wide = runtime.run({n: v.astype(np.float32) for n, v in narrow.items()})
        got = runtime.run(narrow)
        for out, value in got.items():
            np.testing.assert_allclose(value, wide[out], rtol=1e-6, atol=1e-6, err_msg=out)
        for n, rows in narrow.items():
            assert np.array_equal(runtime.staging.view(n, rows.shape, np.uint8), rows), n  # type: ignore[attr-defined]
    assert cast.calls == 3 * len(shapes)


def _input_shapes(runtime: Runtime) -> dict[str, tuple[int, ...]]:
    session = runtime._session  # type: ignore[attr-defined]
    return {i.name: tuple(int(d) for d in i.shape[1:]) for i in session.get_inputs()}
