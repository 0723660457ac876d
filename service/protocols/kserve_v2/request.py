"""The request's envelope: the JSON header split from the binary data, and the parameters.

Request ``parameters`` carry rlserve's options (``explore``, ``seed``, ``epsilon``,
``clip_actions``, ``unsquash_actions``), the sequence extension's (``sequence_id``, ``sequence_start``,
``sequence_end``) and the binary extension's ``binary_data_output``; Triton's scheduling
hints (``priority``, ``timeout``) are accepted and mean nothing here. Anything else is a
400 naming the parameter.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import msgspec

from rlserve.service.act.msgspec_errors import unknown_field
from rlserve.service.act.wire import MAX_SEED
from rlserve.service.errors import BadRequest, quoted
from rlserve.service.protocols.kserve_v2.wire import INFER_DECODER, InferRequest, Parameter
from rlserve.service.step.received import non_finite_token

MAX_SEQUENCE_ID = 2 ** 64 - 1  # the sequence extension's uint64
_EMPTY = memoryview(b"")
_DIGITS = re.compile(r"[0-9]{1,20}")
_BOOL_PARAMETERS = ("explore", "clip_actions", "unsquash_actions", "sequence_start", "sequence_end",
                    "binary_data_output")
_IGNORED_PARAMETERS = ("priority", "timeout")
KNOWN_PARAMETERS = (*_BOOL_PARAMETERS, "seed", "epsilon", "sequence_id", "step", *_IGNORED_PARAMETERS)


@dataclass(slots=True)
class Options:
    """A request's parameters, checked."""

    explore: bool | None = None
    seed: int | None = None
    epsilon: float | None = None  # a Q-policy's exploration rate (None: the model's)
    clip: bool | None = None  # None: as the bundle says (RLlib's clip_actions / normalize_actions)
    unsquash: bool | None = None
    session_id: str | None = None
    start: bool = False
    end: bool = False
    binary_output: bool = False
    # The steps the sequence has answered before this one (rlserve's step index: a retried
    # step is answered again, never applied twice; rlserve.service.act.replay).
    step: int | None = None



def split_body(body: bytes, header_length: str | None) -> tuple[bytes, memoryview]:
    """(JSON header, binary data after it) by the Inference-Header-Content-Length header."""
    if header_length is None:
        return body, _EMPTY
    text = header_length.strip()
    # ASCII digits only: str.isdigit() also takes '²' or '¹', which int() then refuses.
    if _DIGITS.fullmatch(text) is None or not 0 < int(text) <= len(body):
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
        raise decode_failure(exc) from None
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError) as exc:
        token = non_finite_token(str(exc), header) if isinstance(exc, msgspec.DecodeError) else None
        if token is not None:
            raise BadRequest(f"the inference request is not valid JSON: {token} ({exc}); values must be finite "
                             "JSON numbers (JSON has no NaN or Infinity)", expected="finite JSON numbers",
                             received=token) from None
        raise BadRequest(f"the inference request is not valid JSON: {exc}",
                         expected="a UTF-8 JSON object (binary data only after Inference-Header-Content-Length)",
                         received=f"{len(header)} bytes that do not parse") from None


def decode_failure(exc: msgspec.ValidationError) -> BadRequest:
    """A request that does not fit ``$inference_request``, naming where (JSON or gRPC)."""
    text = str(exc)
    where = text.rsplit(" - at `$", 1)
    field = where[1].rstrip("`").lstrip(".") if len(where) == 2 else None
    name = unknown_field(text)
    if name is not None:  # the message quotes the name whole: say it as the received value
        inside = f" in {field}" if field else ""
        return BadRequest(f"invalid inference request: unknown field {quoted(name)}{inside}", field=field,
                          expected="the Open Inference Protocol's $inference_request", received=name)
    return BadRequest(f"invalid inference request: {text}", field=field,
                      expected="the Open Inference Protocol's $inference_request", received=where[0])


