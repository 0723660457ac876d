"""The gRPC service's messages and their translation to the REST protocol's request.

rlserve describes the protocol's messages itself (``grpc_messages``); a client reads them by
field number, so every message is checked against the generated module Triton's own client
ships (``tritonclient.grpc.service_pb2``): each field filled on one side reads back the same
on the other. Then ``request_of`` (ModelInferRequest -> the REST body and its raw buffers)
and the status codes of refusals.
"""

from __future__ import annotations

import grpc
import numpy as np
import pytest
from google.protobuf import json_format
from google.protobuf.descriptor import FieldDescriptor
from tritonclient.grpc import service_pb2

from rlserve.service.errors import BadRequest, ServiceError, SessionBusy, SessionConflict
from rlserve.service.protocols.kserve_v2 import grpc_messages as pb
from rlserve.service.protocols.kserve_v2.grpc_server import code_of, request_of, response_of
from rlserve.service.step.sizes import Expect

_T = FieldDescriptor
ANY_ROWS = Expect(max_rows=1024)  # no model here: the declared shape is checked against the bytes alone
_VALUES = {_T.TYPE_BOOL: True, _T.TYPE_STRING: "text", _T.TYPE_BYTES: b"\x00\x01", _T.TYPE_INT32: -7,
           _T.TYPE_INT64: -(2 ** 40), _T.TYPE_UINT32: 7, _T.TYPE_UINT64: 2 ** 63, _T.TYPE_FLOAT: 0.5,
           _T.TYPE_DOUBLE: 0.25}


def _fill(message, depth: int = 0) -> None:
    """Every field of ``message`` set (one member of a oneof: the last one wins), nested too."""
    for field in message.DESCRIPTOR.fields:
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            _fill(getattr(message, field.name)["key"], depth + 1)
        elif field.message_type is not None:
            _fill(getattr(message, field.name).add() if field.is_repeated else getattr(message, field.name),
                  depth + 1)
        elif field.is_repeated:
            getattr(message, field.name).extend([_VALUES[field.type]] * 2)
        else:
            setattr(message, field.name, _VALUES[field.type])


CALLS = {**pb.METHODS, **pb.STREAMING}
MESSAGES = sorted({name for pair in CALLS.values() for name in pair} | {"InferParameter", "InferTensorContents"})


@pytest.mark.parametrize("name", MESSAGES)
def test_each_message_reads_tritons_own_encoding_and_back(name):
    ours, theirs = pb.message(name)(), getattr(service_pb2, name)()
    _fill(ours)
    theirs.ParseFromString(ours.SerializeToString())
    assert json_format.MessageToDict(theirs) == json_format.MessageToDict(ours)
    _fill(theirs)
    back = pb.message(name).FromString(theirs.SerializeToString())
    assert json_format.MessageToDict(back) == json_format.MessageToDict(theirs)
    assert json_format.MessageToDict(ours) or not ours.DESCRIPTOR.fields  # something was filled


def test_the_service_and_its_calls_are_the_protocols():
    service = service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    assert pb.SERVICE == service.full_name
    ours = pb.message("ModelInferRequest").DESCRIPTOR.file.services_by_name["GRPCInferenceService"]
    for name, (request, response) in CALLS.items():
        method, own = service.methods_by_name[name], ours.methods_by_name[name]
        assert (method.input_type.name, method.output_type.name) == (request, response)
        assert (own.input_type.name, own.output_type.name) == (request, response)
        assert (own.client_streaming, own.server_streaming) == (method.client_streaming, method.server_streaming)


def _request(**parameters) -> object:
    request = pb.ModelInferRequest(model_name="m", id="r")
    for key, (kind, value) in parameters.items():
        setattr(request.parameters[key], kind, value)
    return request


