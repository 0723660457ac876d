"""The protocol's gRPC service (``inference.GRPCInferenceService``), on the app's event loop.

    ModelInferRequest ─► request_of (parameters, typed contents or raw_input_contents,
      checked like the REST body) ─► InferService.infer_message (the REST path's tensors,
      Rows, ActService, sessions, batcher) ─► Answerer.tensors ─► raw_output_contents

``RLSERVE_GRPC_PORT`` (``rlserve serve --grpc-port``) starts it next to HTTP in the same
process, so a gRPC request, a REST v2 request and a JSON act request can share one batch
and one session table. Calls: ServerLive, ServerReady, ModelReady, ServerMetadata,
ModelMetadata, ModelInfer and the streaming ModelStreamInfer; the protocol's other calls
answer UNIMPLEMENTED.

Outputs always come back as ``raw_output_contents`` (what Triton's gRPC server sends and
what ``tritonclient.grpc`` reads); inputs may be raw (all of them) or typed ``contents``.
Refusals are gRPC status codes with the REST message, which names the tensor or parameter
and what was expected and received: 400 INVALID_ARGUMENT, 404 NOT_FOUND, 409 ABORTED (a
sequence changed elsewhere: retry) or FAILED_PRECONDITION (a step index or version that
does not fit), 410 FAILED_PRECONDITION (an ended sequence), 503 UNAVAILABLE (with
``retry-after`` trailing metadata), 500 INTERNAL.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import msgspec
import numpy as np

from rlserve.service.errors import BadRequest, ErrorCounter, ServiceError, SessionBusy, as_service_error
from rlserve.service.protocols.kserve_v2 import grpc_messages as pb
from rlserve.service.protocols.kserve_v2 import metadata
from rlserve.service.protocols.kserve_v2.errors import message_of
from rlserve.service.protocols.kserve_v2.handler import InferService
from rlserve.service.protocols.kserve_v2.request import decode_failure, sequence_id
from rlserve.service.protocols.kserve_v2.tensors import DATATYPES, read_input, wire_array
from rlserve.service.protocols.kserve_v2.wire import InferRequest, InferRequestInput
from rlserve.service.step.sizes import Expect

log = logging.getLogger("rlserve.grpc")

_CODES = {400: grpc.StatusCode.INVALID_ARGUMENT, 404: grpc.StatusCode.NOT_FOUND, 405: grpc.StatusCode.UNIMPLEMENTED,
          410: grpc.StatusCode.FAILED_PRECONDITION,
          413: grpc.StatusCode.RESOURCE_EXHAUSTED, 422: grpc.StatusCode.INVALID_ARGUMENT,
          429: grpc.StatusCode.UNAVAILABLE, 500: grpc.StatusCode.INTERNAL, 503: grpc.StatusCode.UNAVAILABLE}
# Which field of InferTensorContents holds each datatype's typed values (FP16 has none).
_CONTENTS = {"BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
             "INT64": "int64_contents", "UINT8": "uint_contents", "UINT16": "uint_contents",
             "UINT32": "uint_contents", "UINT64": "uint64_contents", "FP32": "fp32_contents",
             "FP64": "fp64_contents", "BYTES": "bytes_contents"}
_EMPTY = memoryview(b"")


def code_of(error: ServiceError) -> grpc.StatusCode:
    """gRPC's code for a refusal. ABORTED tells a client to retry, so only a 409 a retry may
    clear gets it (``SessionBusy``); a step index or version that does not fit stays until
    the request changes: FAILED_PRECONDITION, as for an ended sequence."""
    if error.status == 409:
        return grpc.StatusCode.ABORTED if isinstance(error, SessionBusy) else grpc.StatusCode.FAILED_PRECONDITION
    return _CODES.get(error.status, grpc.StatusCode.UNKNOWN)


# --------------------------------------------------------------------------- requests

def parameters_of(parameters: Any, where: str) -> dict[str, Any]:
    """A protobuf ``map<string, InferParameter>`` as the REST body's parameters."""
    values: dict[str, Any] = {}
    for key, value in parameters.items():
        choice = value.WhichOneof("parameter_choice")
        if choice is None:
            raise BadRequest(f"{where}.{key} holds no value", field=f"{where}.{key}",
                             expected="one of bool_param, int64_param, uint64_param, double_param, string_param",
                             received="an empty InferParameter")
        values[key] = getattr(value, choice)
    return values


