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

import numpy as np

from rlserve.service.experience import event_ids
from rlserve.service.experience import trail as trails
from rlserve.service.experience.records import ModelLog, Transition, as_is, packer, plain_row_bytes
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
        pack_action = packer(log.action_space)
        self._pack_action = None if pack_action is as_is else pack_action  # None: kept as answered
        self._row_bytes = plain_row_bytes(log.obs_space)
        self.version = version
        self.rate = rate
        self._env_actions = env_actions  # (model-space actions, unsquash, clip) -> JSON values (BatchStep.env_actions)
        self._clock = clock
        self._sample = sample

    def record(self, steps: list[Any], results: list[Any], *, emit: bool, obs: np.ndarray | None = None) -> None:
        """Stage every session row of the batch (``steps`` with their ``StepOutput``s; ``obs``
        the batch's observations as the model took them, where the batch step has them);
        with ``emit`` hand the closed transitions to the writer now (no store can refuse
        them later), else ``emit`` does once the results are final.

        One loop over the batch's rows (most requests are one row: what a request costs
        here is what its row costs), reading each batch-wide list once."""
        now = self._clock()
        pack_obs, pack_action, width = self._pack_obs, self._pack_action, self._row_bytes
        version, prefix, numbers = self.version, event_ids.PREFIX, event_ids.NUMBERS
        # A plain float32 row (``Step.obs_row``) went to the model as it came: its packed
        # bytes are its row of the batch's array, converted once for the batch.
        plain = None if obs is None or not width or obs.dtype != np.float32 or obs.ndim != 2 or \
            obs.shape[1] * 4 != width else obs.tobytes()
        closing: list[Transition] = []
        unfinished = number = 0
        batch = actions = logp = value = None
        for step, output in zip(steps, results, strict=True):
            if not step.has_sessions:
                continue
            if output.batch is not batch:
                batch = output.batch
                actions, logp, value = batch.actions_json, batch.logp, batch.value
            env = self._env_actions(output.actions(), step.unsquash, step.clip) if step.unsquash or step.clip \
                else None
            rows = plain if step.obs is None else None  # else an array the preparer made: packed from it
            ends, rewards, reset, agents = step.ends, step.rewards, step.reset, step.agents
            start, explore, module_id = output.start, step.explore, step.module_id
            answered: list[str | None] = [None] * step.rows
            closed = closing if emit else []
            for offset, session in enumerate(step.sessions):
                if session is None:
                    continue
                row = start + offset
                end = 0 if ends is None else ends[offset]
                packed = pack_obs(observation(step, offset)) if rows is None else rows[row * width:(row + 1) * width]
                held = session.trail
                if reset[offset]:
                    previous = None
                    if held is not None and held != NOT_SAMPLED:
                        unfinished += 1  # an episode restarted before its last step was closed
                else:
                    previous = None if held is None else trails.decode(held)
                if previous is not None:
                    reward = rewards[offset]
                    closed.append(Transition(previous, packed, 0.0 if reward is None else float(reward), end))
                elif not self._sampled(held, bool(reset[offset])):
                    session.trail = None if end else NOT_SAMPLED
                    continue
                if end:
                    session.trail = None  # the last observation: its own answer is not a step of the episode
                    continue
                number = next(numbers)
                event_id = f"{prefix}-{number:x}"
                action = actions[row]  # type: ignore[index]
                p = NAN if logp is None else logp[row]
                v = NAN if value is None else value[row]
                session.trail = Trail(
                    f"{session.id}:{event_id}" if previous is None else previous.eps_id, session.steps - 1,
                    event_id, packed, action if pack_action is None else pack_action(action),
                    None if env is None else (env[offset] if pack_action is None else pack_action(env[offset])),
                    NAN if p is None else p, NAN if v is None else v, explore, version, now,
                    None if agents is None else agents[offset], module_id)
                answered[offset] = event_id
            step.event_ids = answered
            if not emit:
                step.closed = closed
        if number:
            event_ids.given(number)  # the last taken: before any of the batch's answers goes out
        if unfinished:
            self.writer.note_unfinished(unfinished)
        if closing:
            self.writer.offer(self.log, closing)

    def emit(self, steps: list[Any], stands: list[bool]) -> None:
        """Offer the closed transitions of the requests whose answers stand."""
        closed: list[Transition] = []
        for step, ok in zip(steps, stands, strict=True):
            if ok and step.closed:
                closed.extend(step.closed)
            step.closed = None
        if closed:
            self.writer.offer(self.log, closed)

    def _sampled(self, held: Any, fresh: bool) -> bool:
        """Whether a row with no open step starts logging (``held``: the session's trail): an
        episode start draws against the rate; a session already marked as not sampled stays
        out until its next episode."""
        if not fresh and held == NOT_SAMPLED:
            return False
        return self.rate >= 1.0 or self._sample() < self.rate


def observation(step: Any, offset: int) -> Any:
    """Row ``offset``'s observation as received (the model input if it was not kept)."""
    if step.obs is None:
        return step.obs_row
    if step.raw_obs is not None:
        return step.raw_obs[offset]
    return step.obs[offset]
