"""The protocol's gRPC messages (package ``inference``), built from a descriptor at import.

The Open Inference Protocol's gRPC service is ``inference.GRPCInferenceService``. rlserve
answers its health, metadata, ``ModelInfer`` and ``ModelStreamInfer`` calls, so only their messages are
described here, with the field numbers of the protocol's specification (a client's
messages are read by number, so these must never change). The descriptor lives in a pool
of its own: a process that also imports a client's generated ``inference`` module (tests
do, with ``tritonclient.grpc``) sees no duplicate symbols. No code generator is involved,
so no generated file pins a protobuf runtime version.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

PACKAGE = "inference"
SERVICE = f"{PACKAGE}.GRPCInferenceService"

_F = descriptor_pb2.FieldDescriptorProto
_SCALARS = {"bool": _F.TYPE_BOOL, "string": _F.TYPE_STRING, "bytes": _F.TYPE_BYTES, "int32": _F.TYPE_INT32,
            "int64": _F.TYPE_INT64, "uint32": _F.TYPE_UINT32, "uint64": _F.TYPE_UINT64, "float": _F.TYPE_FLOAT,
            "double": _F.TYPE_DOUBLE}

# message -> [(number, name, type, repeated)]; a type that is not a scalar is a message
# name relative to the package; "map" is map<string, InferParameter>; "oneof:<name>" fields
# (as the type's prefix) share one oneof.
_PARAMETERS = (4, "parameters", "map", True)
_TENSOR_METADATA = [(1, "name", "string", False), (2, "datatype", "string", False), (3, "shape", "int64", True)]
_MESSAGES: dict[str, list[tuple[int, str, str, bool]]] = {
    "ServerLiveRequest": [],
    "ServerLiveResponse": [(1, "live", "bool", False)],
    "ServerReadyRequest": [],
    "ServerReadyResponse": [(1, "ready", "bool", False)],
    "ModelReadyRequest": [(1, "name", "string", False), (2, "version", "string", False)],
    "ModelReadyResponse": [(1, "ready", "bool", False)],
    "ServerMetadataRequest": [],
    "ServerMetadataResponse": [(1, "name", "string", False), (2, "version", "string", False),
                               (3, "extensions", "string", True)],
    "ModelMetadataRequest": [(1, "name", "string", False), (2, "version", "string", False)],
    "ModelMetadataResponse": [(1, "name", "string", False), (2, "versions", "string", True),
                              (3, "platform", "string", False),
                              (4, "inputs", "ModelMetadataResponse.TensorMetadata", True),
                              (5, "outputs", "ModelMetadataResponse.TensorMetadata", True)],
    "ModelMetadataResponse.TensorMetadata": _TENSOR_METADATA,
    "InferParameter": [(1, "bool_param", "oneof:bool", False), (2, "int64_param", "oneof:int64", False),
                       (3, "string_param", "oneof:string", False), (4, "double_param", "oneof:double", False),
                       (5, "uint64_param", "oneof:uint64", False)],
    "InferTensorContents": [(1, "bool_contents", "bool", True), (2, "int_contents", "int32", True),
                            (3, "int64_contents", "int64", True), (4, "uint_contents", "uint32", True),
                            (5, "uint64_contents", "uint64", True), (6, "fp32_contents", "float", True),
                            (7, "fp64_contents", "double", True), (8, "bytes_contents", "bytes", True)],
    "ModelInferRequest": [(1, "model_name", "string", False), (2, "model_version", "string", False),
                          (3, "id", "string", False), _PARAMETERS,
                          (5, "inputs", "ModelInferRequest.InferInputTensor", True),
                          (6, "outputs", "ModelInferRequest.InferRequestedOutputTensor", True),
                          (7, "raw_input_contents", "bytes", True)],
    "ModelInferRequest.InferInputTensor": [*_TENSOR_METADATA, _PARAMETERS,
                                           (5, "contents", "InferTensorContents", False)],
    "ModelInferRequest.InferRequestedOutputTensor": [(1, "name", "string", False), (2, "parameters", "map", True)],
    "ModelInferResponse": [(1, "model_name", "string", False), (2, "model_version", "string", False),
                           (3, "id", "string", False), _PARAMETERS,
                           (5, "outputs", "ModelInferResponse.InferOutputTensor", True),
                           (6, "raw_output_contents", "bytes", True)],
    "ModelInferResponse.InferOutputTensor": [*_TENSOR_METADATA, _PARAMETERS,
                                             (5, "contents", "InferTensorContents", False)],
    "ModelStreamInferResponse": [(1, "error_message", "string", False),
                                 (2, "infer_response", "ModelInferResponse", False)],
}
# The service's calls that rlserve answers: name -> (request, response). The protocol's
# other calls (streaming, repository, shared memory, ...) answer UNIMPLEMENTED.
METHODS = {name: (f"{name}Request", f"{name}Response")
           for name in ("ServerLive", "ServerReady", "ModelReady", "ServerMetadata", "ModelMetadata")}
METHODS["ModelInfer"] = ("ModelInferRequest", "ModelInferResponse")
# Streams of requests and responses both ways (Triton's streaming API, which its sequence
# clients use): name -> (request, response).
STREAMING = {"ModelStreamInfer": ("ModelInferRequest", "ModelStreamInferResponse")}


def _file() -> descriptor_pb2.FileDescriptorProto:
    proto = descriptor_pb2.FileDescriptorProto(name="rlserve/kserve_v2_grpc.proto", package=PACKAGE, syntax="proto3")
    built: dict[str, descriptor_pb2.DescriptorProto] = {}
    for full_name in _MESSAGES:  # parents come before their nested messages
        parent, _, own = full_name.rpartition(".")
        built[full_name] = (built[parent].nested_type if parent else proto.message_type).add(name=own)
    for full_name, fields in _MESSAGES.items():
        message = built[full_name]
        for number, name, kind, repeated in fields:
            field = message.field.add(name=name, number=number,
                                      label=_F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL)
            if kind.startswith("oneof:"):
                if not message.oneof_decl:
                    message.oneof_decl.add(name="parameter_choice")
                field.oneof_index, kind = 0, kind.removeprefix("oneof:")
            if kind == "map":
                entry = message.nested_type.add(name="ParametersEntry")
                entry.options.map_entry = True
                entry.field.add(name="key", number=1, label=_F.LABEL_OPTIONAL, type=_F.TYPE_STRING)
                entry.field.add(name="value", number=2, label=_F.LABEL_OPTIONAL, type=_F.TYPE_MESSAGE,
                                type_name=f".{PACKAGE}.InferParameter")
                field.type, field.type_name = _F.TYPE_MESSAGE, f".{PACKAGE}.{full_name}.ParametersEntry"
            elif kind in _SCALARS:
                field.type = _SCALARS[kind]
            else:
                field.type, field.type_name = _F.TYPE_MESSAGE, f".{PACKAGE}.{kind}"
    service = proto.service.add(name=SERVICE.rpartition(".")[2])
    for name, (request, response) in METHODS.items():
        service.method.add(name=name, input_type=f".{PACKAGE}.{request}", output_type=f".{PACKAGE}.{response}")
    for name, (request, response) in STREAMING.items():
        service.method.add(name=name, input_type=f".{PACKAGE}.{request}", output_type=f".{PACKAGE}.{response}",
                           client_streaming=True, server_streaming=True)
    return proto


_POOL = descriptor_pool.DescriptorPool()
_POOL.Add(_file())


def message(name: str) -> Any:
    """The message class of ``inference.<name>`` (nested names with dots)."""
    return message_factory.GetMessageClass(_POOL.FindMessageTypeByName(f"{PACKAGE}.{name}"))


ServerLiveResponse = message("ServerLiveResponse")
ServerReadyResponse = message("ServerReadyResponse")
ModelReadyResponse = message("ModelReadyResponse")
ServerMetadataResponse = message("ServerMetadataResponse")
ModelMetadataResponse = message("ModelMetadataResponse")
ModelInferRequest = message("ModelInferRequest")
ModelInferResponse = message("ModelInferResponse")
ModelStreamInferResponse = message("ModelStreamInferResponse")
InferParameter = message("InferParameter")
