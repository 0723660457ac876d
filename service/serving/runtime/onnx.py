"""ONNX Runtime backend: CUDA when the installed build offers it, else CPU."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

log = logging.getLogger("rlserve.runtime")

_ORT_TYPES = {
    "tensor(float)": np.float32,
    "tensor(double)": np.float64,
    "tensor(float16)": np.float16,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(int8)": np.int8,
    "tensor(uint8)": np.uint8,
    "tensor(bool)": np.bool_,
}


class OnnxRuntime:
    kind = "onnx"

    def __init__(self, path: Path, *, intra_op_threads: int = 1, use_gpu: bool = True,
                 policy_path: Path | None = None, intra_op_spinning: bool = False):
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = intra_op_threads
        options.inter_op_num_threads = 1
        # With more than one intra-op thread, ONNX Runtime's pool threads spin-wait for work
        # unless told not to: on a server they would take the cores the event loop needs.
        options.add_session_config_entry("session.intra_op.allow_spinning", "1" if intra_op_spinning else "0")
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        available = ort.get_available_providers()
        providers = ["CPUExecutionProvider"]
        if use_gpu and "CUDAExecutionProvider" in available:
            providers.insert(0, "CUDAExecutionProvider")
        self._session = ort.InferenceSession(str(path), sess_options=options, providers=providers)
        # The same graph without the value head (bundles exported since it exists): what a
        # batch that nobody asked the value of runs. ONNX Runtime would run every node of
        # the full graph whatever outputs were requested.
        self._policy_session = (None if policy_path is None else
                                ort.InferenceSession(str(policy_path), sess_options=options, providers=providers))
        self._policy_outputs = ([] if self._policy_session is None else
                                [o.name for o in self._policy_session.get_outputs()])
        self.providers = self._session.get_providers()
        self.device = "cuda:0" if self.providers[0] == "CUDAExecutionProvider" else "cpu"
        self.input_dtypes = {i.name: np.dtype(_ORT_TYPES.get(i.type, np.float32)) for i in self._session.get_inputs()}
        self.output_names = [o.name for o in self._session.get_outputs()]
        self._run_options = ort.RunOptions()
        log.info("onnx runtime %s on %s (providers %s)", path.name, self.device, self.providers)

    def run(self, inputs: dict[str, np.ndarray], *, value: bool = True) -> dict[str, np.ndarray]:
        feed = {name: inputs[name] for name in self.input_dtypes}
        if not value and self._policy_session is not None:
            outputs = self._policy_session.run(self._policy_outputs, feed, self._run_options)
            return dict(zip(self._policy_outputs, outputs, strict=True))
        outputs = self._session.run(self.output_names, feed, self._run_options)
        return dict(zip(self.output_names, outputs, strict=True))

    def run_policy(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.run(inputs, value=False)

    def describe(self) -> dict[str, object]:
        return {"kind": self.kind, "device": self.device, "providers": list(self.providers),
                "policy_graph": self._policy_session is not None}
