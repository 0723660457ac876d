"""The infer use case: a protocol request -> ``Rows`` -> ``ActService`` -> a protocol answer.

    split body (JSON header | binary data) ─► decode header ─► parameters ─► which policy
      ─► tensors (read, shape-checked) ─► columns (validated per leaf) ─► Rows
      ─► ActService.accept_rows (sessions, Preparer, batcher capacity) ─► batch
      ─► outputs (JSON data or binary) ─► sequence_end ends the session

Everything up to ``accept_rows`` raises before any session changed. The batch, sessions,
runtime and validation after the tensors are the JSON API's own (``ActService``), so a
protocol request and a JSON request can share one batch.

Under an external session store a sequence this process does not hold (after a restart,
or stepped by another replica) makes the lookup raise ``SessionMiss``; the request is then
read from the store and accepted again, from its bytes, exactly as the JSON API's act does
(``after_loading``; ``infer_nowait`` does it in a task through ``ActService.accept_later``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

import msgspec
import numpy as np

from rlserve.service.act.use_case import Accepted, ActService, Encode
from rlserve.service.engine.batcher import BatchInfo
from rlserve.service.errors import BadRequest, ServiceError, quoted
from rlserve.service.protocols.kserve_v2.layout import (
    EXTRAS,
    MASK,
    PREV_ACTION,
    REWARD,
    Layout,
    layout_of,
)
from rlserve.service.protocols.kserve_v2.request import (
    Options,
    decode_request,
    parse_parameters,
    split_body,
)
from rlserve.service.protocols.kserve_v2.response import Answer, Answerer, plan_outputs
from rlserve.service.protocols.kserve_v2.tensors import read_input
from rlserve.service.protocols.kserve_v2.wire import InferRequest, InferRequestInput
from rlserve.service.serving.policy import Policy
from rlserve.service.serving.registry import ModelEntry
from rlserve.service.sessions.base import SessionMiss, after_loading
from rlserve.service.step import columns
from rlserve.service.step.kept import KeptAnswer
from rlserve.service.step.output import StepOutput
from rlserve.service.step.rows import Rows
from rlserve.service.step.sizes import Expect


class InferService:
    """The protocol's infer, on the JSON API's ``ActService``."""

    def __init__(self, act: ActService):
        self.act = act
        self.registry = act.registry

    def infer_nowait(self, name: str, version: str | None, header_length: str | None, body: bytes,
                     reply: Callable[[Answer | None, ServiceError | None], None]) -> None:
        """Refusals raise here, at once; the answer (or a batch's error) goes to ``reply``
        (refusals too, when the sequence had to be read from the external store first)."""
        started = time.perf_counter()

        def accept() -> tuple[Accepted, Encode]:
            accepted, call = self._accept(name, version, header_length, body, started)
            return accepted, call.encode

        try:
            accepted, encode = accept()
        except SessionMiss as miss:  # rare (a restart, a failover): a task waits for the store
            self.act.accept_later(miss, accept, reply)
            return
        self.act.submit_nowait(accepted, encode, reply)

    async def infer(self, name: str, version: str | None, header_length: str | None, body: bytes) -> Answer:
        started = time.perf_counter()
        accepted, call, output, info = await self._served(
            lambda: self._accept(name, version, header_length, body, started))
        return call.encode(accepted, output, info)

    async def infer_message(self, name: str, version: str | None, req: InferRequest,
                            data: InputData) -> tuple[Accepted, Answerer, StepOutput | KeptAnswer]:
        """A request decoded elsewhere (the gRPC service's) with its binary data: the
        accepted request, its answerer and its rows of the batch (or its kept answer)."""
        started = time.perf_counter()
        accepted, call, output, _ = await self._served(
            lambda: self._accept_request(name, version, req, data, started))
        return accepted, call, output

    async def _served(self, accept: Callable[[], tuple[Accepted, Answerer]]) -> tuple[
            Accepted, Answerer, StepOutput | KeptAnswer, BatchInfo]:
        """Accept (after reading the sequence from the store, when it is not held here)
        and wait for the batch."""
        try:
            accepted, call = accept()
        except SessionMiss as miss:
            accepted, call = await after_loading(miss, accept)
        output, info = await self.act.submit(accepted)
        return accepted, call, output, info

    def _accept(self, name: str, version: str | None, header_length: str | None, body: bytes,
                started: float) -> tuple[Accepted, Answerer]:
        """Decode and accept the request; raises (``SessionMiss`` included) before any
        session changed, so it can be called again from the same bytes."""
        header, binary = split_body(body, header_length)
        return self._accept_request(name, version, decode_request(header), AfterHeader(binary), started)

    def _accept_request(self, name: str, version: str | None, req: InferRequest, data: InputData,
                        started: float) -> tuple[Accepted, Answerer]:
        entry = self.registry.entry(name)
        version = _version(req, name, version)
        options = parse_parameters(req.parameters)
        layout = layout_of(_target(entry, version, options))
        tensors, batch = _read_inputs(req, data.restart(), layout, self.act.max_rows)
        rows = _rows(layout, tensors, batch, options)
        outputs = plan_outputs(req, layout, options.binary_output)
        extras = frozenset(spec_name for _, _, spec_name, _ in outputs if spec_name in EXTRAS)
        accepted = self.act.accept_rows(name, version, rows, explore=options.explore, extras=extras,
                                        unsquash=options.unsquash, clip=options.clip, started=started,
                                        epsilon=options.epsilon, step=options.step)
        return accepted, Answerer(self.act, layout, outputs, req.id, options.end)


def _version(req: InferRequest, name: str, version: str | None) -> str | None:
    if req.model_name is not msgspec.UNSET and req.model_name != name:
        raise BadRequest(f"model_name {quoted(req.model_name)} in the body differs from {quoted(name)} in the URL",
                         field="model_name", expected=name, received=req.model_name)
    if req.model_version is msgspec.UNSET or req.model_version == "":
        return version
    if version is not None and req.model_version != version:
        raise BadRequest(f"model_version {quoted(req.model_version)} in the body differs from {quoted(version)} "
                         "in the URL",
                         field="model_version", expected=version, received=req.model_version)
    return req.model_version


def _target(entry: ModelEntry, version: str | None, options: Options) -> Policy:
    """The version whose tensors the request must match: a live sequence's own version
    (ActService checks it against a pinned one), else the pinned or current one."""
    bound = entry.sessions.target_version(options.session_id, options.start)
    return entry.policy(version if bound is None else bound)


class InputData(Protocol):
    """Where the inputs' binary data comes from (inline ``data`` needs none)."""

    def restart(self) -> InputData:
        """Ready to read from the first input (a request may be accepted twice)."""

    def read(self, inp: InferRequestInput, expect: Expect) -> np.ndarray:
        """The next input's tensor, shaped as sent (its declared shape held to ``expect``)."""

    def finish(self) -> None:
        """Raise if binary data is left over."""


class AfterHeader:
    """REST: the binary data after the JSON header, in the order of the inputs."""

    def __init__(self, binary: memoryview):
        self.binary, self.offset = binary, 0

    def restart(self) -> AfterHeader:
        self.offset = 0
        return self

    def read(self, inp: InferRequestInput, expect: Expect) -> np.ndarray:
        arr, self.offset = read_input(inp, self.binary, self.offset, expect)
        return arr

    def finish(self) -> None:
        if self.offset != len(self.binary):
            raise BadRequest(f"{len(self.binary) - self.offset} bytes of binary data follow the inputs' binary data "
                             f"({self.offset} bytes); check binary_data_size and Inference-Header-Content-Length",
                             field="Inference-Header-Content-Length", expected=self.offset,
                             received=len(self.binary))


def _read_inputs(req: InferRequest, data: InputData, layout: Layout,
                 max_rows: int) -> tuple[dict[str, np.ndarray], int]:
    """Every input as an array (B, *row shape), checked against the layout's tensors (the
    declared shapes before anything is read: ``read_input``)."""
    tensors: dict[str, np.ndarray] = {}
    batch: int | None = None
    for inp in req.inputs:
        known = layout.inputs.get(inp.name)
        if known is None:
            raise BadRequest(f"unknown input '{inp.name}'; this model takes {list(layout.inputs)}",
                             field=inp.name, expected=list(layout.inputs), received=inp.name)
        if inp.name in tensors:
            raise BadRequest(f"input '{inp.name}' is given twice", field=inp.name, expected="each input once",
                             received=inp.name)
        spec = known[2]
        rows = (spec.shape, (1,)) if not spec.shape else (spec.shape,)  # a scalar per row: [B] or [B, 1]
        arr = data.read(inp, Expect(max_rows, rows, batch=-1))
        if not spec.shape and arr.shape[1:] == (1,):
            arr = arr.reshape(arr.shape[0])  # [B, 1] for a scalar per row
        if batch is None:
            batch = arr.shape[0]
        elif arr.shape[0] != batch:
            raise BadRequest(f"input '{inp.name}' has {arr.shape[0]} rows, the inputs before it {batch}; every "
                             "input's first dimension is the same batch", field=inp.name, expected=batch,
                             received=arr.shape[0])
        tensors[inp.name] = arr
    data.finish()
    missing = [spec.name for spec in layout.obs if spec.name not in tensors]
    if missing:
        raise BadRequest(f"missing input(s) {missing}: the observation is required",
                         field=missing[0], expected=[s.name for s in layout.obs], received=sorted(tensors))
    assert batch is not None and batch >= 1  # the observation is there, with rows (``sizes``)
    return tensors, batch


def _rows(layout: Layout, tensors: dict[str, np.ndarray], batch: int, options: Options) -> Rows:
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


