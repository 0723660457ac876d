"""The act request and response on the wire (msgspec structs: fast decode, one schema).

A request carries either one ``observation`` (single form) or a list of
``observations`` (batch form); the per-row fields come in the matching form
(``session_id`` / ``session_ids``, ``reward`` / ``rewards`` ...). ``to_rows`` turns
both forms into per-row lists so the rest of the server sees one shape.
The same structs generate the OpenAPI schema of the act routes.
"""

from __future__ import annotations

from typing import Any

import msgspec

from rlserve.service.act.binary import ObservationBlock, decode_block
from rlserve.service.act.msgspec_errors import JSON_TYPE_NAMES, explain, unknown_field
from rlserve.service.act.outputs import EXTRA_NAMES, Extra, ExtraOutputs
from rlserve.service.errors import BadRequest, InvalidInput, InvalidJSON, quoted
from rlserve.service.step.received import non_finite_token
from rlserve.service.step.rows import Rows
from rlserve.service.step.sizes import check_rows

MAX_SEED = (1 << 64) - 1  # a session record keeps its seed as an unsigned 64-bit integer


class Seed(int):
    """A sampler seed: an integer in 0..2**64-1 (numpy's SeedSequence takes any
    non-negative one; a session record, ``rlserve.service.sessions.record``, keeps 64 bits).

    JSON Schema counts ``2.0`` as the integer 2, so the documented ``integer`` takes it too:
    msgspec alone refuses a float for an ``int``, hence this type and ``dec_hook``. (An int
    subclass: msgspec cannot encode it, so never echo a decoded seed without ``int()``.)
    """


class StepIndex(int):
    """A session's step index (``ActRequest.step``), an integer in 0..2**64-1 taken as
    ``Seed`` is (``3.0`` is the integer 3 to JSON Schema); the same care when echoing it."""


# The custom integer types and their largest value (the smallest is 0).
_INTEGERS: dict[type, int] = {Seed: MAX_SEED, StepIndex: MAX_SEED}


def dec_hook(kind: type, value: Any) -> Any:
    limit = _INTEGERS.get(kind)
    if limit is None:
        raise NotImplementedError(kind)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if type(value) is not int:  # messages as msgspec's own for an `int | None` field
        raise TypeError(f"Expected `int | null`, got `{JSON_TYPE_NAMES.get(type(value), type(value).__name__)}`")
    if value < 0:
        raise ValueError("Expected `int` >= 0")
    if value > limit:
        raise ValueError(f"Expected `int` <= {limit}")
    return kind(value)


def schema_hook(kind: type) -> dict[str, Any]:
    """The JSON Schema of the custom wire types (for ``msgspec.json.schema_components``)."""
    if kind in _INTEGERS:
        return {"type": "integer", "minimum": 0, "maximum": _INTEGERS[kind]}
    raise NotImplementedError(kind)


