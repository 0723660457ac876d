"""The answer: which outputs a request gets, encoded from its rows of the batch.

Outputs are the env-space action leaves (``action`` / ``action.<path>``) and the batch's
``logp``, ``value``, ``entropy``, ``dist_inputs`` and a Q-policy's ``q_values``, each as inline JSON ``data`` or as
binary data after the JSON header (``binary_data``). A ``sequence_end`` request ends its
session here, once its step was served.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np

from rlserve.service.act.use_case import Accepted, ActService
from rlserve.service.engine.batcher import BatchInfo
from rlserve.service.errors import BadRequest, quoted
from rlserve.service.protocols.kserve_v2.layout import Layout
from rlserve.service.protocols.kserve_v2.tensors import write_output
from rlserve.service.protocols.kserve_v2.wire import (
    ENCODER,
    InferRequest,
    InferResponse,
)
from rlserve.service.step import columns
from rlserve.service.step.kept import KeptAnswer
from rlserve.service.step.output import StepOutput

_JSON = [(b"content-type", b"application/json")]


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


# (kind "action" or "score", leaf index, name, binary)
Output = tuple[str, int, str, bool]


def plan_outputs(req: InferRequest, layout: Layout, binary_default: bool) -> list[Output]:
    """The outputs a request gets, in its order: every default output when it names none
    (the protocol's rule), else exactly those named; each binary or inline."""
    action_index = layout.action_index

    def planned(name: str, binary: bool) -> Output:
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
                raise BadRequest(f"output '{out.name}': unknown parameter {quoted(key)}{hint}",
                                 field=f"outputs.{out.name}.parameters.{key}", expected=["binary_data"], received=key)
        plan.append(planned(out.name, binary))
    return plan


class Answerer:
    """What an accepted request's answer needs once its batch ran."""

    __slots__ = ("act", "layout", "outputs", "request_id", "end")

    def __init__(self, act: ActService, layout: Layout, outputs: list[Output], request_id: Any, end: bool):
        self.act, self.layout, self.outputs, self.request_id, self.end = act, layout, outputs, request_id, end

    def encode(self, accepted: Accepted, output: StepOutput | KeptAnswer, info: BatchInfo) -> Answer:
        """The request's outputs from its rows of the batch, or, for a retried step
        (``parameters.step``), from the answer kept when it was first served."""
        policy = accepted.policy
        blobs: list[bytes] = []
        written = [write_output(name, arr, datatype, binary, blobs)
                   for name, datatype, arr, binary in self.tensors(accepted, output)]
        response = InferResponse(model_name=policy.name, model_version=policy.version, outputs=written,
                                 id=self.request_id)
        header = ENCODER.encode(response)
        self.finish(accepted, "infer")
        if not blobs:
            return Answer(header)
        return Answer(b"".join([header, *blobs]), len(header))

    def tensors(self, accepted: Accepted, output: StepOutput | KeptAnswer) -> list[tuple[str, str, np.ndarray, bool]]:
        """(name, datatype, array, binary) of each output the request gets, in its order."""
        scores = _kept_scores(output) if isinstance(output, KeptAnswer) else _batch_scores(output)
        actions: list[np.ndarray] | None = None
        tensors = []
        for kind, index, name, binary in self.outputs:
            spec = self.layout.outputs[name]
            if kind == "action":
                if actions is None:
                    actions = columns.action_columns(self.layout.action_space, _served(accepted, output))
                arr = actions[index]
            else:
                rows = scores(name)
                if rows is None:  # undefined for this distribution (Deterministic logp, ...) or not kept
                    continue
                arr = rows.reshape(rows.shape[0], *spec.shape)
            tensors.append((name, spec.datatype, arr, binary))
        return tensors

    def finish(self, accepted: Accepted, route: str) -> None:
        """Once the answer is built: a ``sequence_end`` ends its session; latency observed."""
        if self.end:
            _end_sequence(accepted)
        self.act.observe_latency(accepted, route)


def _batch_scores(output: StepOutput) -> Callable[[str], np.ndarray | None]:
    arrays, start, stop = output.batch.arrays, output.start, output.stop

    def rows(name: str) -> np.ndarray | None:
        full = arrays.get(name)
        return None if full is None else full[start:stop]
    return rows


def _kept_scores(kept: KeptAnswer) -> Callable[[str], np.ndarray | None]:
    """A kept answer's JSON values (what the first answer was built from) as one-row
    arrays; a Q-policy's q_values are its dist_inputs. JSON nulls were NaN."""
    _, _, logp, value, entropy, dist_inputs = kept.answer
    values = {"logp": logp, "value": value, "entropy": entropy, "dist_inputs": dist_inputs, "q_values": dist_inputs}

    def rows(name: str) -> np.ndarray | None:
        kept_value = values.get(name)
        if kept_value is None:
            return None
        arr = np.array([kept_value], dtype=object)
        return np.where(arr == None, np.nan, arr).astype(np.float64)  # noqa: E711 (elementwise)
    return rows


def _served(accepted: Accepted, output: StepOutput | KeptAnswer) -> Any:
    """The request's model-space actions as served (unsquashed / clipped when asked)."""
    pipeline = accepted.policy.pipeline
    actions = output.raw_actions if isinstance(output, KeptAnswer) else output.actions()
    if accepted.unsquash:
        actions = pipeline.unsquash(actions)
    if accepted.clip:
        actions = pipeline.clip(actions)
    return actions


def _end_sequence(accepted: Accepted) -> None:
    """sequence_end: the step was served; end its session (a later sequence_start with the
    same id starts a new one). Already gone (ended meanwhile) is fine."""
    if accepted.bound is not None:
        accepted.bound.end()