def _typed_contents(tensor: Any) -> list[Any]:
    """An input's ``contents`` as the REST body's inline data (checked the same way)."""
    contents = tensor.contents
    filled = [field.name for field, _ in contents.ListFields()]
    wanted = _CONTENTS.get(tensor.datatype)
    if not filled or (wanted is None and tensor.datatype not in DATATYPES):
        return []  # read_input names an unknown datatype; an empty tensor is its shape's business
    if wanted is None:
        raise BadRequest(f"input '{tensor.name}': {tensor.datatype} has no typed contents; send it in "
                         "raw_input_contents", field=f"{tensor.name}.contents", expected="raw_input_contents",
                         received=filled)
    if filled != [wanted]:
        raise BadRequest(f"input '{tensor.name}': {tensor.datatype} values go in contents.{wanted}",
                         field=f"{tensor.name}.contents", expected=wanted, received=filled)
    return list(getattr(contents, wanted))


def request_of(message: Any) -> tuple[InferRequest, PerInput]:
    """The REST body a ``ModelInferRequest`` stands for, and its raw input data."""
    raw = list(message.raw_input_contents)
    if raw and len(raw) != len(message.inputs):
        raise BadRequest(f"raw_input_contents holds {len(raw)} buffers for {len(message.inputs)} inputs; send "
                         "every input raw, or none", field="raw_input_contents", expected=len(message.inputs),
                         received=len(raw))
    inputs = []
    for index, tensor in enumerate(message.inputs):
        body: dict[str, Any] = {"name": tensor.name, "shape": list(tensor.shape), "datatype": tensor.datatype,
                                "parameters": parameters_of(tensor.parameters, f"{tensor.name}.parameters")}
        if raw:
            if tensor.HasField("contents"):
                raise BadRequest(f"input '{tensor.name}' has both contents and raw_input_contents; send one",
                                 field=f"{tensor.name}.contents", expected="raw_input_contents only",
                                 received="both")
            body["parameters"]["binary_data_size"] = len(raw[index])
        elif tensor.HasField("contents"):
            body["data"] = _typed_contents(tensor)
        elif tensor.datatype in DATATYPES:  # (an unknown datatype is named by read_input)
            wanted = _CONTENTS.get(tensor.datatype)
            expected = "raw_input_contents" + ("" if wanted is None else f" or contents.{wanted}")
            raise BadRequest(f"input '{tensor.name}': no data; send it in {expected}",
                             field=f"{tensor.name}.contents", expected=expected, received=None)
        inputs.append(body)
    request: dict[str, Any] = {"inputs": inputs, "parameters": parameters_of(message.parameters, "parameters")}
    if message.id:
        request["id"] = message.id
    if message.outputs:
        request["outputs"] = [{"name": out.name, "parameters": parameters_of(out.parameters, f"{out.name}.parameters")}
                              for out in message.outputs]
    try:
        decoded = msgspec.convert(request, InferRequest)
    except msgspec.ValidationError as exc:
        raise decode_failure(exc) from None
    return decoded, PerInput(raw)


class PerInput:
    """gRPC: each input's raw buffer of its own (``raw_input_contents[i]``), or none."""

    def __init__(self, raw: list[bytes]):
        self.raw, self.index = raw, 0

    def restart(self) -> PerInput:
        self.index = 0
        return self

    def read(self, inp: InferRequestInput, expect: Expect) -> np.ndarray:
        buffer = memoryview(self.raw[self.index]) if self.raw else _EMPTY
        self.index += 1
        return read_input(inp, buffer, 0, expect)[0]

    def finish(self) -> None:
        pass  # every buffer belongs to one input (request_of counted them)


