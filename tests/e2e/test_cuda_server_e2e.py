"""A real `rlserve serve` on CUDA answers as the same server on the CPU does: an MLP (64 and
1,024 rows in one binary body), an LSTM stepping 16 sessions, and a VisionNet policy on
84x84x4 uint8 observations; with ONNX Runtime's CUDA provider and with TorchScript on CUDA.

Both servers take the mode (``explore: false``) and return the model's outputs, which are
held to the export tolerance against the CPU server's; actions must match wherever the
CPU's top two logits are further apart than that tolerance (a near tie may flip).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from cuda_check import needs, onnx_cuda_missing, torch_cuda_missing, within_export_tolerance
from server_process import running_server

from rlserve.models.export.verify import MAX_RTOL, output_scale

# One xdist worker runs them all (scripts/gpu_device_check.sh): the servers are per module.
pytestmark = [pytest.mark.gpu, pytest.mark.e2e, pytest.mark.xdist_group("cuda-server"), needs(onnx_cuda_missing())]

IMAGE = (84, 84, 4)


def _export(repo: Path) -> None:
    import gymnasium.spaces as gs
    import torch

    from rlserve.models.catalog import build_model
    from rlserve.models.export.exporter import export_bundle

    specs = {
        "mlp": (gs.Box(-1.0, 1.0, (16,), np.float32), gs.Discrete(4), {"fcnet_hiddens": [256, 256]}),
        "lstm": (gs.Box(-1.0, 1.0, (16,), np.float32), gs.Discrete(4),
                 {"fcnet_hiddens": [64], "use_lstm": True, "lstm_cell_size": 64, "lstm_use_prev_reward": True}),
        "vision": (gs.Box(0, 255, IMAGE, np.uint8), gs.Discrete(6), {}),  # RLlib's 84x84 conv filters
    }
    torch.set_num_threads(4)
    for name, (obs, act, config) in specs.items():
        torch.manual_seed(0)
        model = build_model(obs, act, config)
        export_bundle(model, obs_space=obs, action_space=act, model_config=config, out_dir=repo / name, name=name,
                      version="1", formats=["onnx", "torchscript"])


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("cuda-repo")
    _export(root)
    return root


@contextlib.contextmanager
def _server(repo: Path, **env: str) -> Iterator[httpx.Client]:
    settings = {f"RLSERVE_{k.upper()}": v for k, v in env.items()}
    with running_server(["--repository", str(repo)], env=settings) as url, httpx.Client(base_url=url,
                                                                                      timeout=60) as client:
        yield client


@pytest.fixture(scope="module")
def cpu(repo) -> Iterator[httpx.Client]:
    with _server(repo, device="cpu", runtime="onnx") as client:
        yield client


@pytest.fixture(scope="module", params=["onnx", "torchscript"])
def cuda(request, repo) -> Iterator[httpx.Client]:
    if request.param == "torchscript" and torch_cuda_missing() is not None:
        pytest.skip(torch_cuda_missing())
    with _server(repo, device="cuda", runtime=request.param) as client:
        yield client


def _binary(client: httpx.Client, model: str, rows: np.ndarray) -> dict:
    headers = {"content-type": "application/octet-stream", "x-rlserve-dtype": rows.dtype.name,
               "x-rlserve-shape": ",".join(map(str, rows.shape)), "x-rlserve-explore": "false",
               "x-rlserve-outputs": "dist_inputs,value"}
    response = client.post(f"/v1/models/{model}/act", content=rows.tobytes(), headers=headers)
    assert response.status_code == 200, response.text
    return response.json()


def _same_answers(gpu: dict, ref: dict, what: str) -> None:
    for name in ("dist_inputs", "value"):
        within_export_tolerance(np.asarray(gpu[name], np.float32), np.asarray(ref[name], np.float32),
                                f"{what}: {name}")
    logits = np.asarray(ref["dist_inputs"], np.float64)
    top2 = np.sort(logits, axis=1)[:, -2:]
    clear = (top2[:, 1] - top2[:, 0]) > 2 * MAX_RTOL * output_scale(logits) + 1e-5
    assert clear.mean() > 0.9, f"{what}: too many near ties to compare actions"
    gpu_actions, ref_actions = np.asarray(gpu["actions"]), np.asarray(ref["actions"])
    assert np.array_equal(gpu_actions[clear], ref_actions[clear]), what


def test_every_model_runs_on_cuda_and_says_so(cuda, cpu):
    for model in ("mlp", "lstm", "vision"):
        runtime = cuda.get(f"/v1/models/{model}").json()["runtime"]
        assert runtime["device"] == "cuda:0" and runtime["device_setting"] == "cuda:0", runtime
        assert runtime["input_staging"] == "pinned", runtime
        if runtime["kind"] == "onnx":
            assert runtime["providers"][0] == "CUDAExecutionProvider", runtime
            assert runtime["inputs_cast_on_device"] is True, runtime
        assert cpu.get(f"/v1/models/{model}").json()["runtime"]["device"] == "cpu"


@pytest.mark.parametrize("rows", [64, 1024])
def test_mlp_binary_rows_answer_as_on_the_cpu(cuda, cpu, rows):
    obs = np.random.default_rng(rows).uniform(-1, 1, (rows, 16)).astype(np.float32)
    _same_answers(_binary(cuda, "mlp", obs), _binary(cpu, "mlp", obs), f"mlp x{rows}")


def test_vision_uint8_images_answer_as_on_the_cpu(cuda, cpu):
    images = np.random.default_rng(7).integers(0, 256, (32, *IMAGE), dtype=np.uint8)
    _same_answers(_binary(cuda, "vision", images), _binary(cpu, "vision", images), "vision x32")


def test_lstm_sessions_step_as_on_the_cpu(cuda, cpu):
    rng = np.random.default_rng(3)
    ids = [f"gpu-episode-{i}" for i in range(16)]
    for step in range(12):
        body = {"observations": rng.uniform(-1, 1, (16, 16)).round(4).tolist(), "session_ids": ids,
                "explore": False, "outputs": ["dist_inputs", "value"]}
        if step == 0:
            body["episode_starts"] = [True] * 16
        else:
            body["rewards"] = rng.uniform(-1, 1, 16).round(3).tolist()
        answers = []
        for client in (cuda, cpu):
            response = client.post("/v1/models/lstm/act", content=json.dumps(body),
                                   headers={"content-type": "application/json"})
            assert response.status_code == 200, response.text
            answers.append(response.json())
        _same_answers(answers[0], answers[1], f"lstm step {step}")
