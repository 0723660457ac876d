"""The recorder: what one model version's batches hand the experience log.

It runs inside the batch step (``rlserve.service.step.batch.BatchStep``), after the batch
acted and before an external store writes the sessions, so a session's record carries its
open step (``trail``). Per session row of the batch it

- closes the episode's previous step (transition t-1: its trail, plus this step's
  observation, the reward reported with it and whether the episode ended here);
- opens this step as the session's new trail, with an event id the answer carries.

The closed transitions wait on the ``Step`` until the batch's results are final (an
external store may still refuse a request with 409, or run it again), then go to the
writer in one ``offer`` per batch. Nothing here touches a file or waits for the writer.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

from rlserve.service.experience import trail as trails
from rlserve.service.experience.event_ids import new_event_id
from rlserve.service.experience.records import ModelLog, Transition, packer
from rlserve.service.experience.trail import NOT_SAMPLED, Trail
from rlserve.service.experience.writer import ExperienceWriter

NAN = float("nan")


class Recorder:
    """Logs the session steps of one model version (a fraction ``rate`` of its episodes)."""

    def __init__(self, log: ModelLog, writer: ExperienceWriter, *, version: str, rate: float,
                 env_actions: Callable[[Any, bool, bool], list[Any]],
                 clock: Callable[[], float] = time.time, sample: Callable[[], float] = random.random):
        self.log = log
        self.writer = writer
        self._pack_obs = packer(log.obs_space)
        self._pack_action = packer(log.action_space)
        self.version = version
        self.rate = rate
        self._env_actions = env_actions  # (model-space actions, unsquash, clip) -> JSON values (BatchStep.env_actions)
        self._clock = clock
        self._sample = sample

    def record(self, steps: list[Any], results: list[Any], *, emit: bool) -> None:
        """Stage every session row of the batch (``steps`` with their ``StepOutput``s);
        with ``emit`` hand the closed transitions to the writer now (no store can refuse
        them later), else ``emit`` does once the results are final."""
        now = self._clock()
        unfinished = 0
        for step, output in zip(steps, results, strict=True):
            if step.has_sessions:
                unfinished += self._stage(step, output, now)
        if unfinished:
            self.writer.note_unfinished(unfinished)
        if emit:
            self.emit(steps, [True] * len(steps))

    def emit(self, steps: list[Any], stands: list[bool]) -> None:
        """Offer the closed transitions of the requests whose answers stand."""
        closed: list[Transition] = []
        for step, ok in zip(steps, stands, strict=True):
            if ok and step.closed:
                closed.extend(step.closed)
            step.closed = None
        if closed:
            self.writer.offer(self.log, closed)

    def _stage(self, step: Any, output: Any, now: float) -> int:
        batch = output.batch
        actions, logp, value = batch.actions_json, batch.logp, batch.value
        env = None
        if step.unsquash or step.clip:
            env = self._env_actions(output.actions(), step.unsquash, step.clip)
        event_ids: list[str | None] = [None] * step.rows
        closed: list[Transition] = []
        unfinished = 0
        for offset, session in enumerate(step.sessions):
            if session is None:
                continue
            row = output.start + offset
            end = step.ends[offset] if step.ends is not None else 0
            obs = self._pack_obs(observation(step, offset))
            previous, fresh = self._previous(step, offset, session)
            if previous is None and fresh and session.trail not in (None, NOT_SAMPLED):
                unfinished += 1  # an episode restarted before its last step was closed
            if previous is not None:
                reward = step.rewards[offset]
                closed.append(Transition(previous, obs, 0.0 if reward is None else float(reward), end))
            elif not self._sampled(session, fresh, previous):
                session.trail = None if end else NOT_SAMPLED
                continue
            if end:
                session.trail = None  # the last observation: its own answer is not a step of the episode
                continue
            event_id = new_event_id()
            eps_id = previous.eps_id if previous is not None else f"{session.id}:{event_id}"
            session.trail = (Trail(
                eps_id, session.steps - 1, event_id, obs, self._pack_action(actions[row]),
                None if env is None else self._pack_action(env[offset]),
                NAN if logp is None or logp[row] is None else logp[row],
                NAN if value is None or value[row] is None else value[row],
                step.explore, self.version, now,
                None if step.agents is None else step.agents[offset], step.module_id))
            event_ids[offset] = event_id
        step.event_ids = event_ids
        step.closed = closed
        return unfinished

    def _previous(self, step: Any, offset: int, session: Any) -> tuple[Trail | None, bool]:
        """(the open step this row closes, whether the row starts an episode)."""
        if step.reset[offset]:
            return None, True
        data = session.trail
        return (None if data is None else trails.decode(data)), False

    def _sampled(self, session: Any, fresh: bool, previous: Trail | None) -> bool:
        """Whether a row with no open step starts logging: an episode start draws against
        the rate; a session already marked as not sampled stays out until its next episode."""
        if not fresh and session.trail == NOT_SAMPLED:
            return False
        return self.rate >= 1.0 or self._sample() < self.rate


def observation(step: Any, offset: int) -> Any:
    """Row ``offset``'s observation as received (the model input if it was not kept)."""
    if step.obs is None:
        return step.obs_row
    if step.raw_obs is not None:
        return step.raw_obs[offset]
    return step.obs[offset]