def _sequence_key(request: Any) -> tuple[str, str] | None:
    """(model, session id) of a sequence's step; None outside any sequence, and for an id
    that does not parse (the request itself is then refused, naming it)."""
    parameter = request.parameters.get("sequence_id")
    choice = None if parameter is None else parameter.WhichOneof("parameter_choice")
    if choice is None:
        return None
    try:
        session_id = sequence_id(getattr(parameter, choice))
    except BadRequest:
        return None
    return None if session_id is None else (request.model_name, session_id)


def _stream_error(request: Any, message: str) -> Any:
    """A refusal on a stream: the message, with the request's id and model to match it."""
    item = pb.ModelStreamInferResponse(error_message=message)
    item.infer_response.id, item.infer_response.model_name = request.id, request.model_name
    return item


def response_of(request: Any, policy_name: str, policy_version: str,
                tensors: list[tuple[str, str, np.ndarray, bool]]) -> Any:
    response = pb.ModelInferResponse(model_name=policy_name, model_version=policy_version, id=request.id)
    for name, datatype, arr, _ in tensors:
        arr = wire_array(arr, datatype)
        response.outputs.add(name=name, datatype=datatype, shape=arr.shape)
        response.raw_output_contents.append(arr.tobytes())
    return response


# --------------------------------------------------------------------------- the service

