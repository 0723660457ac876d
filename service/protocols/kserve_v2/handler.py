"""The infer use case: a protocol request -> ``Rows`` -> ``ActService`` -> a protocol answer.

    split body (JSON header | binary data) ─► decode header ─► parameters ─► which policy
      ─► tensors (read, shape-checked) ─► columns (validated per leaf) ─► Rows
      ─► ActService.accept_rows (sessions, Preparer, batcher capacity) ─► batch
      ─► outputs (JSON data or binary) ─► sequence_end ends the session

Everything up to ``accept_rows`` raises before any session changed. The batch, sessions,
runtime and validation after the tensors are the JSON API's own (``ActService``), so a
protocol request and a JSON request can share one batch.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np

from rlserve.service.act.use_case import Accepted, ActService
from rlserve.service.errors import BadRequest, ServiceError
from rlserve.service.protocols.kserve_v2.layout import (
    EXTRAS,
    MASK,
    PREV_ACTION,
    REWARD,
    Layout,
    layout_of,
)
from rlserve.service.protocols.kserve_v2.tensors import read_input, write_output
from rlserve.service.protocols.kserve_v2.wire import (
    ENCODER,
    INFER_DECODER,
    InferRequest,
    InferResponse,
    InferResponseOutput,
    Parameter,
)
from rlserve.service.serving.batcher import BatchInfo
from rlserve.service.serving.policy import Policy
from rlserve.service.serving.registry import ModelEntry
from rlserve.service.step import columns
from rlserve.service.step.batch import StepOutput
from rlserve.service.step.rows import Rows

MAX_SEQUENCE_ID = 2 ** 64 - 1  # the sequence extension's uint64
_JSON = [(b"content-type", b"application/json")]
_EMPTY = memoryview(b"")
# Request parameters: rlserve's options, the sequence and binary extensions' own, and
# Triton scheduling hints that have no meaning here (accepted, ignored).
_BOOL_PARAMETERS = ("explore", "clip_actions", "unsquash_actions", "sequence_start", "sequence_end",
                    "binary_data_output")
_IGNORED_PARAMETERS = ("priority", "timeout")
KNOWN_PARAMETERS = (*_BOOL_PARAMETERS, "seed", "sequence_id", *_IGNORED_PARAMETERS)


@dataclass(frozen=True, slots=True)
class Answer:
    """A response body; ``json_length`` is the JSON header's size when binary data follows."""

    body: bytes
    json_length: int | None = None

    def headers(self) -> list[tuple[bytes, bytes]]:
        if self.json_length is None:
            return _JSON
        return [(b"content-type", b"application/octet-stream"),
                (b"inference-header-content-length", b"%d" % self.json_length)]


@dataclass(slots=True)
class _Options:
    explore: bool | None = None
    seed: int | None = None
    clip: bool = False
    unsquash: bool = False
    session_id: str | None = None
    start: bool = False
    end: bool = False
    binary_output: bool = False


# --------------------------------------------------------------------------- request parsing

def split_body(body: bytes, header_length: str | None) -> tuple[bytes, memoryview]:
    """(JSON header, binary data after it) by the Inference-Header-Content-Length header."""
    if header_length is None:
        return body, _EMPTY
    text = header_length.strip()
    if not text.isdigit() or not 0 < int(text) <= len(body):
        raise BadRequest(f"Inference-Header-Content-Length must be the JSON header's size in bytes, at most the "
                         f"body's {len(body)}", field="Inference-Header-Content-Length",
                         expected=f"an integer in [1, {len(body)}]", received=header_length)
    size = int(text)
    return body[:size], memoryview(body)[size:]


def decode_request(header: bytes) -> InferRequest:
    if not header:
        raise BadRequest("empty request body; expected an inference request JSON object",
                         expected="a JSON object with 'inputs'", received="an empty body")
    try:
        return INFER_DECODER.decode(header)
    except msgspec.ValidationError as exc:
        text = str(exc)
        where = text.rsplit(" - at `$", 1)
        field = where[1].rstrip("`").lstrip(".") if len(where) == 2 else None
        raise BadRequest(f"invalid inference request: {text}", field=field,
                         expected="the Open Inference Protocol's $inference_request", received=where[0]) from None
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise BadRequest(f"the inference request is not valid JSON: {exc}",
                         expected="a UTF-8 JSON object (binary data only after Inference-Header-Content-Length)",
                         received=f"{len(header)} bytes that do not parse") from None


