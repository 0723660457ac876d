"""The command line bench_peers.py starts every peer with (no torch: PyTriton's peer has none)."""

from __future__ import annotations

import argparse


def peer_args(doc: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    parser.add_argument("--model", choices=("mlp", "lstm"), required=True)
    parser.add_argument("--weights", required=True,
                        help="the model's weights (bench_peers.save_weights), or its ONNX graph for PyTriton")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--max-batch", type=int, default=64, help="requests per batch, for the batching peers")
    parser.add_argument("--wait-s", type=float, default=0.001, help="how long a batch waits for more requests")
    return parser.parse_args()
