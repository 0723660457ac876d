"""Drives `rlserve serve` with the `kserve` SDK's own clients; run as a subprocess.

The kserve SDK and `tritonclient.grpc` both register the protocol's gRPC messages
(`inference.*`) in protobuf's default descriptor pool, so one Python process cannot import
both. The test process keeps tritonclient; this script runs the kserve side by itself.

    python kserve_sdk_client.py < calls.json > answers.json

Input: {"rest": base URL, "grpc": "host:port", "calls": [call, ...]}, each call one of
- {"kind": "health", "models": [...]}: REST is_server_live / is_server_ready, and
  is_model_ready for each model, over both transports;
- {"kind": "infer", "transport": "rest" | "grpc", "model": ..., "inputs": [{"name",
  "datatype", "shape", "data" (flat), "binary"}], "outputs": [{"name", "binary"}] or null,
  "parameters": {...} or null, "id": ... or null}.
Output: one answer per call, in order: the health booleans, or for an infer
{"model_name", "model_version", "id", "outputs": {name: {"datatype", "shape", "data"}}}
(REST also "binary_body": whether binary data followed the JSON header), or
{"error": {"status", "message"}} when the client raised.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import grpc
import httpx
import numpy as np
from kserve import InferenceGRPCClient, InferenceRESTClient, InferInput, InferRequest, RESTConfig
from kserve.protocol.infer_type import RequestedOutput

DTYPES = {"FP32": np.float32, "FP64": np.float64, "INT64": np.int64, "INT32": np.int32, "BOOL": np.bool_}


def _request(call: dict[str, Any]) -> InferRequest:
    inputs = []
    for spec in call["inputs"]:
        arr = np.asarray(spec["data"], dtype=DTYPES[spec["datatype"]]).reshape(spec["shape"])
        inp = InferInput(spec["name"], list(arr.shape), spec["datatype"])
        inp.set_data_from_numpy(arr, binary_data=spec["binary"])
        inputs.append(inp)
    outputs = None
    if call.get("outputs") is not None:
        outputs = [RequestedOutput(o["name"], {"binary_data": o["binary"]}) for o in call["outputs"]]
    return InferRequest(model_name=call["model"], infer_inputs=inputs, request_id=call.get("id"),
                        parameters=call.get("parameters"), request_outputs=outputs)


def _answer(response: Any) -> dict[str, Any]:
    outputs = {}
    for out in response.outputs:
        arr = out.as_numpy()
        outputs[out.name] = {"datatype": out.datatype, "shape": list(out.shape), "data": arr.ravel().tolist()}
    return {"model_name": response.model_name, "model_version": response.model_version, "id": response.id,
            "outputs": outputs}


async def _infer(rest: InferenceRESTClient, grpc_client: InferenceGRPCClient, base: str,
                 call: dict[str, Any]) -> dict[str, Any]:
    request = _request(call)
    try:
        if call["transport"] == "rest":
            headers: dict[str, str] = {}
            answer = _answer(await rest.infer(base, request, model_name=call["model"], response_headers=headers))
            # The SDK reads binary outputs into data and drops binary_data_size: the header
            # says whether the body carried binary data.
            answer["binary_body"] = "inference-header-content-length" in {k.lower() for k in headers}
            return answer
        return _answer(await grpc_client.infer(request))
    except httpx.HTTPStatusError as exc:
        return {"error": {"status": exc.response.status_code, "message": exc.response.json().get("error")}}
    except grpc.RpcError as exc:
        return {"error": {"status": exc.code().name, "message": exc.details()}}


async def main() -> None:
    plan = json.load(sys.stdin)
    base = plan["rest"]
    rest = InferenceRESTClient(RESTConfig(protocol="v2", retries=0, timeout=30))
    grpc_client = InferenceGRPCClient(plan["grpc"], timeout=30, retries=0)
    answers: list[Any] = []
    try:
        for call in plan["calls"]:
            if call["kind"] == "health":
                answers.append({
                    "rest_live": await rest.is_server_live(base),
                    "rest_ready": await rest.is_server_ready(base),
                    "rest_models": {m: await rest.is_model_ready(base, m) for m in call["models"]},
                    "grpc_live": await grpc_client.is_server_live(),
                    "grpc_ready": await grpc_client.is_server_ready(),
                    "grpc_models": {m: await grpc_client.is_model_ready(m) for m in call["models"]},
                })
            else:
                answers.append(await _infer(rest, grpc_client, base, call))
    finally:
        await rest.close()
        await grpc_client.close()
    json.dump(answers, sys.stdout)


if __name__ == "__main__":
    asyncio.run(main())
