"""Calls of Triton's gRPC client for the Open Inference Protocol's gRPC tests: input tensors,
requested outputs, a refused call's exception, the streaming API as a queue."""

from __future__ import annotations

import queue

import numpy as np
import pytest
import tritonclient.grpc as triton
from tritonclient.utils import InferenceServerException


def tensor(name: str, arr: np.ndarray) -> triton.InferInput:
    inp = triton.InferInput(name, list(arr.shape), triton.np_to_triton_dtype(arr.dtype))
    inp.set_data_from_numpy(arr)
    return inp


def wanted(*names: str) -> list[triton.InferRequestedOutput]:
    return [triton.InferRequestedOutput(name) for name in names]


def refused(call) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as info:
        call()
    return info.value


class Stream:
    """tritonclient's streaming API: answers arrive through a callback, here a queue."""

    def __init__(self, client: triton.InferenceServerClient):
        self.client, self.answers = client, queue.Queue()
        client.start_stream(callback=lambda result, error: self.answers.put((result, error)))

    def next(self) -> tuple:
        return self.answers.get(timeout=30)

    def close(self) -> None:
        self.client.stop_stream()


def lstm_observations(steps: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1, 1, (steps, 4)).astype(np.float32)
