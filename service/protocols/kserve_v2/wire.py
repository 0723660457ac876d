"""The protocol's JSON objects as msgspec structs (fast decode, and their OpenAPI schemas).

Names follow the Open Inference Protocol's REST specification: ``$inference_request``,
``$request_input``, ``$request_output``, ``$inference_response``, ``$response_output``,
the metadata and health objects, and the error object ``{"error": "<message>"}``. The
binary tensor data extension only adds parameters (``binary_data_size``,
``binary_data``, ``binary_data_output``) and a header, so it needs no struct of its own.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

# A parameter value is a string, a number or a boolean.
Parameter = str | int | float | bool
Parameters = dict[str, Parameter]
Dim = Annotated[int, msgspec.Meta(ge=0, le=2 ** 63 - 1)]
Name = Annotated[str, msgspec.Meta(min_length=1, max_length=256)]


class InferRequestInput(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """One input tensor: its data inline (``data``, row-major, nested or flat) or, with the
    binary extension, ``parameters.binary_data_size`` bytes after the JSON header."""

    name: Name
    shape: list[Dim]
    datatype: str
    parameters: Parameters = {}
    data: Any = msgspec.UNSET


class InferRequestOutput(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """An output asked for by name; ``parameters.binary_data`` picks its encoding."""

    name: Name
    parameters: Parameters = {}


class InferRequest(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """The inference request. ``parameters`` carries rlserve's request options (explore,
    seed, epsilon, clip_actions, unsquash_actions) and the sequence extension's (sequence_id,
    sequence_start, sequence_end); ``outputs`` absent means every default output."""

    inputs: list[InferRequestInput]
    id: str | msgspec.UnsetType = msgspec.UNSET
    parameters: Parameters = {}
    outputs: list[InferRequestOutput] | msgspec.UnsetType = msgspec.UNSET
    # Some clients repeat the URL's model in the body; when given it must agree.
    model_name: str | msgspec.UnsetType = msgspec.UNSET
    model_version: str | msgspec.UnsetType = msgspec.UNSET


class InferResponseOutput(msgspec.Struct, omit_defaults=True):
    """One output tensor: ``data`` (flat, row-major) or ``parameters.binary_data_size``
    bytes after the JSON header, in the order of ``outputs``."""

    name: str
    datatype: str
    shape: list[int]
    parameters: Parameters | msgspec.UnsetType = msgspec.UNSET
    data: list[Any] | msgspec.UnsetType = msgspec.UNSET


class InferResponse(msgspec.Struct, omit_defaults=True):
    model_name: str
    model_version: str
    outputs: list[InferResponseOutput]
    id: str | msgspec.UnsetType = msgspec.UNSET


class MetadataTensor(msgspec.Struct):
    """A tensor of the model metadata; ``-1`` marks the batch dimension."""

    name: str
    datatype: str
    shape: list[int]


class ModelMetadataResponse(msgspec.Struct, omit_defaults=True):
    name: str
    versions: list[str]
    platform: str
    inputs: list[MetadataTensor]
    outputs: list[MetadataTensor]
    # rlserve's additions: which inputs are optional and which outputs are sent when a
    # request names none.
    parameters: dict[str, Any] | msgspec.UnsetType = msgspec.UNSET


class ServerMetadataResponse(msgspec.Struct):
    name: str
    version: str
    extensions: list[str]


class ServerLiveResponse(msgspec.Struct):
    live: bool


class ServerReadyResponse(msgspec.Struct):
    ready: bool


class ModelReadyResponse(msgspec.Struct):
    name: str
    ready: bool


class InferErrorResponse(msgspec.Struct):
    """Every refusal on the protocol's routes."""

    error: str


INFER_DECODER = msgspec.json.Decoder(InferRequest)
ENCODER = msgspec.json.Encoder()