class GrpcInferenceService:
    """The calls of ``inference.GRPCInferenceService`` that rlserve answers."""

    def __init__(self, infer: InferService, ready: Callable[[], bool], errors: ErrorCounter | None = None):
        self.infer = infer
        self.registry = infer.registry
        self.ready = ready
        self.errors = errors

    def _refusal(self, exc: Exception) -> ServiceError:
        """Every refusal as the service's error, counted; a bug as INTERNAL (logged)."""
        error = as_service_error(exc, log, "gRPC call failed")
        if self.errors is not None:
            self.errors.error(error.code, error.status)
        return error

    async def _answer(self, context: Any, make: Callable[[], Awaitable[Any]]) -> Any:
        try:
            return await make()
        except Exception as exc:
            error = self._refusal(exc)
            if error.headers:
                context.set_trailing_metadata(tuple((k.lower(), v) for k, v in error.headers.items()))
            await context.abort(code_of(error), message_of(error))

    async def server_live(self, request: Any, context: Any) -> Any:
        return pb.ServerLiveResponse(live=True)

    async def server_ready(self, request: Any, context: Any) -> Any:
        return pb.ServerReadyResponse(ready=self.ready())

    async def model_ready(self, request: Any, context: Any) -> Any:
        try:
            ready = metadata.model_ready(self.registry, request.name, request.version or None).ready
        except ServiceError as exc:  # Triton answers "not ready" for a model it does not have
            if exc.status != 404:
                raise
            ready = False
        return pb.ModelReadyResponse(ready=ready)

    async def server_metadata(self, request: Any, context: Any) -> Any:
        meta = metadata.server_metadata()
        return pb.ServerMetadataResponse(name=meta.name, version=meta.version, extensions=meta.extensions)

    async def model_metadata(self, request: Any, context: Any) -> Any:
        async def make() -> Any:
            meta = metadata.model_metadata(self.registry, request.name, request.version or None)
            response = pb.ModelMetadataResponse(name=meta.name, versions=meta.versions, platform=meta.platform)
            for tensors, into in ((meta.inputs, response.inputs), (meta.outputs, response.outputs)):
                for tensor in tensors:
                    into.add(name=tensor.name, datatype=tensor.datatype, shape=tensor.shape)
            return response
        return await self._answer(context, make)

    async def _infer(self, request: Any) -> Any:
        decoded, data = request_of(request)
        accepted, answerer, output = await self.infer.infer_message(
            request.model_name, request.model_version or None, decoded, data)
        response = response_of(request, accepted.policy.name, accepted.policy.version,
                               answerer.tensors(accepted, output))
        answerer.finish(accepted, "grpc_infer")
        return response

    async def model_infer(self, request: Any, context: Any) -> Any:
        return await self._answer(context, lambda: self._infer(request))

    async def model_stream_infer(self, requests: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
        """Triton's streaming API: one response per request, in the order they are done.

        Requests are answered concurrently (so they share batches), except that a step of
        a sequence waits until the step sent before it on this stream is answered: a
        client may send a sequence's steps without waiting for answers, step indexes
        (``parameters.step``) included, and they apply in order. A refused request is an
        ``error_message`` response carrying the request's id; the stream goes on."""
        done: asyncio.Queue[Any] = asyncio.Queue()
        last: dict[tuple[str, str], asyncio.Task[None]] = {}  # each sequence's latest step on this stream

        async def answer(request: Any, before: asyncio.Task[None] | None) -> None:
            item = None
            try:
                if before is not None:
                    await asyncio.wait([before])
                item = pb.ModelStreamInferResponse(infer_response=await self._infer(request))
            except Exception as exc:
                item = _stream_error(request, message_of(self._refusal(exc)))
            finally:  # every request gets its answer, or the stream would wait for it forever
                done.put_nowait(item if item is not None else _stream_error(request, "internal error"))

        def forget(key: tuple[str, str], task: asyncio.Task[None]) -> None:  # once it is answered
            if last.get(key) is task:
                del last[key]

        async def read() -> None:
            tasks: set[asyncio.Task[None]] = set()
            try:
                async for request in requests:
                    key = _sequence_key(request)
                    task = asyncio.get_running_loop().create_task(answer(request, last.get(key) if key else None))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                    if key is not None:
                        last[key] = task
                        task.add_done_callback(functools.partial(forget, key))
            finally:  # the client closed its side (or it broke): answer what came, then end
                if tasks:
                    await asyncio.wait(tasks)
                done.put_nowait(None)

        reader = asyncio.get_running_loop().create_task(read())
        try:
            while (item := await done.get()) is not None:
                yield item
        finally:
            reader.cancel()

    def handler(self) -> grpc.GenericRpcHandler:
        calls = {"ServerLive": self.server_live, "ServerReady": self.server_ready, "ModelReady": self.model_ready,
                 "ServerMetadata": self.server_metadata, "ModelMetadata": self.model_metadata,
                 "ModelInfer": self.model_infer}
        handlers = {}
        for name, (request, response) in pb.METHODS.items():
            handlers[name] = grpc.unary_unary_rpc_method_handler(
                calls[name], request_deserializer=pb.message(request).FromString,
                response_serializer=pb.message(response).SerializeToString)
        handlers["ModelStreamInfer"] = grpc.stream_stream_rpc_method_handler(
            self.model_stream_infer, request_deserializer=pb.ModelInferRequest.FromString,
            response_serializer=pb.message("ModelStreamInferResponse").SerializeToString)
        return grpc.method_handlers_generic_handler(pb.SERVICE, handlers)


async def start_server(service: GrpcInferenceService, host: str, port: int, max_message_bytes: int) -> tuple[
        grpc.aio.Server, int]:
    """Listen on ``host:port`` (0: a free port); returns the server and its port."""
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", max_message_bytes),
                                      ("grpc.max_send_message_length", -1)])
    server.add_generic_rpc_handlers((service.handler(),))
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        bound = server.add_insecure_port(address)
    except RuntimeError as exc:  # grpc says only "Failed to bind"
        raise RuntimeError(f"the gRPC service cannot listen on {address} (in use, or not an address of this "
                           f"machine): {exc}") from exc
    await server.start()
    return server, bound