def _flag(parameters: dict[str, Parameter], name: str) -> bool:
    value = parameters.get(name, False)
    if type(value) is not bool:
        raise BadRequest(f"parameters.{name} must be a boolean", field=f"parameters.{name}", expected="true or false",
                         received=value)
    return value


def parse_parameters(parameters: dict[str, Parameter]) -> _Options:
    options = _Options()
    if not parameters:
        return options
    unknown = sorted(set(parameters) - set(KNOWN_PARAMETERS))
    if unknown:
        raise BadRequest(f"unknown request parameter(s) {unknown}", field=f"parameters.{unknown[0]}",
                         expected=list(KNOWN_PARAMETERS), received=unknown)
    if "explore" in parameters:
        options.explore = _flag(parameters, "explore")
    options.clip = _flag(parameters, "clip_actions")
    options.unsquash = _flag(parameters, "unsquash_actions")
    options.start = _flag(parameters, "sequence_start")
    options.end = _flag(parameters, "sequence_end")
    options.binary_output = _flag(parameters, "binary_data_output")
    options.session_id = _sequence_id(parameters.get("sequence_id", 0))
    seed = parameters.get("seed")
    if seed is not None:
        if type(seed) is not int or seed < 0:
            raise BadRequest("parameters.seed must be a non-negative integer", field="parameters.seed",
                             expected="an integer >= 0", received=seed)
        if not options.start:
            raise BadRequest("parameters.seed seeds a sequence's sampler when it starts; send it with "
                             "sequence_id and sequence_start=true", field="parameters.seed",
                             expected="sequence_start=true with a seed", received=seed)
        options.seed = seed
    for name in ("sequence_start", "sequence_end"):
        if getattr(options, name.removeprefix("sequence_")) and options.session_id is None:
            raise BadRequest(f"parameters.{name} needs a sequence: set parameters.sequence_id (a non-zero integer "
                             "or a non-empty string)", field="parameters.sequence_id",
                             expected="a non-zero sequence_id", received=parameters.get("sequence_id"))
    return options


def _sequence_id(value: Parameter) -> str | None:
    """The session id of a sequence id (int or string; 0 and "" mean no sequence). The
    integer 7 and the string "7" name the same session, also on the JSON API."""
    if type(value) is int and 0 <= value <= MAX_SEQUENCE_ID:
        return str(value) if value else None
    if type(value) is str:
        return value or None
    raise BadRequest("parameters.sequence_id must be an unsigned 64-bit integer or a string",
                     field="parameters.sequence_id", expected=f"an integer in [0, {MAX_SEQUENCE_ID}] or a string",
                     received=value)


# --------------------------------------------------------------------------- the use case

class InferService:
    """The protocol's infer, on the JSON API's ``ActService``."""

    def __init__(self, act: ActService):
        self.act = act
        self.registry = act.registry

    def infer_nowait(self, name: str, version: str | None, header_length: str | None, body: bytes,
                     reply: Callable[[Answer | None, ServiceError | None], None]) -> None:
        """Refusals raise here, at once; the answer (or a batch's error) goes to ``reply``."""
        accepted, call = self._accept(name, version, header_length, body)
        self.act.submit_nowait(accepted, call.encode, reply)

    async def infer(self, name: str, version: str | None, header_length: str | None, body: bytes) -> Answer:
        accepted, call = self._accept(name, version, header_length, body)
        output, info = await self.act.submit(accepted)
        return call.encode(accepted, output, info)

    def _accept(self, name: str, version: str | None, header_length: str | None,
                body: bytes) -> tuple[Accepted, _Call]:
        started = time.perf_counter()
        header, binary = split_body(body, header_length)
        req = decode_request(header)
        entry = self.registry.entry(name)
        version = _version(req, name, version)
        options = parse_parameters(req.parameters)
        layout = layout_of(_target(entry, version, options))
        tensors, batch = _read_inputs(req, binary, layout)
        rows = _rows(layout, tensors, batch, options)
        outputs = _plan_outputs(req, layout, options.binary_output)
        extras = frozenset(spec_name for _, _, spec_name, _ in outputs if spec_name in EXTRAS)
        accepted = self.act.accept_rows(name, version, rows, explore=options.explore, extras=extras,
                                        unsquash=options.unsquash, clip=options.clip, started=started)
        return accepted, _Call(self.act, layout, outputs, req.id, options.end)


