"""RLSERVE_DEVICE: parsing, the providers chosen for each machine (fake provider lists
and device counts, so every branch runs without a GPU), the fallback and its log line,
the refusal when CUDA was required, and the batcher defaults on a GPU."""

from __future__ import annotations

import logging

import onnxruntime
import pytest
from pydantic import ValidationError

from rlserve.service.device_request import DeviceRequest
from rlserve.service.engine.batch_limits import GPU_DEFAULTS, batch_limits
from rlserve.service.engine.runtime.device import (
    CPU_EP,
    CUDA_EP,
    TENSORRT_EP,
    DeviceUnavailable,
    Placement,
    onnx_placement,
    settle,
    torch_placement,
)
from rlserve.service.engine.runtime.onnx import OnnxRuntime
from rlserve.service.errors import BundleInvalid
from rlserve.service.serving.loading import load_policy
from rlserve.service.settings import Settings

GPU_BUILD = [TENSORRT_EP, CUDA_EP, CPU_EP]
CPU_BUILD = [CPU_EP]


@pytest.mark.parametrize("text, kind, index", [("auto", "auto", 0), ("cpu", "cpu", 0), ("cuda", "cuda", 0),
                                               ("cuda:3", "cuda", 3), (" CUDA:1 ", "cuda", 1)])
def test_device_setting_parses(text, kind, index):
    request = DeviceRequest.parse(text)
    assert (request.kind, request.index) == (kind, index)
    assert request.required == (kind == "cuda")


@pytest.mark.parametrize("text", ["gpu", "cuda:", "cpu:0", "auto:1", "cuda:-1", "", "cuda:x"])
def test_bad_device_settings_name_the_choices(text):
    with pytest.raises(ValueError, match="expected auto, cpu, cuda or cuda:N"):
        DeviceRequest.parse(text)


def test_the_setting_is_read_from_the_environment_and_refused_when_wrong(monkeypatch):
    monkeypatch.setenv("RLSERVE_DEVICE", "cuda")
    monkeypatch.setenv("RLSERVE_ONNX_TENSORRT", "true")
    settings = Settings()
    assert settings.device == "cuda:0" and settings.onnx_tensorrt is True
    monkeypatch.setenv("RLSERVE_DEVICE", "gpu")
    with pytest.raises(ValidationError, match="expected auto, cpu, cuda or cuda:N"):
        Settings()
    monkeypatch.delenv("RLSERVE_DEVICE")
    assert Settings().device == "auto"


def test_cpu_never_asks_for_cuda():
    placement = onnx_placement(DeviceRequest.parse("cpu"), GPU_BUILD, 8)
    assert placement == Placement("cpu", [CPU_EP], ("device cpu (RLSERVE_DEVICE=cpu)",))


def test_auto_falls_back_to_the_cpu_and_says_why():
    cpu_build = onnx_placement(DeviceRequest.parse("auto"), CPU_BUILD, 1)
    assert cpu_build.device == "cpu" and cpu_build.providers == [CPU_EP] and cpu_build.notes == ()
    assert "no CUDAExecutionProvider" in cpu_build.advice and "onnxruntime-gpu" in cpu_build.advice
    no_device = onnx_placement(DeviceRequest.parse("auto"), GPU_BUILD, 0, "no NVIDIA driver (libcuda.so.1 ...)")
    assert no_device.device == "cpu" and "no NVIDIA driver" in no_device.notes[0]


@pytest.mark.parametrize("available, devices, why, expected", [
    (CPU_BUILD, 1, "", "no CUDAExecutionProvider"),
    (GPU_BUILD, 0, "no NVIDIA driver", "no NVIDIA driver"),
    (GPU_BUILD, 1, "", "there is no CUDA device 1"),
])
def test_required_cuda_is_refused_not_replaced(available, devices, why, expected):
    with pytest.raises(DeviceUnavailable, match=expected) as caught:
        onnx_placement(DeviceRequest.parse("cuda:1" if devices else "cuda"), available, devices, why)
    assert "RLSERVE_DEVICE=cuda" in str(caught.value) and "RLSERVE_DEVICE=auto" in str(caught.value)


