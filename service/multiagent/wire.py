"""A policy set's act request and answer on the wire (msgspec structs, also their OpenAPI schemas).

One request carries the step of the agents that act now (a turn-based game sends a few at a
time), each with its observation, optional action mask, the reward since its last action,
the action the environment took instead of the served one, and its ``done`` flag::

    {"episode_id": "match-7", "episode_start": true, "seed": 3,
     "agents": {"red_1": {"observation": [...]}, "blue_1": {"observation": [...], "action_mask": [1, 0, 1]}}}

The answer has per agent the action, its logp, the extras asked for in ``outputs`` and the
policy that answered; an agent sent with ``done: true`` answers ``{"policy": ..., "done": true}``
and its state ends (after its step, when it was sent with its last observation).
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

from rlserve.service.act.msgspec_errors import explain, unknown_field
from rlserve.service.act.outputs import EXTRA_NAMES, Extra, ExtraOutputs
from rlserve.service.act.wire import Seed, dec_hook
from rlserve.service.errors import BadRequest, InvalidJSON, quoted


class AgentStep(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """One agent's step: what it observes now, and what happened since its last action."""

    observation: Any = msgspec.UNSET  # required unless ``done``
    action_mask: Any = None
    # The reward received after this agent's previous action (the model's prev_reward).
    reward: float | None = None
    # The action the environment took at this agent's previous step, when not the served one.
    prev_action: Any = msgspec.UNSET
    # The agent finished (terminated or truncated): no action; its state in the episode ends.
    # With an ``observation`` (the agent's last one, and the ``reward`` that came with it),
    # the step is run and its state ends once it is answered: the experience log closes the
    # agent's episode with it, as terminated, or truncated with ``truncated``.
    done: bool = False
    truncated: bool = False  # with ``done`` and an observation: cut (a time limit), not terminated


class AgentsActRequest(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """The step of several agents of one environment, each mapped to its policy."""

    agents: Annotated[dict[str, AgentStep], msgspec.Meta(min_length=1)]  # at least one agent acts
    # The multi-agent episode (a session of per-agent sessions); none: every agent acts statelessly.
    episode_id: str | None = None
    # True on the first step of an episode: (re)starts it, creating it if unknown.
    episode_start: bool = False
    # True on the last step: every agent's state ends once this step is answered.
    episode_end: bool = False
    # Seeds the episode's samplers on its start (each agent's is derived from it), so it replays.
    seed: Seed | None = None
    explore: bool | None = None
    clip_actions: bool | None = None
    unsquash_actions: bool | None = None
    outputs: list[Extra] = []


# Positional fields first, then ExtraOutputs' keyword-only ones (the outputs asked for by
# name, declared once for this answer and the act answer).
class AgentAnswer(ExtraOutputs, omit_defaults=True):
    """One agent's answer (``done`` agents get only ``policy`` and ``done``)."""

    policy: str
    action: Any = msgspec.UNSET
    logp: Any = msgspec.UNSET
    # The step's id in the experience log (for delayed rewards, at the member model's
    # ``/v1/models/<set>.<policy>/experience/rewards``); only where the log recorded it.
    event_id: Any = msgspec.UNSET
    done: bool = False


class AgentsActResponse(msgspec.Struct, kw_only=True, omit_defaults=True):
    model: str
    version: str
    agents: dict[str, AgentAnswer]
    episode_id: str | msgspec.UnsetType = msgspec.UNSET
    episode_ended: bool = False


_DECODER = msgspec.json.Decoder(AgentsActRequest, dec_hook=dec_hook)
_EXPECTED = "a UTF-8 JSON object with 'agents' (agent id -> its step)"


def decode_agents_request(body: bytes) -> AgentsActRequest:
    if not body:
        raise InvalidJSON("empty request body; expected a JSON object with 'agents'", expected=_EXPECTED,
                          received="an empty body")
    try:
        req = _DECODER.decode(body)
    except msgspec.ValidationError as exc:
        raise _refusal(str(exc), body) from None
    except msgspec.DecodeError as exc:
        raise InvalidJSON(f"request body is not valid JSON: {exc}", expected=_EXPECTED,
                          received=f"{len(body)} bytes that do not parse") from None
    except (UnicodeDecodeError, RecursionError):
        raise InvalidJSON("request body has invalid UTF-8 or is nested too deeply", expected=_EXPECTED,
                          received=f"{len(body)} bytes") from None
    return req


def _refusal(message: str, body: bytes) -> BadRequest:
    """The 400 for a msgspec validation error (``msgspec_errors``); an unknown field is named
    among the fields of the request or of an agent's step, where it was."""
    name = unknown_field(message)
    if name is None:
        return explain(message, body, schema="the act request schema", enums={"outputs": EXTRA_NAMES})
    nested = "- at `$.agents" in message
    error = BadRequest(f"invalid request: unknown field {quoted(name)}", field=name,
                       expected=f"one of {list((AgentStep if nested else AgentsActRequest).__struct_fields__)}",
                       received=name)
    if not nested:
        error.message += ("; a policy set's act request carries 'agents' (agent id -> {observation, "
                          "action_mask, reward, prev_action, done})")
    return error
