"""The batch step: many validated ``Step``s through the model as one batch.

    gather session rows ─► one runtime call ─► masks ─► distribution (sample or mode,
    logp, entropy) ─► scatter new session state ─► encode the batch once ─► advance the
    sessions (step count, kept answers)

``BatchStep.run`` is the batch function handed to the ``Batcher``. It runs inline or in
the batcher's thread, never concurrently with itself for one model version. With an
external session store the batcher also awaits ``before_batch`` (the store brings the
copies held here up to date) and ``after_batch`` (it writes what the batch did, before
any answer goes out).
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from rlserve.models.distributions import DistributionError, UnsupportedMethodError
from rlserve.models.interface import ModelSignature
from rlserve.service.engine.batcher import RunFn
from rlserve.service.engine.pipeline import Pipeline
from rlserve.service.engine.runtime import Runtime
from rlserve.service.errors import BatchFailed, ServiceError, StoreUnavailable
from rlserve.service.sessions.base import SessionStore
from rlserve.service.sessions.slabs import STATELESS_SLOT
from rlserve.service.step import codec, masks, windows
from rlserve.service.step.kept import KeptAnswer, check_index, pack_answer
from rlserve.service.step.output import DIST_INPUT_NAMES, BatchOutput, StepOutput
from rlserve.service.step.prepare import Step
from rlserve.service.step.trees import explore_where, tree_set_row


class Recorder(Protocol):
    """What the batch step feeds the experience log (``rlserve.service.experience.recorder``)."""

    def record(self, steps: list[Step], results: list[StepOutput], *, emit: bool, obs: np.ndarray | None = None
               ) -> None: ...
    def emit(self, steps: list[Step], stands: list[bool]) -> None: ...


class ShadowFeed(Protocol):
    """What the batch step feeds a shadow candidate (``rlserve.service.shadow``): the steps
    whose answers stand, with their ``StepOutput``s; it only keeps them for a later hand-over."""

    def offer(self, steps: list[Step], results: list[StepOutput]) -> None: ...


class BatchStep:
    """Runs batches of one model version: its runtime, pipeline and session store."""

    def __init__(self, signature: ModelSignature, runtime: Runtime, pipeline: Pipeline, sessions: SessionStore,
                 mask_layout: masks.MaskLayout | None, *, seed: int | None = None):
        self.signature = signature
        self.runtime = runtime
        self.pipeline = pipeline
        self.sessions = sessions
        self.mask_layout = mask_layout
        self.obs_dtype = runtime.input_dtypes.get("obs", np.dtype(np.float32))
        # Integer observations (``Preparer.narrow_obs``) reach the model as ``obs_dtype``:
        # cast here while the batch is assembled, or by the runtime's staging copy.
        self._runtime_casts = runtime.casts_inputs
        self.rng = np.random.default_rng(seed)
        self.q_policy = pipeline.dist_spec.dist_class.inputs_are_q_values
        self.stateful = signature.is_recurrent or signature.uses_prev_actions or signature.uses_prev_rewards
        # The running batch's sessions were not yet confirmed by the external store (see
        # ``before_batch``); batches of one version never overlap.
        self._unconfirmed = False
        # The experience log's recorder (``rlserve.service.experience.recorder``) when it
        # records this model: fed the session rows of every batch, after it acted.
        self.recorder: Recorder | None = None
        # A shadow candidate running on this version's traffic (``rlserve.service.shadow``):
        # fed after the recorder, once the answers stand; it never changes an answer.
        self.shadow: ShadowFeed | None = None

    def run(self, steps: list[Step]) -> list[Any]:
        """One result per step: its ``StepOutput``; for a step index that does not fit the
        session, the kept answer (``KeptAnswer``) or a 409."""
        for step in steps:
            if step.expect_steps is not None:
                return self._run_indexed(steps)
        return self._run(steps)

    def env_actions(self, actions: Any, unsquash: bool, clip: bool) -> list[Any]:
        """The answered actions of model-space samples ``actions``, unsquashed and clipped
        as a request asked, as JSON values (what the experience log records beside them)."""
        if unsquash:
            actions = self.pipeline.unsquash(actions)
        if clip:
            actions = self.pipeline.clip(actions)
        return codec.encode_batch(self.pipeline.action_space, actions)

    def _run_indexed(self, steps: list[Step]) -> list[Any]:
        results: list[Any] = [None] * len(steps)
        todo: list[int] = []
        read_action, dist_width = self.pipeline.prev_action_from_json, self.signature.num_outputs
        for index, step in enumerate(steps):
            verdict = None if step.expect_steps is None else check_index(step, read_action, dist_width)
            if verdict is None:
                todo.append(index)
            else:
                results[index] = verdict
        if todo:
            for index, output in zip(todo, self._run([steps[i] for i in todo]), strict=True):
                results[index] = output
        return results

    def _run(self, steps: list[Step]) -> list[StepOutput]:
        self._begin(steps)
        obs = self._batch_obs(steps)
        inputs = {"obs": obs}
        if self.stateful:
            slots = self._slots(steps)
            self._gather(steps, slots, inputs)
        wants_value = any("value" in s.extras for s in steps)
        outputs = self.runtime.run(inputs, value=wants_value)
        dist_inputs = outputs["dist_inputs"]
        dist_inputs = self._apply_masks(steps, dist_inputs)
        actions, logp, entropy = self._act(steps, dist_inputs)
        if self.stateful:
            self._scatter(outputs, slots, actions)
        results = self._split(steps, actions, logp, entropy, outputs["value"] if wants_value else None, dist_inputs)
        self._advance(steps, results)
        if self.recorder is not None:
            # Before an external store writes the sessions (their records carry the open
            # step); its transitions go out once no commit can refuse them (``after_batch``).
            self.recorder.record(steps, results, emit=not self.sessions.durable, obs=obs)
        if self.shadow is not None and not self.sessions.durable:
            self.shadow.offer(steps, results)
        return results

    def _begin(self, steps: list[Step]) -> None:
        """What a request does to its sessions before its rows run: episodes restart now,
        after every earlier step of the session (a pipelining client's, or one run again on
        a copy restored from the external store), and each row draws from the generator its
        session has now."""
        for step in steps:
            if step.has_sessions:
                if step.restarts is not None:
                    for session, seed in step.restarts:
                        self.sessions.restart(session, seed)
                step.rngs = [None if s is None else s.rng for s in step.sessions]

    @staticmethod
    def _advance(steps: list[Step], results: list[StepOutput]) -> None:
        """Count the step in every session row; keep the answer where the request asked
        (a retry of that step is then answered from it, see ``pack_answer``)."""
        for step, result in zip(steps, results, strict=True):
            if not step.has_sessions:
                continue
            for offset, session in enumerate(step.sessions):
                if session is not None:
                    session.answer = (pack_answer(session.steps, result, offset, step.extras)
                                      if step.keep_answer else None)
                    session.steps += 1

    # ------------------------------------------------------------------ an external store

    async def before_batch(self, steps: list[Step]) -> list[ServiceError | None]:
        """The store checks the copies of the batch's sessions (per request: None or why not).

        When every session has a copy here from an earlier step, the check is only sent:
        the batch runs on those copies while the store answers, and ``after_batch`` reads
        the answer, running again the few requests whose sessions had moved on elsewhere."""
        groups = [_session_group(step) for step in steps]
        try:
            self._unconfirmed = await self.sessions.send_validate(groups)
            if self._unconfirmed:
                return [None] * len(steps)
            return await self.sessions.validate(groups)
        except StoreUnavailable as exc:  # requests without sessions need no store
            return [exc if group else None for group in groups]

    async def after_batch(self, steps: list[Step], results: list[Any], run: RunFn) -> list[Any]:
        """The store writes the sessions of every answered request; a request whose
        sessions changed elsewhere meanwhile gets the store's 409 instead of its answer.
        ``run`` runs requests again (see ``_confirm``) as the batcher ran the batch.

        Should anything fail here unexpectedly (or the batcher be cancelled: an unload),
        every copy the batch moved is dropped, to be read from the store next time: a copy
        that ran ahead of the store must never pass for the store's revision."""
        try:
            if self._unconfirmed:
                self._unconfirmed = False
                results = await self._confirm(steps, results, run)
            groups: list[list[Any]] = []
            for step, result in zip(steps, results, strict=True):
                group = _session_group(step)
                if isinstance(result, ServiceError):
                    self.sessions.discard(group)  # the batch may have moved them: read them again next time
                    group = []
                elif isinstance(result, KeptAnswer):
                    group = []  # answered again; nothing moved
                groups.append(group)
            errors = await self.sessions.commit(groups)
        except BaseException:
            self.sessions.discard([s for step in steps for s in _session_group(step)])
            raise
        if self.recorder is not None or self.shadow is not None:
            stands = [isinstance(r, StepOutput) and e is None for r, e in zip(results, errors, strict=True)]
            if self.recorder is not None:
                self.recorder.emit(steps, stands)
            if self.shadow is not None:
                self.shadow.offer([s for s, ok in zip(steps, stands, strict=True) if ok],
                                  [r for r, ok in zip(results, stands, strict=True) if ok])
        return [result if error is None else error for result, error in zip(results, errors, strict=True)]

    async def _confirm(self, steps: list[Step], results: list[Any], run: RunFn) -> list[Any]:
        """The store's answer to ``send_validate``: requests whose copies were current keep
        their results; those restored from the store run again (unless the batch failed:
        they keep the failure, their copies dropped); the others get its refusal."""
        verdicts = await self.sessions.confirm([_session_group(step) for step in steps])
        results = list(results)
        again: list[int] = []
        for index, verdict in enumerate(verdicts):
            if isinstance(verdict, ServiceError):
                results[index] = verdict
            elif verdict and not isinstance(results[index], BatchFailed):
                again.append(index)
        if again:
            rerun = await run([steps[i] for i in again], sum(steps[i].rows for i in again))
            for index, result in zip(again, rerun, strict=True):
                results[index] = result
        return results

    def _batch_obs(self, steps: list[Step]) -> np.ndarray:
        rows = [s.obs_row for s in steps]
        if None not in rows:  # every request a plain row: one conversion for the batch
            return np.array(rows, dtype=self.obs_dtype)
        parts = [np.array([s.obs_row], dtype=self.obs_dtype) if s.obs is None else s.obs for s in steps]
        if self._runtime_casts and len({part.dtype for part in parts}) == 1:
            return parts[0] if len(parts) == 1 else np.concatenate(parts)  # the runtime casts on staging
        if len(parts) == 1:
            return parts[0] if parts[0].dtype == self.obs_dtype else parts[0].astype(self.obs_dtype)
        return np.concatenate(parts, dtype=self.obs_dtype)

    @staticmethod
    def _slots(steps: list[Step]) -> np.ndarray:
        sessions = [s for step in steps for s in step.sessions]
        return np.fromiter((STATELESS_SLOT if s is None else s.slot for s in sessions), np.int64, len(sessions))

    def _gather(self, steps: list[Step], slots: np.ndarray, inputs: dict[str, np.ndarray]) -> None:
        reset = np.concatenate([s.reset for s in steps])
        rewards: np.ndarray | None = None
        if any(r is not None for s in steps for r in s.rewards):
            rewards = np.fromiter((np.nan if r is None else r for s in steps for r in s.rewards), np.float32,
                                  len(slots))
        inputs.update(self.sessions.gather_rows(slots, reset, rewards, self._reported(steps)))
        if any(s.windows is not None for s in steps):
            sent = [w for s in steps for w in (s.windows if s.windows is not None else [None] * s.rows)]
            windows.apply_windows(inputs, sent)

    @staticmethod
    def _reported(steps: list[Step]) -> np.ndarray | None:
        if all(s.prev_actions is None for s in steps):
            return None
        width = next(s.prev_actions.shape[1] for s in steps if s.prev_actions is not None)
        parts = [
            s.prev_actions if s.prev_actions is not None else np.full((s.rows, width), np.nan, np.float32)
            for s in steps
        ]
        return np.concatenate(parts)

    def _apply_masks(self, steps: list[Step], dist_inputs: np.ndarray) -> np.ndarray:
        if all(s.mask is None for s in steps):
            return dist_inputs
        layout = self.mask_layout
        assert layout is not None  # prepare() accepts a mask only when the model has a layout
        mask = np.concatenate([s.mask if s.mask is not None else np.ones((s.rows, layout.width), np.bool_)
                               for s in steps])
        return masks.apply_mask(dist_inputs, mask, layout)

    def _act(self, steps: list[Step], dist_inputs: np.ndarray) -> tuple[Any, Any, Any]:
        spec = self.pipeline.dist_spec
        dist = spec.build(dist_inputs)
        explore = steps[0].explore
        one_mode = all(s.explore is explore for s in steps)
        rows_explore = None
        if not one_mode:
            rows_explore = np.repeat([s.explore for s in steps], [s.rows for s in steps])
        elif explore and any(any(s.rngs) for s in steps):  # some rows draw from their session's generator
            rows_explore = np.full(dist_inputs.shape[0], explore)
        if self.q_policy:
            modes = np.full(dist_inputs.shape[0], explore) if rows_explore is None else rows_explore
            epsilon = self._epsilons(steps, modes)
            dist.set_epsilon(epsilon)  # type: ignore[attr-defined]
        else:
            epsilon = None
        if rows_explore is None:
            # The common batch: one mode for every row, none drawing from a seeded session's
            # generator. The sample's logp skips re-validating indices the distribution drew itself.
            actions = dist.sample(self.rng) if explore else dist.deterministic_sample()
            logp = _optional(dist.logp_of_sample)
        else:
            actions, own = self._act_mixed(steps, dist, dist_inputs, rows_explore, epsilon)
            if own:  # every action was drawn from ``dist``'s own rows: valid indices, not checked again
                dist.last_sample = actions
                logp = _optional(dist.logp_of_sample)
            else:
                logp = _optional(lambda: dist.logp(actions))
        wants_entropy = any("entropy" in s.extras for s in steps)
        entropy = _optional(dist.entropy) if wants_entropy else None
        return actions, logp, entropy

    def _act_mixed(self, steps: list[Step], dist: Any, dist_inputs: np.ndarray, explore: np.ndarray,
                   epsilon: np.ndarray | None) -> tuple[Any, bool]:
        """Rows that explore and rows that do not, or rows of seeded sessions: the actions, and
        whether ``dist`` drew every one of them from its own rows (seeded ones included)."""
        # Seeded sessions draw from their own generator, one row at a time, so an episode
        # replays whatever shares its batch.
        rows: list[int] = []
        rngs: list[np.random.Generator] = []
        start = 0
        for step in steps:
            for offset, rng in enumerate(step.rngs):
                if rng is not None and explore[start + offset]:
                    rows.append(start + offset)
                    rngs.append(rng)
            start += step.rows
        # A distribution that draws a row exactly as its one-row self would (Categorical)
        # does them all at once; any other builds each row's own distribution.
        sample_rows = getattr(dist, "sample_rows", None) if epsilon is None else None
        drawn = sample_rows(rows, rngs) if sample_rows is not None and rows else None
        if drawn is not None and len(rows) == len(explore):  # every row drew from its own generator
            return drawn, True
        actions = explore_where(dist, explore, self.rng)
        if drawn is not None:
            actions[rows] = drawn
            return actions, True
        spec = self.pipeline.dist_spec
        for row, rng in zip(rows, rngs, strict=True):
            own = spec.build(dist_inputs[row:row + 1])
            if epsilon is not None:
                own.set_epsilon(epsilon[row:row + 1])  # type: ignore[attr-defined]
            tree_set_row(actions, row, own.sample(rng))
        return actions, False

    @staticmethod
    def _epsilons(steps: list[Step], explore: np.ndarray) -> np.ndarray:
        """A Q-policy's per-row epsilon: the request's (NaN: the model's); 0 where a row does
        not explore, so its logp is that of the greedy policy it was served."""
        asked = np.repeat([np.nan if s.epsilon is None else s.epsilon for s in steps], [s.rows for s in steps])
        return np.where(explore, asked, 0.0)

    def _scatter(self, outputs: dict[str, np.ndarray], slots: np.ndarray, actions: Any) -> None:
        state_out = [outputs[f"state_out_{i}"] for i in range(len(self.signature.state))]
        flat = self.pipeline.flatten_actions(actions) if self.signature.uses_prev_actions else None
        self.sessions.scatter_rows(slots, state_out, flat)

    def _split(self, steps, actions, logp, entropy, value, dist_inputs) -> list[StepOutput]:
        """The batch's outputs, shared by its requests; each request gets its row range."""
        batch = BatchOutput(
            actions,
            {"logp": logp, "value": value, "entropy": entropy, "dist_inputs": dist_inputs,
             # A Q-policy's q_values are its dist_inputs (see Preparer.q_policy).
             "q_values": dist_inputs if self.q_policy else None},
            self.pipeline.action_space,
            want_dist_inputs=any(not s.extras.isdisjoint(DIST_INPUT_NAMES) for s in steps),
        )
        results, start = [], 0
        for step in steps:
            stop = start + step.rows
            results.append(StepOutput(batch, start, stop))
            start = stop
        return results


def _session_group(step: Step) -> list[Any]:
    return [s for s in step.sessions if s is not None] if step.has_sessions else []


def _optional(fn):
    """Methods RLlib leaves undefined (Deterministic.logp, SquashedGaussian.entropy) -> None."""
    try:
        return fn()
    except (UnsupportedMethodError, NotImplementedError):
        return None
    except DistributionError:
        raise