def test_cuda_provider_options_keep_float32_exact():
    placement = onnx_placement(DeviceRequest.parse("cuda:1"), GPU_BUILD, 2)
    assert placement.device == "cuda:1" and placement.cuda
    (name, options), cpu = placement.providers
    assert (name, cpu) == (CUDA_EP, CPU_EP)
    assert options["device_id"] == "1" and options["use_tf32"] == "0"
    assert options["cudnn_conv_algo_search"] == "HEURISTIC"


def test_tensorrt_only_when_asked_for_and_compiled_in():
    request = DeviceRequest.parse("auto")
    assert [p[0] for p in onnx_placement(request, GPU_BUILD, 1).providers[:1]] == [CUDA_EP]
    with_trt = onnx_placement(request, GPU_BUILD, 1, tensorrt=True)
    assert [p if isinstance(p, str) else p[0] for p in with_trt.providers] == [TENSORRT_EP, CUDA_EP, CPU_EP]
    without = onnx_placement(request, [CUDA_EP, CPU_EP], 1, tensorrt=True)
    assert [p if isinstance(p, str) else p[0] for p in without.providers] == [CUDA_EP, CPU_EP]
    assert "no TensorrtExecutionProvider" in without.notes[0]


def test_a_provider_that_did_not_start_is_noticed():
    placement = onnx_placement(DeviceRequest.parse("auto"), GPU_BUILD, 1)
    assert settle(DeviceRequest.parse("auto"), placement, [CUDA_EP, CPU_EP]) is placement
    fallen = settle(DeviceRequest.parse("auto"), placement, [CPU_EP])
    assert fallen.device == "cpu" and "could not start its CUDAExecutionProvider" in fallen.notes[0]
    with pytest.raises(DeviceUnavailable, match="could not start"):
        settle(DeviceRequest.parse("cuda"), placement, [CPU_EP])


def test_torch_device_choice():
    assert torch_placement(DeviceRequest.parse("auto"), True, 2).device == "cuda:0"
    assert torch_placement(DeviceRequest.parse("cuda:1"), True, 2).device == "cuda:1"
    cpu_wheel = torch_placement(DeviceRequest.parse("auto"), False, 0)
    assert cpu_wheel.device == "cpu" and "+cpu wheel" in cpu_wheel.notes[0]
    with pytest.raises(DeviceUnavailable, match="torch.cuda sees no CUDA device"):
        torch_placement(DeviceRequest.parse("cuda"), True, 0)


def test_gpu_batch_defaults_apply_only_to_settings_left_unset(monkeypatch):
    cpu = batch_limits(Settings(), "cpu")
    assert (cpu.max_rows, cpu.max_delay_s, cpu.queue_limit, cpu.inline_rows) == (1024, 0.0, 4096, 1024)
    gpu = batch_limits(Settings(), "cuda:0")
    assert gpu.max_rows == GPU_DEFAULTS["max_batch_size"] and gpu.inline_rows == GPU_DEFAULTS["inline_batch_rows"]
    assert gpu.max_delay_s == pytest.approx(GPU_DEFAULTS["max_batch_delay_ms"] / 1000)
    monkeypatch.setenv("RLSERVE_MAX_BATCH_SIZE", "64")
    given = batch_limits(Settings(max_batch_delay_ms=0.0), "cuda:0")
    assert (given.max_rows, given.max_delay_s, given.queue_limit) == (64, 0.0, GPU_DEFAULTS["queue_limit"])