def _flag(parameters: dict[str, Parameter], name: str) -> bool:
    value = parameters.get(name, False)
    if type(value) is not bool:
        raise BadRequest(f"parameters.{name} must be a boolean", field=f"parameters.{name}", expected="true or false",
                         received=value)
    return value


def parse_parameters(parameters: dict[str, Parameter]) -> Options:
    options = Options()
    if not parameters:
        return options
    unknown = sorted(set(parameters) - set(KNOWN_PARAMETERS))
    if unknown:
        raise BadRequest(f"unknown request parameter(s) {quoted(unknown)}", field=f"parameters.{unknown[0]}",
                         expected=list(KNOWN_PARAMETERS), received=unknown)
    if "explore" in parameters:
        options.explore = _flag(parameters, "explore")
    options.clip = _flag(parameters, "clip_actions") if "clip_actions" in parameters else None
    options.unsquash = _flag(parameters, "unsquash_actions") if "unsquash_actions" in parameters else None
    options.start = _flag(parameters, "sequence_start")
    options.end = _flag(parameters, "sequence_end")
    options.binary_output = _flag(parameters, "binary_data_output")
    options.session_id = sequence_id(parameters.get("sequence_id", 0))
    if "epsilon" in parameters:
        options.epsilon = _epsilon(parameters["epsilon"])
    seed = parameters.get("seed")
    if seed is not None:
        if type(seed) is not int or not 0 <= seed <= MAX_SEED:
            raise BadRequest("parameters.seed must be an integer in 0..2**64-1", field="parameters.seed",
                             expected=f"an integer in 0..{MAX_SEED}", received=seed)
        if not options.start:
            raise BadRequest("parameters.seed seeds a sequence's sampler when it starts; send it with "
                             "sequence_id and sequence_start=true", field="parameters.seed",
                             expected="sequence_start=true with a seed", received=seed)
        options.seed = seed
    if "step" in parameters:
        options.step = _step(parameters["step"], options)
    for name in ("sequence_start", "sequence_end"):
        if getattr(options, name.removeprefix("sequence_")) and options.session_id is None:
            raise BadRequest(f"parameters.{name} needs a sequence: set parameters.sequence_id (a non-zero integer "
                             "or a non-empty string)", field="parameters.sequence_id",
                             expected="a non-zero sequence_id", received=parameters.get("sequence_id"))
    return options


def _step(value: Parameter, options: Options) -> int:
    """A sequence's step index: the steps it has answered before this one."""
    if type(value) is not int or not 0 <= value <= MAX_SEED:
        raise BadRequest("parameters.step must be an integer >= 0: the steps this sequence has answered before "
                         "this one", field="parameters.step", expected="an integer >= 0", received=value)
    if options.session_id is None:
        raise BadRequest("parameters.step counts a sequence's steps: send it with parameters.sequence_id",
                         field="parameters.step", expected="a sequence_id with it", received=value)
    if options.start and value != 0:
        raise BadRequest("parameters.step must be 0 with sequence_start: a sequence starts at step 0",
                         field="parameters.step", expected=0, received=value)
    return value


def _epsilon(value: Parameter) -> float:
    """A number in [0, 1] (whether the model is a Q-policy is the act path's check)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0.0 <= value <= 1.0:
        raise BadRequest("parameters.epsilon must be a number in [0, 1] (a Q-policy's exploration rate)",
                         field="parameters.epsilon", expected="a number in [0, 1]", received=value)
    return float(value)


def sequence_id(value: Parameter) -> str | None:
    """The session id of a sequence id (int or string; 0 and "" mean no sequence). The
    integer 7 and the string "7" name the same session, also on the JSON API."""
    if type(value) is int and 0 <= value <= MAX_SEQUENCE_ID:
        return str(value) if value else None
    if type(value) is str:
        return value or None
    raise BadRequest("parameters.sequence_id must be an unsigned 64-bit integer or a string",
                     field="parameters.sequence_id", expected=f"an integer in [0, {MAX_SEQUENCE_ID}] or a string",
                     received=value)