def _version(req: InferRequest, name: str, version: str | None) -> str | None:
    if req.model_name is not msgspec.UNSET and req.model_name != name:
        raise BadRequest(f"model_name {req.model_name!r} in the body differs from {name!r} in the URL",
                         field="model_name", expected=name, received=req.model_name)
    if req.model_version is msgspec.UNSET or req.model_version == "":
        return version
    if version is not None and req.model_version != version:
        raise BadRequest(f"model_version {req.model_version!r} in the body differs from {version!r} in the URL",
                         field="model_version", expected=version, received=req.model_version)
    return req.model_version


def _target(entry: ModelEntry, version: str | None, options: _Options) -> Policy:
    """The version whose tensors the request must match: a live sequence's own version
    (ActService checks it against a pinned one), else the pinned or current one."""
    session_id = options.session_id
    if session_id is not None and (not options.start or entry.is_live(session_id)):
        return entry.find_session(session_id)[0]
    return entry.policy(version)


def _read_inputs(req: InferRequest, binary: memoryview, layout: Layout) -> tuple[dict[str, np.ndarray], int]:
    """Every input as an array (B, *row shape), checked against the layout's tensors."""
    tensors: dict[str, np.ndarray] = {}
    batch: int | None = None
    offset = 0
    for inp in req.inputs:
        known = layout.inputs.get(inp.name)
        if known is None:
            raise BadRequest(f"unknown input '{inp.name}'; this model takes {list(layout.inputs)}",
                             field=inp.name, expected=list(layout.inputs), received=inp.name)
        if inp.name in tensors:
            raise BadRequest(f"input '{inp.name}' is given twice", field=inp.name, expected="each input once",
                             received=inp.name)
        spec = known[2]
        arr, offset = read_input(inp, binary, offset)
        if arr.ndim and not spec.shape and arr.shape[1:] == (1,):
            arr = arr.reshape(arr.shape[0])  # [B, 1] for a scalar per row
        if arr.ndim == 0 or arr.shape[1:] != spec.shape:
            raise BadRequest(f"input '{inp.name}': shape {inp.shape} does not match {[-1, *spec.shape]} "
                             "(the first dimension is the batch)", field=inp.name,
                             expected=[-1, *spec.shape], received=inp.shape)
        if batch is None:
            batch = arr.shape[0]
        elif arr.shape[0] != batch:
            raise BadRequest(f"input '{inp.name}' has {arr.shape[0]} rows, the inputs before it {batch}; every "
                             "input's first dimension is the same batch", field=inp.name, expected=batch,
                             received=arr.shape[0])
        tensors[inp.name] = arr
    if offset != len(binary):
        raise BadRequest(f"{len(binary) - offset} bytes of binary data follow the inputs' binary data "
                         f"({offset} bytes); check binary_data_size and Inference-Header-Content-Length",
                         field="Inference-Header-Content-Length", expected=offset, received=len(binary))
    missing = [spec.name for spec in layout.obs if spec.name not in tensors]
    if missing:
        raise BadRequest(f"missing input(s) {missing}: the observation is required",
                         field=missing[0], expected=[s.name for s in layout.obs], received=sorted(tensors))
    assert batch is not None  # the observation is there
    if batch == 0:
        raise BadRequest(f"input '{layout.obs[0].name}' has no rows", field=layout.obs[0].name,
                         expected="a batch of at least one row", received=0)
    return tensors, batch


def _rows(layout: Layout, tensors: dict[str, np.ndarray], batch: int, options: _Options) -> Rows:
    """The request as ``Rows`` with observations decoded (``Rows.decoded``); the rest goes
    through the JSON API's own checks in ``Preparer``."""
    obs = [columns.decode_column(spec.leaf, tensors[spec.name], spec.name) for spec in layout.obs]
    none: list[Any] = [None] * batch
    session_id = options.session_id
    if session_id is not None and batch != 1:
        raise BadRequest(f"a sequence steps one row at a time, but '{layout.obs[0].name}' has {batch} rows",
                         field=layout.obs[0].name, expected="1 row with sequence_id", received=batch)
    mask = tensors.get(MASK)
    reward = tensors.get(REWARD)
    prev = [tensors[spec.name] for spec in layout.prev_action if spec.name in tensors]
    if prev and len(prev) != len(layout.prev_action):
        names = [spec.name for spec in layout.prev_action]
        raise BadRequest(f"a previous action needs every one of {names}", field=PREV_ACTION, expected=names,
                         received=[n for n in names if n in tensors])
    return Rows(
        single=batch == 1,
        observations=columns.observations_from_columns(layout.obs_space, obs),
        session_ids=[session_id] if session_id is not None else none,
        episode_starts=[options.start] if session_id is not None else [False] * batch,
        rewards=none if reward is None else reward.astype(np.float64).tolist(),
        prev_actions=[msgspec.UNSET] * batch if not prev else columns.values_from_columns(layout.action_space, prev),
        action_masks=none if mask is None else mask.tolist(),
        seeds=[options.seed] if session_id is not None else none,
        has_sessions=session_id is not None,
        has_rewards=reward is not None,
        has_prev_actions=bool(prev),
        has_masks=mask is not None,
        decoded=True,
    )


