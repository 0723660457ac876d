"""What bench_server.py measures: the bundles it serves (an MLP 256x256 and the same MLP
inside an LSTM(256), ONNX, built with the catalog) and, per scenario, the pre-encoded HTTP
requests each load-generator connection sends (``SCENARIOS``: key, label, request maker,
server settings). Imported by bench_server.py, which re-exports these names.
"""

from __future__ import annotations

import json
from pathlib import Path

# --------------------------------------------------------------------------- bundles

CONFIGS = {
    "mlp": {"fcnet_hiddens": [256, 256]},
    "lstm": {"fcnet_hiddens": [256, 256], "use_lstm": True, "lstm_cell_size": 256},
}


def bench_models() -> dict:
    """The two catalog models (torch), by name, each built from seed 0: what
    ``build_bundles`` exports and bench_peers.py serves the weights of from other servers."""
    import torch

    from rlserve.models.catalog import build_model

    obs, act = _spaces()
    models = {}
    for name, cfg in CONFIGS.items():
        torch.manual_seed(0)
        models[name] = build_model(obs, act, cfg)
    return models


def _spaces() -> tuple:
    import gymnasium.spaces as gs
    import numpy as np

    return gs.Box(-1.0, 1.0, (16,), np.float32), gs.Discrete(4)


def build_bundles(repo: Path) -> dict:
    """Export the two bundles into ``repo``; returns the models exported (``bench_models``)."""
    import torch

    from rlserve.models.export.exporter import export_bundle

    torch.set_num_threads(1)
    obs, act = _spaces()
    models = bench_models()
    for name, model in models.items():
        export_bundle(model, obs_space=obs, action_space=act, model_config=CONFIGS[name], out_dir=repo / name,
                      name=name, version="1", formats=["onnx"])
    return models


# --------------------------------------------------------------------------- requests

def _request(path: str, body: bytes, headers: str = "Content-Type: application/json\r\n") -> bytes:
    head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{headers}Content-Length: {len(body)}\r\n\r\n"
    return head.encode() + body


# --------------------------------------------------------------------------- scenarios

def obs_row(rng, dim: int = 16) -> list[float]:
    return [round(float(x), 4) for x in rng.uniform(-1, 1, dim)]


def mlp_single(c: int, rng) -> list[list[bytes]]:
    return [[_request("/v1/models/mlp/act", json.dumps({"observation": obs_row(rng)}).encode()) for _ in range(8)]
            for _ in range(c)]


def mlp_batch64(c: int, rng) -> list[list[bytes]]:
    return [[_request("/v1/models/mlp/act", json.dumps({"observations": [obs_row(rng) for _ in range(64)]}).encode())
             for _ in range(4)] for _ in range(c)]


def infer_binary64(c: int, rng) -> list[list[bytes]]:
    """The batch64 observations as one FP32 tensor over the binary extension, outputs
    (action, logp) asked for as binary: what tritonclient sends for
    ``InferInput.set_data_from_numpy(obs)`` with ``InferRequestedOutput(name)``."""
    import numpy as np

    def one() -> bytes:
        obs = np.array([obs_row(rng) for _ in range(64)], dtype=np.float32)
        raw = obs.tobytes()
        header = json.dumps({
            "inputs": [{"name": "obs", "shape": list(obs.shape), "datatype": "FP32",
                        "parameters": {"binary_data_size": len(raw)}}],
            "outputs": [{"name": "action", "parameters": {"binary_data": True}},
                        {"name": "logp", "parameters": {"binary_data": True}}],
        }).encode()
        headers = f"Content-Type: application/octet-stream\r\nInference-Header-Content-Length: {len(header)}\r\n"
        return _request("/v2/models/mlp/infer", header + raw, headers)

    return [[one() for _ in range(4)] for _ in range(c)]


def act_binary64(c: int, rng) -> list[list[bytes]]:
    """The batch64 observations as one raw application/octet-stream act body (float32,
    C order) with X-Rlserve-Dtype/-Shape headers; answered with the JSON batch form."""
    import numpy as np

    def one() -> bytes:
        raw = np.array([obs_row(rng) for _ in range(64)], dtype=np.float32).tobytes()
        headers = "Content-Type: application/octet-stream\r\nX-Rlserve-Dtype: float32\r\nX-Rlserve-Shape: 64,16\r\n"
        return _request("/v1/models/mlp/act", raw, headers)

    return [[one() for _ in range(4)] for _ in range(c)]


def lstm_sessions(c: int, rng) -> list[list[bytes]]:
    # Each connection drives one session; the first step starts its episode (and creates
    # it), the others continue it with a reward.
    out = []
    for k in range(c):
        sid = f"bench-{k}-{rng.integers(1 << 30)}"
        first = _request("/v1/models/lstm/act", json.dumps(
            {"observation": obs_row(rng), "session_id": sid, "episode_start": True}).encode())
        steps = [_request("/v1/models/lstm/act", json.dumps(
            {"observation": obs_row(rng), "session_id": sid, "reward": 1.0}).encode()) for _ in range(8)]
        out.append([first] + steps * 50)
    return out


def lstm_stateless(c: int, rng) -> list[list[bytes]]:
    # The same LSTM model without sessions (initial state every call): what sessions cost.
    return [[_request("/v1/models/lstm/act", json.dumps({"observation": obs_row(rng)}).encode()) for _ in range(8)]
            for _ in range(c)]


def minimal(c: int, rng) -> list[list[bytes]]:
    return [[_request("/", json.dumps({"observation": obs_row(rng)}).encode())] for _ in range(c)]


# (key, label, request maker, server env; None = the minimal app instead of rlserve)
SCENARIOS = [
    ("minimal", "minimal ASGI app", minimal, None),
    ("mlp", "MLP 256x256, 1 obs", mlp_single, {}),
    ("lstm", "LSTM 256 sessions, 1 obs", lstm_sessions, {}),
    ("lstm_stateless", "LSTM 256 stateless, 1 obs", lstm_stateless, {}),
    ("batch64", "MLP 256x256, 64 obs/request", mlp_batch64, {}),
    ("binary64", "MLP 256x256, 64 obs/request, raw binary", act_binary64, {}),
    ("infer64", "MLP 256x256, 64 obs/request, OIP binary", infer_binary64, {}),
    ("nobatch", "MLP 256x256, 1 obs, batching off", mlp_single, {"RLSERVE_BATCHING": "false"}),
    ("asgi", "MLP 256x256, 1 obs, ASGI handler", mlp_single, {"RLSERVE_ACT_PROTOCOL": "false"}),
]
KEYS = [key for key, *_ in SCENARIOS]
OBS_PER_REQUEST = {"batch64": 64, "binary64": 64, "infer64": 64}
