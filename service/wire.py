"""The act request and response on the wire (msgspec structs: fast decode, one schema).

A request carries either one ``observation`` (single form) or a list of
``observations`` (batch form); the per-row fields come in the matching form
(``session_id`` / ``session_ids``, ``reward`` / ``rewards`` ...). ``to_rows`` turns
both forms into per-row lists so the rest of the server sees one shape.
The same structs generate the OpenAPI schema of the act routes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

import msgspec

from service.errors import BadRequest, InvalidJSON

Extra = Literal["value", "entropy", "dist_inputs"]
Seed = Annotated[int, msgspec.Meta(ge=0)]  # numpy's SeedSequence takes non-negative integers


class ActRequest(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """Observations to act on, with optional per-row session fields."""

    observation: Any = msgspec.UNSET
    observations: list[Any] | msgspec.UnsetType = msgspec.UNSET
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
    explore: bool | None = None
    clip_actions: bool = False
    unsquash_actions: bool = False
    outputs: list[Extra] = []
    debug: bool = False


class BatchDebug(msgspec.Struct):
    batch_id: int
    batch_rows: int
    batch_requests: int
    queue_ms: float
    run_ms: float


class ActResponse(msgspec.Struct, omit_defaults=True):
    """Single form: ``action``/``logp``/...; batch form: ``actions``/``logp`` lists."""

    model: str
    version: str
    action: Any = msgspec.UNSET
    actions: list[Any] | msgspec.UnsetType = msgspec.UNSET
    # Single form: a number per field; batch form: a list with one entry per row.
    logp: Any = None
    value: Any = msgspec.UNSET
    entropy: Any = msgspec.UNSET
    dist_inputs: Any = msgspec.UNSET
    session_id: str | None | msgspec.UnsetType = msgspec.UNSET
    session_ids: list[str | None] | msgspec.UnsetType = msgspec.UNSET
    explore: bool = False
    debug: BatchDebug | msgspec.UnsetType = msgspec.UNSET


@dataclass(slots=True)
class Rows:
    """One request as per-row lists (length B); ``single`` remembers the form.

    The ``has_*`` flags let the common plain request skip the per-row field checks.
    """

    single: bool
    observations: list[Any]
    session_ids: list[str | None]
    episode_starts: list[bool]
    rewards: list[float | None]
    prev_actions: list[Any]  # msgspec.UNSET where not reported
    action_masks: list[Any]  # None where not given
    seeds: list[int | None]
    has_sessions: bool = True
    has_rewards: bool = True
    has_prev_actions: bool = True
    has_masks: bool = True

    def __len__(self) -> int:
        return len(self.observations)


_DECODER = msgspec.json.Decoder(ActRequest)


def decode_request(body: bytes) -> ActRequest:
    if not body:
        raise InvalidJSON("empty request body; expected a JSON object with 'observation' or 'observations'")
    try:
        return _DECODER.decode(body)
    except msgspec.ValidationError as exc:
        raise BadRequest(f"invalid request: {exc}", field=_field_of(str(exc)), received=None) from None
    except msgspec.DecodeError as exc:
        raise InvalidJSON(f"request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise InvalidJSON("request body is nested too deeply") from None


def _field_of(message: str) -> str | None:
    # msgspec names the location as "at `$.field[0]`"; unknown fields as "`field`".
    if "at `$." in message:
        return message.split("at `$.", 1)[1].rstrip("`")
    if "Object contains unknown field `" in message:
        return message.split("unknown field `", 1)[1].split("`", 1)[0]
    return None


def to_rows(req: ActRequest) -> Rows:
    """Normalise the single and batch forms; mismatched forms or lengths are 400s."""
    single = req.observations is msgspec.UNSET
    if single == (req.observation is msgspec.UNSET):
        raise BadRequest(
            "send exactly one of 'observation' (one row) or 'observations' (a list of rows)",
            field="observation",
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
        )
    _no_single_fields(req)
    n = len(req.observations)
    if n == 0:
        raise BadRequest("'observations' is empty", field="observations", expected="at least one row", received=0)
    return Rows(
        single=False,
        observations=req.observations,
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
    )


def _column(values: list[Any] | None, n: int, name: str, default: Any) -> list[Any]:
    if values is None:
        return [default] * n
    if len(values) != n:
        raise BadRequest(
            f"'{name}' has {len(values)} entries but 'observations' has {n}",
            field=name,
            expected=n,
            received=len(values),
        )
    return values


def _no_batch_fields(req: ActRequest) -> None:
    if (req.session_ids is None and req.episode_starts is None and req.rewards is None
            and req.prev_actions is None and req.action_masks is None and req.seeds is None):
        return
    for name in ("session_ids", "episode_starts", "rewards", "prev_actions", "action_masks", "seeds"):
        if getattr(req, name) is not None:
            raise BadRequest(f"'{name}' belongs to the batch form; with 'observation' use '{name[:-1]}'", field=name)


def _no_single_fields(req: ActRequest) -> None:
    singles = {"session_id": None, "episode_start": False, "reward": None, "action_mask": None, "seed": None}
    for name, default in singles.items():
        if getattr(req, name) != default:
            raise BadRequest(f"'{name}' belongs to the single form; with 'observations' use '{name}s'", field=name)
    if req.prev_action is not msgspec.UNSET:
        raise BadRequest("'prev_action' belongs to the single form; with 'observations' use 'prev_actions'", field="prev_action")