def test_parameters_inputs_and_outputs_become_the_rest_body():
    request = _request(sequence_id=("string_param", "s-1"), sequence_start=("bool_param", True),
                       seed=("uint64_param", 2 ** 63), epsilon=("double_param", 0.1))
    raw = request.inputs.add(name="obs", datatype="FP32", shape=[2, 3])
    request.raw_input_contents.append(np.arange(6, dtype="<f4").tobytes())
    request.outputs.add(name="logp")
    body, data = request_of(request)
    assert body.parameters == {"sequence_id": "s-1", "sequence_start": True, "seed": 2 ** 63, "epsilon": 0.1}
    assert body.id == "r" and [o.name for o in body.outputs] == ["logp"]
    assert body.inputs[0].parameters == {"binary_data_size": 24} and raw.name == body.inputs[0].name
    np.testing.assert_array_equal(data.restart().read(body.inputs[0], ANY_ROWS),
                                  np.arange(6, dtype=np.float32).reshape(2, 3))

    typed = pb.ModelInferRequest(model_name="m")
    tensor = typed.inputs.add(name="mask", datatype="BOOL", shape=[1, 2])
    tensor.contents.bool_contents.extend([True, False])
    body, data = request_of(typed)
    assert body.inputs[0].data == [True, False] and body.id is not None
    assert data.restart().read(body.inputs[0], ANY_ROWS).tolist() == [[True, False]]


@pytest.mark.parametrize("break_it, names", [
    (lambda r: r.parameters["explore"].SetInParent(), "parameters.explore"),
    (lambda r: r.raw_input_contents.append(b"x"), "raw_input_contents"),
    (lambda r: r.inputs[0].shape.__setitem__(0, -1), "inputs"),
    (lambda r: r.inputs[0].contents.fp32_contents.append(1.0), "obs.contents"),
])
def test_a_malformed_request_is_refused_naming_the_field(break_it, names):
    request = pb.ModelInferRequest(model_name="m")
    request.inputs.add(name="obs", datatype="FP32", shape=[1, 1])
    request.raw_input_contents.append(np.zeros(1, "<f4").tobytes())
    break_it(request)
    with pytest.raises(BadRequest) as info:
        request_of(request)
    assert names in (info.value.field or "")


def test_typed_contents_must_be_the_datatypes_field():
    request = pb.ModelInferRequest(model_name="m")
    tensor = request.inputs.add(name="obs", datatype="FP32", shape=[1])
    tensor.contents.int_contents.append(1)
    with pytest.raises(BadRequest, match="fp32_contents"):
        request_of(request)
    tensor.datatype = "FP16"
    with pytest.raises(BadRequest, match="raw_input_contents"):
        request_of(request)


def test_outputs_are_raw_little_endian_in_the_requested_order():
    request = pb.ModelInferRequest(model_name="m", id="x")
    response = response_of(request, "m", "2", [("action", "INT64", np.array([3, 1]), False),
                                               ("dist_inputs", "FP32", np.array([[0.5, 1.0], [2.0, -1.0]]), True)])
    assert (response.model_name, response.model_version, response.id) == ("m", "2", "x")
    assert [(o.name, o.datatype, list(o.shape)) for o in response.outputs] == [
        ("action", "INT64", [2]), ("dist_inputs", "FP32", [2, 2])]
    assert np.frombuffer(response.raw_output_contents[0], "<i8").tolist() == [3, 1]
    assert np.frombuffer(response.raw_output_contents[1], "<f4").tolist() == [0.5, 1.0, 2.0, -1.0]


@pytest.mark.parametrize("status, code", [(400, grpc.StatusCode.INVALID_ARGUMENT), (404, grpc.StatusCode.NOT_FOUND),
                                          (409, grpc.StatusCode.FAILED_PRECONDITION),
                                          (410, grpc.StatusCode.FAILED_PRECONDITION),
                                          (422, grpc.StatusCode.INVALID_ARGUMENT), (503, grpc.StatusCode.UNAVAILABLE),
                                          (500, grpc.StatusCode.INTERNAL)])
def test_refusals_map_to_status_codes(status, code):
    error = type("Refusal", (ServiceError,), {"status": status, "code": "x"})("why")
    assert code_of(error) == code


def test_only_a_conflict_a_retry_may_clear_is_aborted():
    # ABORTED means "retry": a step index that does not fit answered it, and a client's
    # retry loop then resent the same refused step for ever.
    busy = SessionBusy("session 's' was changed elsewhere while this step ran; retry it")
    assert busy.status == 409 and busy.code == "session_conflict"  # REST answers it as before
    assert code_of(busy) == grpc.StatusCode.ABORTED
    assert code_of(SessionConflict("this request says it is step 4")) == grpc.StatusCode.FAILED_PRECONDITION
