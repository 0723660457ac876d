"""The benchmark's MLP served by PyTriton (NVIDIA's Triton Inference Server from Python).

PyTriton binds a Python function to a Triton model; Triton's own HTTP server answers the
Open Inference Protocol (``POST /v2/models/policy/infer``, JSON tensors), and its dynamic
batcher gathers the rows of concurrent requests into one call (``ModelConfig(max_batch_size,
batcher=DynamicBatcher(max_queue_delay_microseconds))``, PyTriton's documented batching;
``@batch`` hands the function the stacked inputs). The function runs rlserve's own exported
policy graph (the bundle's ``model_policy.onnx``, passed as ``--weights``) with ONNX Runtime,
one thread, and samples the action with numpy: torch 2.13.0 has no CPU wheel for Python
3.12 here, which PyTriton 0.7's Python backend needs. Triton keeps no per-client state for
a Python model, so only the MLP is served. Every port is bound to 127.0.0.1.

    python scripts/peers/peer_pytriton.py --model mlp --weights model_policy.onnx --port 8105
"""

from __future__ import annotations

import signal
import socket
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import onnxruntime as ort  # noqa: E402
from peer_cli import peer_args  # noqa: E402
from pytriton.decorators import batch  # noqa: E402
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor  # noqa: E402
from pytriton.triton import Triton, TritonConfig  # noqa: E402

ROWS_PER_BATCH = 1024  # Triton counts rows; as rlserve's default batch


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_infer(graph: str) -> Callable[..., dict[str, np.ndarray]]:
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    session = ort.InferenceSession(graph, options, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng()

    @batch
    def infer(obs: np.ndarray) -> dict[str, np.ndarray]:
        logits = session.run(["dist_inputs"], {"obs": obs.astype(np.float32, copy=False)})[0]
        logp_all = logits - np.logaddexp.reduce(logits, axis=1, keepdims=True)
        cdf = np.cumsum(np.exp(logp_all), axis=1)
        actions = np.minimum((cdf < rng.random((len(obs), 1)) * cdf[:, -1:]).sum(axis=1), logits.shape[1] - 1)
        logp = np.take_along_axis(logp_all, actions[:, None], axis=1)
        return {"action": actions[:, None].astype(np.int64), "logp": logp.astype(np.float32)}

    return infer


def main() -> None:
    args = peer_args(__doc__)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # leave through Triton's exit: it removes its workspace
    if args.model != "mlp":
        raise SystemExit("peer_pytriton.py serves the MLP only (no per-client state)")
    config = TritonConfig(http_address="127.0.0.1", http_port=args.port, grpc_address="127.0.0.1",
                          grpc_port=_free_port(), allow_metrics=False, log_verbose=0)
    model_config = ModelConfig(max_batch_size=ROWS_PER_BATCH,
                               batcher=DynamicBatcher(max_queue_delay_microseconds=round(args.wait_s * 1e6)))
    with Triton(config=config) as triton:
        triton.bind(model_name="policy", infer_func=make_infer(args.weights),
                    inputs=[Tensor(name="obs", dtype=np.float32, shape=(16,))],
                    outputs=[Tensor(name="action", dtype=np.int64, shape=(1,)),
                             Tensor(name="logp", dtype=np.float32, shape=(1,))],
                    config=model_config)
        triton.serve()


if __name__ == "__main__":
    main()