# (kind "action" or "score", leaf index, name, binary)
_Output = tuple[str, int, str, bool]


def _plan_outputs(req: InferRequest, layout: Layout, binary_default: bool) -> list[_Output]:
    action_index = {spec.name: i for i, spec in enumerate(layout.action)}

    def planned(name: str, binary: bool) -> _Output:
        if name in action_index:
            return ("action", action_index[name], name, binary)
        return ("score", 0, name, binary)

    if req.outputs is msgspec.UNSET:
        return [planned(name, binary_default) for name in layout.default_outputs]
    plan, seen = [], set()
    for out in req.outputs:
        if out.name not in layout.outputs:
            raise BadRequest(f"unknown output '{out.name}'; this model produces {list(layout.outputs)}",
                             field=f"outputs.{out.name}", expected=list(layout.outputs), received=out.name)
        if out.name in seen:
            raise BadRequest(f"output '{out.name}' is requested twice", field=f"outputs.{out.name}",
                             expected="each output once", received=out.name)
        seen.add(out.name)
        binary = binary_default
        for key, value in out.parameters.items():
            if key == "binary_data":
                if type(value) is not bool:
                    raise BadRequest(f"output '{out.name}': binary_data must be a boolean",
                                     field=f"outputs.{out.name}.parameters.binary_data", expected="true or false",
                                     received=value)
                binary = value
            else:
                hint = " (the classification extension is not supported)" if key == "classification" else ""
                raise BadRequest(f"output '{out.name}': unknown parameter {key!r}{hint}",
                                 field=f"outputs.{out.name}.parameters.{key}", expected=["binary_data"], received=key)
        plan.append(planned(out.name, binary))
    return plan


class _Call:
    """What an accepted request's answer needs once its batch ran."""

    __slots__ = ("act", "layout", "outputs", "request_id", "end")

    def __init__(self, act: ActService, layout: Layout, outputs: list[_Output], request_id: Any, end: bool):
        self.act, self.layout, self.outputs, self.request_id, self.end = act, layout, outputs, request_id, end

    def encode(self, accepted: Accepted, output: StepOutput, info: BatchInfo) -> Answer:
        policy = accepted.policy
        start, stop = output.start, output.stop
        arrays = output.batch.arrays
        actions: list[np.ndarray] | None = None
        blobs: list[bytes] = []
        written: list[InferResponseOutput] = []
        for kind, index, name, binary in self.outputs:
            spec = self.layout.outputs[name]
            if kind == "action":
                if actions is None:
                    actions = columns.action_columns(self.layout.action_space, _served(accepted, output))
                arr = actions[index]
            else:
                full = arrays.get(name)
                if full is None:  # undefined for this distribution (Deterministic logp, ...)
                    continue
                arr = full[start:stop].reshape(stop - start, *spec.shape)
            written.append(write_output(name, arr, spec.datatype, binary, blobs))
        response = InferResponse(model_name=policy.name, model_version=policy.version, outputs=written,
                                 id=self.request_id)
        header = ENCODER.encode(response)
        if self.end:
            _end_sequence(accepted)
        self.act.observe_latency(accepted, "infer")
        if not blobs:
            return Answer(header)
        return Answer(b"".join([header, *blobs]), len(header))


def _served(accepted: Accepted, output: StepOutput) -> Any:
    """The request's model-space actions as served (unsquashed / clipped when asked)."""
    actions = output.actions()
    pipeline = accepted.policy.pipeline
    if accepted.unsquash:
        actions = pipeline.unsquash(actions)
    if accepted.clip:
        actions = pipeline.clip(actions)
    return actions


def _end_sequence(accepted: Accepted) -> None:
    """sequence_end: the step was served; end its session (a later sequence_start with the
    same id starts a new one). Already gone (ended meanwhile) is fine."""
    session = accepted.sessions[0]
    if session is None or session.ended:
        return
    try:
        accepted.policy.sessions.end(session.id)
    except ServiceError:
        pass
