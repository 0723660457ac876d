"""No request makes the server allocate what its body does not hold (issue 29), end to end.

A real ``rlserve serve`` (the embedded CartPole MLP and LSTM, gRPC on) gets every body form
that declares a size: the raw act body's ``X-Rlserve-Shape``, the base64 block's ``shape``,
a single observation's base64 ``shape``, the Open Inference Protocol's ``shape`` and
``binary_data_size`` (JSON, binary and gRPC), a batch's row count, a session record's
lengths and an upload's member sizes. Each is sent with declared sizes that are huge,
zero-width, overflowing, or inconsistent with the body. Every answer must be a 4xx (gRPC: a
client error code; the old answers were 500s, or came after seconds of work), refused
before the server did the work the claim asks for: the server's peak resident memory
(``VmHWM`` of its process) may grow by less than 64 MiB over all of them (the old server went
from ~110 MB to ~1 GB on one request), and no refusal may cost the server more than a
quarter of a CPU second (its own CPU time, ``/proc/<pid>/stat``, which other processes'
load does not inflate as it does the wall clock; the old ones cost seconds).
"""

from __future__ import annotations

import base64
import functools
import gzip
import io
import json
import os
import statistics
import struct
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
from server_process import ServerProcess, free_port
from tritonclient.grpc import service_pb2, service_pb2_grpc

pytestmark = pytest.mark.e2e

TOKEN = "sizes-admin-token"
MODELS = {"cartpole": 4, "cartpole-memory": 2}  # observation width of each embedded model
GROWTH_LIMIT = 64 << 20
CPU_LIMIT_S = 0.25  # of the server's CPU time per refusal
# Declared shapes that the body does not hold (the body sent with each is ``_body``'s).
SHAPES = {
    "huge": [4294967296, 4],
    "zero-width": [20000000, 0],
    "huge-zero-width": [4294967296, 0],
    "overflowing": [1170185322465, 0, 50, 811, 55, 53288349742, 3],
    "overflowing-nonzero": [1 << 40, 1 << 40, 1 << 40],
    "rows-over-the-limit": [70000, 4],
    "one-byte-short": [1, 4],
    "transposed": [4, 1],
}


def _body(name: str, width: int) -> bytes:
    """What each declared shape comes with: nothing, or one row but a byte."""
    return bytes(4 * width - 1) if name == "one-byte-short" else b""


def cpu_seconds(pid: int) -> float:
    """The CPU time the process has used so far (user and system, all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss(pid: int) -> int:
    """The process's peak resident set (VmHWM), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmHWM in /proc/{pid}/status")


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[ServerProcess, str]]:
    grpc_port = free_port()
    proc = ServerProcess({"RLSERVE_ADMIN_TOKEN": TOKEN, "RLSERVE_GRPC_PORT": str(grpc_port)}).start()
    try:
        yield proc, f"127.0.0.1:{grpc_port}"
    finally:
        proc.stop()


# --------------------------------------------------------------------------- the forms

Send = Callable[[list[int], bytes], int]


def raw_act(http: httpx.Client, model: str) -> Send:
    def send(shape: list[int], data: bytes) -> int:
        headers = {"content-type": "application/octet-stream", "x-rlserve-dtype": "float32",
                   "x-rlserve-shape": ",".join(map(str, shape))}
        return http.post(f"/v1/models/{model}/act", content=data, headers=headers).status_code
    return send


def block_act(http: httpx.Client, model: str) -> Send:
    def send(shape: list[int], data: bytes) -> int:
        block = {"b64": base64.b64encode(data).decode(), "dtype": "float32", "shape": shape}
        return http.post(f"/v1/models/{model}/act", json={"observations": block}).status_code
    return send


def single_b64_act(http: httpx.Client, model: str) -> Send:
    def send(shape: list[int], data: bytes) -> int:
        obs = {"b64": base64.b64encode(data).decode(), "dtype": "float32", "shape": shape}
        return http.post(f"/v1/models/{model}/act", json={"observation": obs}).status_code
    return send


