"""A policy set's episodes from the routes: create, inspect, export, import, end (framework-free).

An episode moves as one body (``rlserve.service.sessions.episode_record``): its seats and
every agent's session record as that agent's policy exports it. Importing it under an id
re-creates each agent's session under the new episode's session ids, in the version of its
policy the record is bound to, then the episode.
"""

from __future__ import annotations

from typing import Any

from rlserve.service.errors import InvalidInput, ServiceError, SessionBusy
from rlserve.service.multiagent.episode_plan import end_agent_session
from rlserve.service.serving.policy import Policy
from rlserve.service.serving.policy_sets import ServedPolicySet
from rlserve.service.serving.registry import ModelEntry, ModelRegistry
from rlserve.service.sessions.episode_record import decode_episode, encode_episode
from rlserve.service.sessions.episode_store import Episode, Seat, agent_session_id, validate_episode_id
from rlserve.service.sessions.import_check import check_contents
from rlserve.service.sessions.record import RecordError, SessionRecord, record_version

EXPORTED = "the bytes of GET /v1/models/{name}/episodes/{id} with Accept: application/octet-stream"


class EpisodeService:
    def __init__(self, registry: ModelRegistry):
        self.registry = registry

    async def open(self, name: str, episode_id: str | None, seed: int | None) -> dict[str, Any]:
        served = self.registry.policy_set(name)
        episode = await served.episodes.open(episode_id, seed)
        return await self._info(served, episode)

    async def describe(self, name: str, episode_id: str) -> dict[str, Any]:
        served = self.registry.policy_set(name)
        return await self._info(served, await served.episodes.lookup(validate_episode_id(episode_id)))

    async def export(self, name: str, episode_id: str) -> bytes:
        served = self.registry.policy_set(name)
        episode = await served.episodes.lookup(validate_episode_id(episode_id))
        records = {}
        for agent_id, seat in episode.seats.items():
            entry = self.registry.entry(served.member(seat.policy))
            session = await entry.sessions.lookup(seat.session_id)
            records[agent_id] = await entry.sessions.export(session)
        return encode_episode(episode, records)

    async def end(self, name: str, episode_id: str) -> dict[str, Any]:
        served = self.registry.policy_set(name)
        episode = await served.episodes.lookup(validate_episode_id(episode_id))
        info = await self._info(served, episode)
        for seat in episode.seats.values():
            entry = self.registry.entry(served.member(seat.policy))
            try:
                session = await entry.sessions.lookup(seat.session_id)
            except ServiceError:  # the agent's state is gone already (expired)
                continue
            await entry.sessions.close(session)
        episode.seats.clear()
        await _wait(served.episodes.finish(episode))
        return info

    async def import_(self, name: str, episode_id: str, data: bytes) -> dict[str, Any]:
        served = self.registry.policy_set(name)
        episode_id = validate_episode_id(episode_id)
        try:
            record = decode_episode(data)
        except RecordError as exc:
            raise InvalidInput(f"body: {exc}", field="body", expected=EXPORTED, received=f"{len(data)} bytes") from None
        unknown = sorted({seat.policy for seat in record.seats.values()} - set(served.members))
        if unknown or set(record.records) != set(record.seats):
            raise InvalidInput(f"body: the episode's agents are on policies {unknown or 'without records'} this set "
                               f"does not serve (its policies: {sorted(served.members)})", field="body",
                               expected=EXPORTED, received=f"{len(data)} bytes")
        old = served.episodes.live(episode_id)
        if served.episodes.in_flight(episode_id):
            raise SessionBusy(f"episode {episode_id!r} has a request in flight; retry when it is answered",
                              field="episode_id", received=episode_id)
        seats = {agent: Seat(seat.policy, agent_session_id(episode_id, agent)) for agent, seat in record.seats.items()}
        # Every agent's record is read before any is written: a refused import changes nothing.
        decoded = {agent: self._agent_record(served, agent, seat, record.records[agent])
                   for agent, seat in seats.items()}
        for agent, seat in seats.items():  # an agent's session may be stepped as its member model's
            decoded[agent][0].sessions.check_idle(seat.session_id, f"body.records.{agent}",
                                                  f"agent {agent!r} of episode {episode_id!r}")
        for agent, seat in seats.items():
            entry, policy, session_record = decoded[agent]
            await entry.sessions.import_record(seat.session_id, policy.version, session_record)
        if old is not None:
            for agent, seat in old.seats.items():
                if agent not in seats:
                    end_agent_session(self.registry, served, seat)
        now = served.episodes.clock()
        episode = Episode(episode_id, record.seed, now, now, seats=seats, joins=dict(record.joins),
                          steps=record.steps, dirty=True)
        served.episodes.hold(episode)
        await _wait(served.episodes.save(episode))
        return await self._info(served, episode)

    def _agent_record(self, served: ServedPolicySet, agent: str, seat: Seat,
                      data: bytes) -> tuple[ModelEntry, Policy, SessionRecord]:
        """(the model entry, the policy version, the decoded session record) of one agent's
        exported state; 422 naming the agent when it does not fit a loaded version."""
        entry = self.registry.entry(served.member(seat.policy))
        field = f"body.records.{agent}"
        try:
            policy = entry.policy(record_version(data))
            record = entry.sessions.layout(policy.version).decode(data)
            check_contents(record, policy.bundle.manifest.signature, policy.pipeline)
            return entry, policy, record
        except (RecordError, ServiceError) as exc:
            raise InvalidInput(f"{field}: {getattr(exc, 'message', exc)}", field=field,
                               expected=f"a session record of a loaded version of {entry.name!r}",
                               received=f"{len(data)} bytes") from None

    async def _info(self, served: ServedPolicySet, episode: Episode) -> dict[str, Any]:
        agents = {}
        for agent_id, seat in episode.seats.items():
            model = served.member(seat.policy)
            entry = self.registry.entries.get(model)
            steps = version = None
            if entry is not None:
                try:
                    session = await entry.sessions.lookup(seat.session_id)
                    steps, version = session.steps, session.version
                except ServiceError:
                    pass  # its state expired: shown without steps
            agents[agent_id] = {"policy": seat.policy, "model": model, "version": version,
                                "session_id": seat.session_id, "steps": steps}
        store = served.episodes
        return {"episode_id": episode.id, "model": served.name, "version": served.version, "seed": episode.seed,
                "steps": episode.steps, "idle_s": max(0.0, store.clock() - episode.last_used),
                "idle_ttl_s": store.idle_ttl_s, "agents": agents}


async def _wait(pending: Any) -> None:
    if pending is not None:
        await pending