class ActRequest(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """Observations to act on, with optional per-row session fields."""

    observation: Any = msgspec.UNSET
    # A list of rows, or all rows as one base64 block (``rlserve.service.act.binary``).
    observations: list[Any] | ObservationBlock | msgspec.UnsetType = msgspec.UNSET
    session_id: str | None = None
    session_ids: list[str | None] | None = None
    # True on the first step of an episode: resets the session (creating it if unknown).
    episode_start: bool = False
    episode_starts: list[bool] | None = None
    # The reward received after the previous step's action (the model's prev_reward).
    reward: float | None = None
    rewards: list[float | None] | None = None
    # The action the environment actually took at the previous step, when it differs
    # from the one served (e.g. epsilon-greedy or a human override).
    prev_action: Any = msgspec.UNSET
    prev_actions: list[Any] | None = None
    action_mask: Any = None
    action_masks: list[Any] | None = None
    # Seeds a new session's sampler (on creation or episode_start) so an episode replays.
    seed: Seed | None = None
    seeds: list[Seed | None] | None = None
    # A stateless row's trajectory window (the last observations, actions, rewards), see
    # rlserve.service.step.windows.
    window: Any = None
    windows: list[Any] | None = None
    # Single form: the steps this session answered in its episode before this one. A retry
    # of an answered step then gets the same answer instead of a second step (act/replay.py).
    step: StepIndex | None = None
    explore: bool | None = None
    # Q-policies only: the exploration rate when exploring (default: the model's q_model.epsilon).
    epsilon: float | None = None
    # How ``action`` is made from the model's sample: unset follows the bundle (RLlib's
    # normalize_actions / clip_actions as the policy was trained with).
    clip_actions: bool | None = None
    unsquash_actions: bool | None = None
    outputs: list[Extra] = []
    debug: bool = False
    # The episode ended with this observation (the environment's last one; the reward is
    # the previous action's): what the experience log closes an episode with
    # (rlserve.service.experience). Batch form: one flag per row.
    terminated: bool = False
    truncated: bool = False
    terminateds: list[bool] | None = None
    truncateds: list[bool] | None = None


class BatchDebug(msgspec.Struct):
    batch_id: int
    batch_rows: int
    batch_requests: int
    queue_ms: float
    run_ms: float


class _AnswerHead(ExtraOutputs, omit_defaults=True):
    """What an act answer is about and its action. Positional fields come before the
    keyword-only ones in msgspec's field order (and so in the JSON): these before the
    outputs asked for by name, which ``ExtraOutputs`` declares once for this answer and a
    policy set's."""

    model: str
    version: str
    explore: bool
    action: Any = msgspec.UNSET
    actions: list[Any] | msgspec.UnsetType = msgspec.UNSET


class ActResponse(_AnswerHead, kw_only=True, omit_defaults=True):
    """Single form: ``action``/``logp``/...; batch form: ``actions``/``logp`` lists.

    The one definition of the act answer: the use case builds it, msgspec encodes it and
    generates its OpenAPI schema, so the documented and the sent shapes cannot drift."""

    # Single form: a number per field (null where the distribution defines none);
    # batch form: a list with one entry per row.
    logp: Any
    session_id: str | None | msgspec.UnsetType = msgspec.UNSET
    session_ids: list[str | None] | msgspec.UnsetType = msgspec.UNSET
    debug: BatchDebug | msgspec.UnsetType = msgspec.UNSET
    # The logged step's id (only when the experience log recorded it): a reward or a
    # correction that arrives later names it (POST /v1/models/{name}/experience/rewards).
    event_id: str | msgspec.UnsetType = msgspec.UNSET
    event_ids: list[str | None] | msgspec.UnsetType = msgspec.UNSET


_DECODER = msgspec.json.Decoder(ActRequest, dec_hook=dec_hook)


_JSON_EXPECTED = "a UTF-8 JSON object with 'observation' or 'observations'"


def decode_request(body: bytes) -> ActRequest:
    if not body:
        raise InvalidJSON("empty request body; expected a JSON object with 'observation' or 'observations'",
                          expected=_JSON_EXPECTED, received="an empty body")
    try:
        return _DECODER.decode(body)
    except msgspec.ValidationError as exc:
        raise refusal(str(exc), body) from None
    except msgspec.DecodeError as exc:
        token = non_finite_token(str(exc), body)
        if token is not None:  # Python's json writes NaN for float('nan'): say what JSON allows
            raise InvalidJSON(f"request body is not valid JSON: {token} ({exc}); values must be finite JSON "
                              "numbers (JSON has no NaN or Infinity)", expected="finite JSON numbers",
                              received=token) from None
        raise InvalidJSON(f"request body is not valid JSON: {exc}", expected=_JSON_EXPECTED,
                          received=f"{len(body)} bytes that do not parse") from None
    except UnicodeDecodeError as exc:  # msgspec checks UTF-8 inside strings lazily
        raise InvalidJSON(f"request body has invalid UTF-8 inside a JSON string: {exc.reason}",
                          expected=_JSON_EXPECTED, received=f"byte {exc.object[exc.start:exc.start + 1]!r}") from None
    except RecursionError:
        raise InvalidJSON("request body is nested too deeply", expected=_JSON_EXPECTED,
                          received="JSON nested too deeply") from None


def refusal(message: str, body: bytes) -> BadRequest:
    """The 400 for a msgspec validation error of an act request (``msgspec_errors``); an
    unknown field is named among the act request's."""
    name = unknown_field(message)
    if name is None:
        return explain(message, body, schema="the act request schema", enums={"outputs": EXTRA_NAMES})
    what = f"invalid request: unknown field {quoted(name)}"  # msgspec's message quotes it whole
    if message.endswith("- at `$.observations`"):  # an object where a list or a block goes
        return BadRequest(f"{what} in 'observations'", field="observations",
                          expected=f"a list of rows, or a block with the keys "
                                   f"{list(ObservationBlock.__struct_fields__)}", received=name)
    return BadRequest(what, field=name, expected=f"one of {list(ActRequest.__struct_fields__)}", received=name)


def to_rows(req: ActRequest, max_rows: int) -> Rows:
    """Normalise the single and batch forms; mismatched forms or lengths are 400s, more
    than ``max_rows`` rows a 413 (before any per-row list is built)."""
    single = req.observations is msgspec.UNSET
    if single == (req.observation is msgspec.UNSET):
        raise BadRequest(
            "send exactly one of 'observation' (one row) or 'observations' (a list of rows)",
            field="observation",
            expected="exactly one of 'observation' or 'observations'",
            received="both" if not single else "neither",
        )
    if single:
        _no_batch_fields(req)
        return Rows(
            True, [req.observation], [req.session_id], [req.episode_start], [req.reward],
            [req.prev_action], [req.action_mask], [req.seed],
            has_sessions=req.session_id is not None,
            has_rewards=req.reward is not None,
            has_prev_actions=req.prev_action is not msgspec.UNSET and req.prev_action is not None,
            has_masks=req.action_mask is not None,
            windows=None if req.window is None else [req.window],
            ends=_ends([req.terminated], [req.truncated]) if req.terminated or req.truncated else None,
        )
    _no_single_fields(req)
    assert req.observations is not msgspec.UNSET  # `single` is False exactly when it is set
    observations = (decode_block(req.observations, max_rows) if isinstance(req.observations, ObservationBlock)
                    else req.observations)
    n = len(observations)
    if n == 0:
        raise BadRequest("'observations' is empty", field="observations", expected="at least one row", received=0)
    check_rows(n, max_rows, "observations")
    return Rows(
        single=False,
        observations=observations,
        session_ids=_column(req.session_ids, n, "session_ids", None),
        episode_starts=_column(req.episode_starts, n, "episode_starts", False),
        rewards=_column(req.rewards, n, "rewards", None),
        prev_actions=_column(req.prev_actions, n, "prev_actions", msgspec.UNSET),
        action_masks=_column(req.action_masks, n, "action_masks", None),
        seeds=_column(req.seeds, n, "seeds", None),
        has_sessions=req.session_ids is not None and any(s is not None for s in req.session_ids),
        has_rewards=req.rewards is not None,
        has_prev_actions=req.prev_actions is not None,
        has_masks=req.action_masks is not None,
        windows=None if req.windows is None else _column(req.windows, n, "windows", None),
        ends=(None if req.terminateds is None and req.truncateds is None else
              _ends(_column(req.terminateds, n, "terminateds", False),
                    _column(req.truncateds, n, "truncateds", False))),
    )


def _ends(terminated: list[bool], truncated: list[bool]) -> list[int]:
    """Per row 0 (the episode goes on), 1 (terminated) or 2 (truncated); see ``Rows.ends``."""
    return [1 if term else 2 if trunc else 0 for term, trunc in zip(terminated, truncated, strict=True)]


def _column(values: list[Any] | None, n: int, name: str, default: Any) -> list[Any]:
    if values is None:
        return [default] * n
    if len(values) != n:
        # 422: the body is schema-valid (no JSON Schema can tie two arrays' lengths together)
        # but does not fit together, like an observation that does not fit the model's space.
        raise InvalidInput(
            f"'{name}' has {len(values)} entries but 'observations' has {n}",
            field=name,
            expected=n,
            received=len(values),
        )
    return values


# The two forms' own fields. The batch form's lists are the single form's fields plus an s;
# the single form's fields must keep these defaults in a batch request. The OpenAPI schema
# states the forms from these (service/api/act.py), so the two cannot drift apart.
BATCH_COLUMNS = ("session_ids", "episode_starts", "rewards", "prev_actions", "action_masks", "seeds", "windows",
                 "terminateds", "truncateds")
SINGLE_DEFAULTS: dict[str, Any] = {"session_id": None, "episode_start": False, "reward": None, "action_mask": None,
                                   "seed": None, "window": None, "step": None, "terminated": False,
                                   "truncated": False}


def _no_batch_fields(req: ActRequest) -> None:
    for name in BATCH_COLUMNS:
        if getattr(req, name) is not None:
            raise BadRequest(f"'{name}' belongs to the batch form; with 'observation' use '{name[:-1]}'", field=name,
                             expected=f"'{name[:-1]}' with 'observation'", received=f"'{name}'")


def _no_single_fields(req: ActRequest) -> None:
    for name, default in SINGLE_DEFAULTS.items():
        if getattr(req, name) != default:
            if name == "step":
                raise BadRequest("'step' (a retry-safe step index) is only taken with 'observation'", field=name,
                                 expected="'observation' with 'step'", received="'observations'")
            raise BadRequest(f"'{name}' belongs to the single form; with 'observations' use '{name}s'", field=name,
                             expected=f"'{name}s' with 'observations'", received=f"'{name}'")
    if req.prev_action is not msgspec.UNSET:
        raise BadRequest("'prev_action' belongs to the single form; with 'observations' use 'prev_actions'",
                         field="prev_action", expected="'prev_actions' with 'observations'", received="'prev_action'")
