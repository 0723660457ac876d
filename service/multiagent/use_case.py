"""A policy set's act: one request's agents routed to their policies' batchers, answers gathered.

    decode ─► the episode (find / create / restart; no mutation) ─► each agent mapped to its
      policy ─► per policy one request of rows (one row per agent, the agent's session in
      that policy's store) ─► every part checked (``ActService.check_rows``) ─► the episode
      and the parts bound ─► each part into its policy's batcher ─► all answered ─► per agent
      the action, logp, extras and which policy answered

The parts are ordinary act requests of the member models (``<set>.<policy_id>``): they share
batches with every other client of those models, and each agent's state is an ordinary
session of its policy. Nothing changes until every part validated, so a refused request
leaves the episode and every agent's state as they were. Once bound, the parts run in their
own batches: should one fail (a batch error, a store conflict), the request answers that
error while the others' steps stand, as separate requests' would.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from rlserve.models.multiagent.mapping import UnmappedAgent
from rlserve.service.act.use_case import Accepted, ActService, Checked, EpisodeDraw, response_of
from rlserve.service.act.wire import ActResponse
from rlserve.service.errors import BadRequest, ServiceError, SessionConflict, SessionExpired, as_service_error
from rlserve.service.multiagent.episode_plan import EpisodePlan, plan_episode
from rlserve.service.multiagent.wire import AgentsActRequest, AgentStep, decode_agents_request
from rlserve.service.serving.policy_sets import ServedPolicySet
from rlserve.service.serving.registry import ModelRegistry
from rlserve.service.sessions.base import LOADS, SessionMiss, after_loading_all
from rlserve.service.sessions.episode_store import validate_agent_id
from rlserve.service.step.rows import Rows

log = logging.getLogger("rlserve.agents")
_ENCODER = msgspec.json.Encoder()
Reply = Callable[[Any, ServiceError | None], None]
# The answer (plain data, as ``AgentsActResponse`` documents it) to what the reply carries:
# the HTTP route's JSON bytes, a stream's frame (``rlserve.service.stream.agents``).
Encode = Callable[[dict[str, Any]], Any]


@dataclass(slots=True)
class _Part:
    """The agents of one request that one policy answers: an act request of its member model."""

    policy_id: str
    model: str
    agents: list[str] = field(default_factory=list)
    observations: list[Any] = field(default_factory=list)
    session_ids: list[str | None] = field(default_factory=list)
    starts: list[bool] = field(default_factory=list)
    rewards: list[float | None] = field(default_factory=list)
    prev_actions: list[Any] = field(default_factory=list)
    masks: list[Any] = field(default_factory=list)
    seeds: list[int | None] = field(default_factory=list)
    ends: list[int] = field(default_factory=list)  # per row: 0, or how the agent's last observation ended it
    checked: Checked | None = None
    accepted: Accepted | None = None

    def rows(self, stateful: bool) -> Rows:
        return Rows(False, self.observations, self.session_ids, self.starts, self.rewards, self.prev_actions,
                    self.masks, self.seeds, has_sessions=stateful,
                    has_rewards=any(r is not None for r in self.rewards),
                    has_prev_actions=any(a is not msgspec.UNSET for a in self.prev_actions),
                    has_masks=any(m is not None for m in self.masks),
                    ends=self.ends if any(self.ends) else None, agents=self.agents, module_id=self.policy_id)


@dataclass(slots=True)
class _Plan:
    started: float
    served: ServedPolicySet
    req: AgentsActRequest
    episode: EpisodePlan
    parts: list[_Part]
    done: dict[str, str]  # agents sent with done=true -> their policy
    encode: Encode
    route: str  # rlserve_request_latency_seconds{route=...}: agents_act (HTTP) or agents_stream


class AgentsActService:
    """The act use case of policy sets, on top of the members' ``ActService``."""

    def __init__(self, registry: ModelRegistry, act: ActService):
        self.registry = registry
        self.act = act
        self._tasks: set[asyncio.Task] = set()

    async def agents_act(self, name: str, body: bytes) -> bytes:
        """Body bytes -> response bytes; raises a ``ServiceError`` for the client."""
        future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

        def reply(payload: Any, error: ServiceError | None) -> None:
            if not future.done():
                future.set_exception(error) if error is not None else future.set_result(payload)

        self.agents_act_nowait(name, body, reply)
        return await future

    def agents_act_nowait(self, name: str, body: bytes, reply: Reply) -> None:
        """``agents_act`` without a task unless a session must be read from the store first."""
        started = time.perf_counter()
        req = decode_agents_request(body)
        served = self.registry.policy_set(name)

        def accept() -> _Plan:
            return self._accept(served, req, started, _ENCODER.encode, "agents_act")

        try:
            plan = accept()
        except SessionMiss as miss:
            self._spawn(self._accept_later(miss, accept, reply, reads=LOADS + 2 + len(served.members)))
            return
        self._submit(plan, reply)

    async def _accept_later(self, miss: SessionMiss, accept: Callable[[], _Plan], reply: Reply, reads: int) -> None:
        try:
            # The episode, then each policy's sessions (and those of finishing agents): one read each.
            plan = await after_loading_all(miss, accept, reads)
            self._submit(plan, reply)
        except Exception as exc:  # the client gets an answer whatever went wrong
            reply(None, as_service_error(exc, log, "agents act failed"))

    def accept_nowait(self, name: str, req: AgentsActRequest, started: float, encode: Encode, route: str) -> _Plan:
        """A decoded request checked and bound (``submit`` runs it): a stream's step, its
        latency counted under ``route``. Raises ``SessionMiss`` when its episode or a session
        is not held here (then ``accept_after``)."""
        return self._accept(self.registry.policy_set(name), req, started, encode, route)

    async def accept_after(self, miss: SessionMiss, name: str, req: AgentsActRequest, started: float,
                           encode: Encode, route: str) -> _Plan:
        """``accept_nowait`` once what ``miss`` names (and what the next tries miss) is read."""
        served = self.registry.policy_set(name)

        def accept() -> _Plan:
            return self._accept(served, req, started, encode, route)

        return await after_loading_all(miss, accept, LOADS + 2 + len(served.members))

    def submit(self, plan: _Plan, reply: Reply) -> None:
        """Run an accepted request's parts; ``reply`` gets the encoded answer or the error."""
        self._submit(plan, reply)

    def _spawn(self, coroutine: Any) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ------------------------------------------------------------------ accept

    def _accept(self, served: ServedPolicySet, req: AgentsActRequest, started: float, encode: Encode,
                route: str) -> _Plan:
        """Check every part (no mutation), then bind the episode and every part."""
        episode = plan_episode(served, req)
        parts: dict[str, _Part] = {}
        done: dict[str, str] = {}
        for agent_id, step in req.agents.items():
            validate_agent_id(agent_id, "agents")
            policy_id = episode.policy_of(agent_id) or self._map(served, agent_id)
            end = _end_of(agent_id, step)
            if step.done:
                done[agent_id] = policy_id
                if step.observation is msgspec.UNSET:
                    episode.finish(agent_id)
                    continue
                episode.close_after(agent_id)  # its last observation is a row; its state ends after it
            elif step.observation is msgspec.UNSET:
                raise BadRequest(f"agents.{agent_id}.observation is required unless the agent is done",
                                 field=f"agents.{agent_id}.observation", expected="the agent's observation",
                                 received=None)
            part = parts.get(policy_id)
            if part is None:
                part = parts[policy_id] = _Part(policy_id, served.member(policy_id))
            session_id, start, seed = episode.seat(agent_id, policy_id)
            part.agents.append(agent_id)
            part.observations.append(step.observation)
            part.session_ids.append(session_id)
            part.starts.append(start)
            part.rewards.append(step.reward)
            part.prev_actions.append(step.prev_action)
            part.masks.append(step.action_mask)
            part.seeds.append(seed)
            part.ends.append(end)
        extras = frozenset(req.outputs)
        for part in parts.values():
            try:
                draw = None if episode.id is None else EpisodeDraw(
                    episode.id, episode.member_version(part.policy_id, self.registry))
                part.checked = self.act.check_rows(part.model, None, part.rows(episode.stateful), explore=req.explore,
                                                   extras=extras, unsquash=req.unsquash_actions,
                                                   clip=req.clip_actions, started=started, episode=draw)
            except ServiceError as exc:
                raise _named_for_agents(exc, part.agents) from None
        episode.check_finishing(self.registry)
        episode.bind(self.registry)  # the episode's changes: created, restarted, joined, finished
        plan = _Plan(started, served, req, episode, list(parts.values()), done, encode, route)
        for part in plan.parts:
            assert part.checked is not None
            part.accepted = self.act.bind(part.checked)
        return plan

    @staticmethod
    def _map(served: ServedPolicySet, agent_id: str) -> str:
        try:
            return served.mapping.policy_for(agent_id)
        except UnmappedAgent as exc:
            raise BadRequest(f"agents.{agent_id}: {exc}", field=f"agents.{agent_id}",
                             expected=f"an agent id the mapping covers ({exc.rules})", received=agent_id) from None

    # ------------------------------------------------------------------ submit and gather

    def _submit(self, plan: _Plan, reply: Reply) -> None:
        answers: list[ActResponse | None] = [None] * len(plan.parts)
        errors: list[ServiceError] = []
        pending = len(plan.parts)

        def part_done(index: int) -> Callable[[Any, ServiceError | None], None]:
            def done(payload: Any, error: ServiceError | None) -> None:
                nonlocal pending
                if error is not None:
                    errors.append(error)
                else:
                    answers[index] = payload
                pending -= 1
                if pending == 0:
                    self._finish(plan, answers, errors[0] if errors else None, reply)
            return done

        if not plan.parts:  # every agent of the step was done
            self._finish(plan, answers, None, reply)
            return
        for index, part in enumerate(plan.parts):
            assert part.accepted is not None
            try:
                self.act.submit_nowait(part.accepted, response_of, part_done(index))
            except ServiceError as exc:  # queue full: this part never ran (its sessions were released)
                part_done(index)(None, exc)

    def _finish(self, plan: _Plan, answers: list[ActResponse | None], error: ServiceError | None,
                reply: Reply) -> None:
        try:
            saving = plan.episode.settle(self.registry, ended=error is None and plan.req.episode_end,
                                         answered=error is None)
        except Exception as exc:  # the client gets an answer whatever went wrong
            reply(None, as_service_error(exc, log, "agents act: settling the episode failed"))
            return
        if error is not None:
            if isinstance(error, SessionExpired | SessionConflict) and plan.episode.episode is not None:
                # An agent's state moved on or ended elsewhere (another replica): so may have the
                # episode; the copy held here is read again with the next step.
                plan.served.episodes.forget(plan.episode.episode)
            reply(None, error)
            return
        try:
            payload = plan.encode(self._response(plan, answers))
        except Exception as exc:
            reply(None, as_service_error(exc, log, "agents act: encoding the response failed"))
            return
        for part in plan.parts:  # each member's part is one request of its version
            if part.accepted is not None:
                self.act.observe_version(part.accepted)
        if self.act.metrics is not None:  # the set's request, as the act route's: received to answer ready
            self.act.metrics.route_latency(plan.served.name, plan.route).observe(time.perf_counter() - plan.started)
        if saving is None:
            reply(payload, None)
        else:  # an external store records the episode's changes before the answer goes out
            self._spawn(_after(saving, payload, reply))

    @staticmethod
    def _response(plan: _Plan, answers: list[ActResponse | None]) -> dict[str, Any]:
        """The answer as plain data (encoded as ``AgentsActResponse`` documents it): per agent
        a dict, cheaper to build than a struct each on the hot path."""
        by_agent: dict[str, dict[str, Any]] = {}
        for part, answer in zip(plan.parts, answers, strict=True):
            assert answer is not None and isinstance(answer.actions, list)
            actions, logp = answer.actions, answer.logp
            extras = [(name, values) for name in _EXTRAS if isinstance(values := getattr(answer, name), list)]
            event_ids = answer.event_ids if isinstance(answer.event_ids, list) else None  # the experience log's
            policy_id = part.policy_id
            for row, agent_id in enumerate(part.agents):
                one = {"policy": policy_id, "action": actions[row], "logp": logp[row] if logp is not None else None}
                for name, values in extras:
                    one[name] = values[row]
                if event_ids is not None and event_ids[row] is not None:
                    one["event_id"] = event_ids[row]
                by_agent[agent_id] = one
        for agent_id, policy_id in plan.done.items():
            by_agent[agent_id] = {"policy": policy_id, "done": True}
        response: dict[str, Any] = {"model": plan.served.name, "version": plan.served.version,
                                    "agents": {agent_id: by_agent[agent_id] for agent_id in plan.req.agents}}
        if plan.episode.id is not None:
            response["episode_id"] = plan.episode.id
        if plan.episode.ended:
            response["episode_ended"] = True
        return response