class _ProvidersThatFail:
    """onnxruntime.InferenceSession as it behaves when its CUDA provider cannot load its
    libraries: the session is created on the CPU provider alone."""

    def __init__(self, real):
        self.real = real

    def __call__(self, path, sess_options=None, providers=None):
        names = [p if isinstance(p, str) else p[0] for p in providers or [CPU_EP]]
        return self.real(path, sess_options=sess_options, providers=[n for n in names if n == CPU_EP])


@pytest.fixture
def cuda_that_fails(monkeypatch):
    """A build and machine that look CUDA-capable, with a provider that does not start."""
    monkeypatch.setattr(onnxruntime, "get_available_providers", lambda: [CUDA_EP, CPU_EP])
    monkeypatch.setattr("rlserve.service.engine.runtime.onnx.cuda_device_count", lambda: (1, ""))
    monkeypatch.setattr("rlserve.service.engine.runtime.onnx.preload_cuda_libraries", lambda ort: None)
    monkeypatch.setattr(onnxruntime, "InferenceSession", _ProvidersThatFail(onnxruntime.InferenceSession))


def test_auto_logs_the_fallback_when_the_cuda_provider_does_not_start(bundle_store, cuda_that_fails, caplog):
    caplog.set_level(logging.INFO, "rlserve.runtime")
    runtime = OnnxRuntime(bundle_store / "mlp" / "model.onnx", device="auto")
    assert runtime.describe()["device"] == "cpu" and runtime.describe()["device_setting"] == "auto"
    assert runtime.staging is None  # the CPU provider reads inputs in place
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("onnx runtime model.onnx"))
    assert "on cpu" in line and "could not start its CUDAExecutionProvider" in line


def test_required_cuda_refuses_the_bundle_with_the_reason(make_repo, cuda_that_fails):
    with pytest.raises(BundleInvalid, match="RLSERVE_DEVICE=cuda:0 but onnxruntime could not start"):
        load_policy(make_repo("mlp") / "mlp", Settings(device="cuda", runtime="onnx"))


@pytest.mark.parametrize("gpu_here", [False, True])
def test_a_cpu_build_serves_auto_on_the_cpu_and_says_how_to_use_a_gpu_once(bundle_store, monkeypatch, caplog,
                                                                             gpu_here):
    """Every start of every model logged the 300-character advice at INFO: now once, at DEBUG,
    unless this machine has a GPU the install cannot use (INFO then)."""
    monkeypatch.setattr(onnxruntime, "get_available_providers", lambda: [CPU_EP])
    monkeypatch.setattr("rlserve.service.engine.runtime.onnx.cuda_device_count",
                        lambda: (1, "") if gpu_here else (0, "no NVIDIA driver"))
    monkeypatch.setattr("rlserve.service.engine.runtime.onnx._ADVISED", set())
    caplog.set_level(logging.DEBUG, "rlserve.runtime")
    for _ in range(3):  # three models
        runtime = OnnxRuntime(bundle_store / "mlp" / "model.onnx", device="auto")
        assert runtime.device == "cpu" and runtime.providers == [CPU_EP]
    advice = [r for r in caplog.records if "onnxruntime-gpu" in r.getMessage()]
    assert len(advice) == 1 and advice[0].levelno == (logging.INFO if gpu_here else logging.DEBUG), advice
    assert "no CUDA: this onnxruntime build has no CUDAExecutionProvider" in advice[0].getMessage()
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("onnx runtime model.onnx")]
    assert lines == ["onnx runtime model.onnx on cpu (providers ['CPUExecutionProvider'])"] * 3
    with pytest.raises(DeviceUnavailable, match="has no CUDAExecutionProvider"):
        OnnxRuntime(bundle_store / "mlp" / "model.onnx", device="cuda")


@pytest.mark.asyncio
async def test_model_metadata_shows_the_device(make_client):
    _, client = make_client(("mlp",), device="cpu")
    runtime = (await client.get("/v1/models/mlp")).json()["runtime"]
    assert runtime["device"] == "cpu" and runtime["device_setting"] == "cpu"
    assert runtime["providers"] == [CPU_EP]