def v2_json(http: httpx.Client, model: str) -> Send:
    def send(shape: list[int], data: bytes) -> int:
        values = np.frombuffer(data[: len(data) // 4 * 4], np.float32).tolist()
        body = {"inputs": [{"name": "obs", "shape": shape, "datatype": "FP32", "data": values}]}
        return http.post(f"/v2/models/{model}/infer", json=body).status_code
    return send


def v2_binary(http: httpx.Client, model: str, declared_size: bool = False) -> Send:
    """The binary extension; ``declared_size``: ``binary_data_size`` says what the shape
    needs (a huge claim) instead of what follows."""
    def send(shape: list[int], data: bytes) -> int:
        size = int(np.prod(shape, dtype=object)) * 4 if declared_size else len(data)
        inp = {"name": "obs", "shape": shape, "datatype": "FP32", "parameters": {"binary_data_size": size}}
        header = json.dumps({"inputs": [inp]}).encode()
        headers = {"content-type": "application/octet-stream", "inference-header-content-length": str(len(header))}
        return http.post(f"/v2/models/{model}/infer", content=header + data, headers=headers).status_code
    return send


def grpc_infer(stub: service_pb2_grpc.GRPCInferenceServiceStub, model: str) -> Send:
    def send(shape: list[int], data: bytes) -> int:
        request = service_pb2.ModelInferRequest(model_name=model)
        request.inputs.add(name="obs", datatype="FP32", shape=shape)
        request.raw_input_contents.append(data)
        try:
            stub.ModelInfer(request, timeout=30)
        except grpc.RpcError as exc:
            return {grpc.StatusCode.INVALID_ARGUMENT: 400, grpc.StatusCode.RESOURCE_EXHAUSTED: 413,
                    grpc.StatusCode.NOT_FOUND: 404}.get(exc.code(), 500)
        return 200
    return send


def forms(http: httpx.Client, stub: service_pb2_grpc.GRPCInferenceServiceStub, model: str) -> dict[str, Send]:
    return {"raw act body": raw_act(http, model), "base64 block": block_act(http, model),
            "single base64 observation": single_b64_act(http, model), "v2 JSON": v2_json(http, model),
            "v2 binary": v2_binary(http, model), "v2 binary, declared size": v2_binary(http, model, True),
            "gRPC raw": grpc_infer(stub, model)}


# --------------------------------------------------------------------------- bodies with counts inside

def rows_over_the_limit(http: httpx.Client, model: str) -> int:
    """A JSON batch the body does hold, with more rows than one request may carry."""
    rows = b"[" + b",".join([b"[0,0]"] * 70000) + b"]"
    return http.post(f"/v1/models/{model}/act", content=b'{"observations": ' + rows + b"}",
                     headers={"content-type": "application/json"}).status_code


def session_record_claims(http: httpx.Client) -> list[int]:
    """An exported session record whose header claims a huge kept answer and version."""
    assert http.post("/v1/models/cartpole-memory/sessions", json={"session_id": "claims"}).status_code == 201
    record = http.get("/v1/models/cartpole-memory/sessions/claims",
                      headers={"accept": "application/octet-stream"}).content
    statuses = []
    for offset, fmt, value in ((36, "<I", 2**32 - 1), (10, "<H", 2**16 - 1)):  # answer_len, version_len
        claimed = record[:offset] + struct.pack(fmt, value) + record[offset + struct.calcsize(fmt):]
        statuses.append(http.put("/v1/models/cartpole-memory/sessions/claims2", content=claimed,
                                 headers={"content-type": "application/octet-stream"}).status_code)
    return statuses


def upload_claiming_a_terabyte(http: httpx.Client) -> int:
    """An archive whose manifest and member header both claim a terabyte of data."""
    manifest = json.dumps({"name": "claim", "version": "1", "files": {"big.onnx": {"bytes": 1 << 40,
                                                                                    "sha256": "0" * 64}}}).encode()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("manifest.json")
        info.size = len(manifest)
        tar.addfile(info, io.BytesIO(manifest))
        member = tarfile.TarInfo("big.onnx")
        member.size = 1 << 40
        tar.addfile(member)  # the header only: the claimed bytes never come
    return http.post("/v1/admin/models", content=gzip.compress(buf.getvalue()),
                     headers={"content-type": "application/octet-stream",
                              "authorization": f"Bearer {TOKEN}"}).status_code


# --------------------------------------------------------------------------- the test

Probe = Callable[[], "int | list[int]"]


def probes(http: httpx.Client, stub: service_pb2_grpc.GRPCInferenceServiceStub) -> Iterator[tuple[str, Probe]]:
    """(label, call) for every form, model and declared size; a call returns the status(es)."""
    for model, width in MODELS.items():
        for form, send in forms(http, stub, model).items():
            for shape_name, shape in SHAPES.items():
                yield f"{model} {form} {shape_name} {shape}", functools.partial(send, shape, _body(shape_name, width))
        yield f"{model} JSON batch of 70000 rows", functools.partial(rows_over_the_limit, http, model)
    yield "session import claiming a huge answer and version", functools.partial(session_record_claims, http)
    yield "upload claiming a terabyte", functools.partial(upload_claiming_a_terabyte, http)


def warm_up(http: httpx.Client, stub: service_pb2_grpc.GRPCInferenceServiceStub) -> None:
    """Every form's path answered once, so what it allocates for good is in the baseline."""
    for model, width in MODELS.items():
        row = np.zeros((1, width), np.float32).tobytes()
        for name, send in forms(http, stub, model).items():
            if name not in ("single base64 observation", "v2 binary, declared size"):
                assert send([1, width], row) == 200, (model, name)


def test_declared_sizes_the_body_does_not_hold_are_refused_before_any_work(server):
    proc, grpc_address = server
    assert proc.proc is not None
    pid = proc.proc.pid
    costs: list[tuple[float, str]] = []
    answers: dict[str, int] = {}
    with httpx.Client(base_url=proc.url, timeout=60) as http, grpc.insecure_channel(grpc_address) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        warm_up(http, stub)
        before = peak_rss(pid)
        for label, call in probes(http, stub):
            used = cpu_seconds(pid)
            status = call()  # answered: the server's work for it is done
            costs.append((cpu_seconds(pid) - used, label))
            for i, one in enumerate(status if isinstance(status, list) else [status]):
                answers[f"{label} #{i}"] = one
        grown = peak_rss(pid) - before
        assert http.get("/healthz").status_code == 200
    not_4xx = {label: status for label, status in answers.items() if not 400 <= status < 500}
    assert not not_4xx, not_4xx
    costliest = max(costs)
    median_ms = statistics.median(t for t, _ in costs) * 1e3
    assert costliest[0] < CPU_LIMIT_S, (f"costliest: {costliest[1]} took {costliest[0]:.2f} s of the server's CPU "
                                        f"(median {median_ms:.1f} ms)")
    assert grown < GROWTH_LIMIT, f"peak RSS grew by {grown / 2**20:.1f} MiB over {len(answers)} refusals"
    print(f"{len(answers)} refusals, server CPU median {median_ms:.1f} ms, costliest {costliest[0] * 1e3:.1f} ms "
          f"({costliest[1]}), peak RSS +{grown / 2**20:.1f} MiB")