async def _after(saving: Any, payload: bytes, reply: Reply) -> None:
    try:
        await saving
    except Exception as exc:  # the step was answered by the policies; its record could not be written
        reply(None, as_service_error(exc, log, "agents act: writing the episode failed"))
        return
    reply(payload, None)


_EXTRAS = ("value", "entropy", "dist_inputs", "q_values", "raw_action")


def _end_of(agent_id: str, step: AgentStep) -> int:
    """How the agent's row ends its episode (``Rows.ends``): 0 it goes on, 1 terminated, 2
    truncated (a ``done`` agent's last observation)."""
    if step.truncated and (not step.done or step.observation is msgspec.UNSET):
        raise BadRequest(f"agents.{agent_id}.truncated says how the agent's last observation ended its episode",
                         field=f"agents.{agent_id}.truncated", expected="'truncated' with 'done' and 'observation'",
                         received=True)
    if not step.done or step.observation is msgspec.UNSET:
        return 0
    return 2 if step.truncated else 1


_COLUMN = re.compile(r"^(observations|action_masks|rewards|prev_actions|session_ids|seeds|episode_starts|windows)"
                     r"\[(\d+)\]")
_SINGLE = {"observations": ".observation", "action_masks": ".action_mask", "rewards": ".reward",
           "prev_actions": ".prev_action", "session_ids": "", "seeds": "", "episode_starts": "", "windows": ""}


def _named_for_agents(error: ServiceError, agents: list[str]) -> ServiceError:
    """An error of a part's rows (``observations[2].pos``) named by the agent's field
    (``agents.red_1.observation.pos``)."""
    field = error.field
    match = _COLUMN.match(field) if isinstance(field, str) else None
    if match is None or int(match[2]) >= len(agents):
        return error
    named = f"agents.{agents[int(match[2])]}{_SINGLE[match[1]]}"
    error.message = error.message.replace(match[0], named)
    error.field = named + field[match.end():]  # type: ignore[index]
    return error
