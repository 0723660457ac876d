"""The act use case, framework-free: body bytes in, response bytes out.

    decode + normalise rows ─► resolve sessions (read-only) ─► policy.prepare (validate)
      ─► bind sessions (create / note restarts / in-flight count) ─► batcher ─► encode

``act`` awaits the batch (the ASGI handlers); ``act_nowait`` hands a callback to the
batcher instead (the act protocol, which has no task per request).

Other wire formats (``rlserve.service.protocols``) decode their own bodies into ``Rows``
and enter at ``accept_rows``, then ``submit_nowait`` / ``submit`` with their own encoder:
the session binding, validation and batcher are this class's, so a request of any wire
format can share a batch with any other.

Under an external session store a session this process does not hold makes the lookup
raise ``SessionMiss``; the request then waits for one read of its sessions from the store
and is accepted again (``after_loading``; the ``*_nowait`` entries do this in a task, only
then, through ``accept_later``). Every entry handles it alike: ``act``, ``act_nowait``, and
the other wire formats' callers of ``accept_rows``, which raises ``SessionMiss`` too.

Nothing mutates session state until every row validated; a request that fails
validation leaves all sessions as they were. Both the raw ASGI hot path and the
documented FastAPI route call ``ActService.act``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec
from gymnasium import spaces as gs

from rlserve.service.access_log import note_rows
from rlserve.service.act import replay
from rlserve.service.act.wire import ActRequest, ActResponse, BatchDebug, decode_request, to_rows
from rlserve.service.engine.batcher import BatchInfo, Job
from rlserve.service.engine.metrics import Metrics
from rlserve.service.errors import NotReady, ServiceError, as_service_error
from rlserve.service.serving.policy import Policy
from rlserve.service.serving.registry import ModelEntry, ModelRegistry
from rlserve.service.sessions.base import SessionMiss, after_loading
from rlserve.service.sessions.lifecycle import Bound, SessionLifecycle
from rlserve.service.sessions.resolver import Binding
from rlserve.service.step import codec
from rlserve.service.step.kept import KeptAnswer
from rlserve.service.step.output import StepOutput
from rlserve.service.step.prepare import Step
from rlserve.service.step.rows import Rows
from rlserve.service.step.sizes import Expect

log = logging.getLogger("rlserve.act")
_ENCODER = msgspec.json.Encoder()
_NO_KEYS: frozenset[str] = frozenset()


_NO_SESSIONS = Binding()

# reply(payload, None) with the response body, or reply(None, error) for the client.
Reply = Callable[[Any, ServiceError | None], None]


@dataclass(slots=True)
class Accepted:
    """A validated request whose sessions are bound, waiting for its batch. It keeps only
    what the response needs: the decoded JSON (a 64-row request is ~1,100 Python objects)
    is freed as soon as the rows are arrays, not held while the request queues."""

    started: float
    name: str
    policy: Policy
    single: bool  # the request's form: one 'observation' or a list of 'observations'
    unsquash: bool
    clip: bool
    debug: bool
    step: Step
    job: Job
    bound: Bound | None = None  # the sessions the request bound (None: it names none)


@dataclass(frozen=True, slots=True)
class EpisodeDraw:
    """A policy set's episode as the draw sees it for one member: its id (the draw's key)
    and the version its live agents of that member are on (None: none is live)."""

    id: str
    version: str | None = None


@dataclass(frozen=True, slots=True)
class _Options:
    """The request-wide options of a request decoded by another wire format, under the
    names of ``ActRequest``'s fields so ``_accept`` reads both alike."""

    explore: bool | None
    outputs: frozenset[str]
    unsquash_actions: bool | None  # None: as the bundle says
    clip_actions: bool | None
    debug: bool = False
    epsilon: float | None = None
    step: int | None = None  # the step index, where the format carries one (KServe v2's parameters.step)


@dataclass(slots=True)
class Checked:
    """A request resolved and validated whose sessions are not bound yet (``ActService.bind``)."""

    started: float
    name: str
    policy: Policy
    rows: Rows
    binding: Binding
    step: Step
    options: ActRequest | _Options
    lifecycle: SessionLifecycle


# encode(accepted, output, info): a request's rows of its batch -> what its reply carries.
Encode = Callable[[Accepted, Any, BatchInfo], Any]


class ActService:
    def __init__(self, registry: ModelRegistry, metrics: Metrics | None = None, *, access_log: bool = False):
        self.registry = registry
        self.metrics = metrics
        self.max_rows = registry.settings.max_rows  # rows one request may carry, whatever its form
        self.access_log = access_log  # note each request's rows for the access log (off: nothing to do)
        self._loading: set[asyncio.Task] = set()  # *_nowait requests waiting for the store

    async def act(self, name: str, version: str | None, body: bytes) -> bytes:
        """Body bytes -> response bytes; raises a ``ServiceError`` for the client."""
        started = time.perf_counter()
        req = decode_request(body)
        rows = to_rows(req, self.max_rows)

        def accept() -> Accepted:
            return self._accept(name, version, rows, req, started)

        try:
            accepted = accept()
        except SessionMiss as miss:
            accepted = await after_loading(miss, accept)
        output, info = await self.submit(accepted)
        return self._finish(accepted, output, info)

    def act_nowait(self, name: str, version: str | None, body: bytes, reply: Reply) -> None:
        """``act`` without a task: validation errors and 503s raise here, at once; the
        outcome of the batch goes to ``reply(payload, None)`` or ``reply(None, error)``,
        called on the event loop. For callers that own the connection (the act protocol)."""
        started = time.perf_counter()
        req = decode_request(body)
        rows = to_rows(req, self.max_rows)

        def accept() -> tuple[Accepted, Encode]:
            return self._accept(name, version, rows, req, started), self._finish

        try:
            accepted, _ = accept()
        except SessionMiss as miss:  # rare (a restart, a failover): a task waits for the store
            self.accept_later(miss, accept, reply)
            return
        self.submit_nowait(accepted, self._finish, reply)

    def accept(self, name: str, version: str | None, req: ActRequest, started: float) -> Accepted:
        """A decoded act request validated and bound, ready for ``submit_nowait``: for a
        transport that builds the request itself (a stream's step). Raises ``SessionMiss``
        like ``accept_rows``."""
        return self._accept(name, version, to_rows(req, self.max_rows), req, started)

    # ------------------------------------------------------------------ other wire formats

    def block_expect(self, name: str, version: str | None) -> Expect:
        """What a block of rows sent without sessions must declare (``sizes``): the row
        limit and the observation shape of the version that will take it (any Box row
        when the observation space is no Box: the preparer refuses the block then)."""
        space = self.registry.entry(name).policy(version).pipeline.obs_space
        rows = (tuple(space.shape),) if isinstance(space, gs.Box) else None
        return Expect(self.max_rows, rows)

    def accept_rows(self, name: str, version: str | None, rows: Rows, *, explore: bool | None,
                    extras: frozenset[str] = _NO_KEYS, unsquash: bool | None = None, clip: bool | None = None,
                    started: float | None = None, epsilon: float | None = None, step: int | None = None) -> Accepted:
        """A request another wire format already decoded into ``rows``: validated, its
        sessions bound, ready for ``submit_nowait`` or ``submit``. Raises (before any
        session changed) if it is refused."""
        options = _Options(explore, extras, unsquash, clip, epsilon=epsilon, step=step)
        return self._accept(name, version, rows, options, time.perf_counter() if started is None else started)

    def accept_later(self, miss: SessionMiss, accept: Callable[[], tuple[Accepted, Encode]], reply: Reply) -> None:
        """An accept that raised ``SessionMiss`` (``act_nowait``'s, or another format's around
        ``accept_rows``): a task reads the sessions from the store, calls ``accept()`` again
        and submits what it accepted with the encoder it returns, as ``submit_nowait`` does;
        every outcome, refusals included, goes to ``reply``."""
        task = asyncio.get_running_loop().create_task(self._submit_after(miss, accept, reply))
        self._loading.add(task)
        task.add_done_callback(self._loading.discard)

    async def _submit_after(self, miss: SessionMiss, accept: Callable[[], tuple[Accepted, Encode]],
                            reply: Reply) -> None:
        try:
            accepted, encode = await after_loading(miss, accept)
            self.submit_nowait(accepted, encode, reply)
        except Exception as exc:  # the client gets an answer whatever went wrong
            reply(None, as_service_error(exc, log, "act failed"))

    def submit_nowait(self, accepted: Accepted, encode: Encode, reply: Reply) -> None:
        """Queue an accepted request; ``reply(encode(accepted, output, info), None)`` or
        ``reply(None, error)`` runs on the event loop once its batch is over (the sessions
        are released before ``encode`` runs). Raises 503 at once when the queue is full."""
        batcher = accepted.policy.batcher
        assert batcher is not None  # _accept refused a policy without one

        def done(output: Any, info: BatchInfo | None, error: ServiceError | None) -> None:
            self._done_with(accepted)
            if error is not None:
                reply(None, error)
                return
            assert info is not None  # set with every result
            try:
                payload = encode(accepted, output, info)
            except Exception as exc:  # the client gets an answer whatever went wrong
                reply(None, as_service_error(exc, log, "act: encoding the response failed"))
                return
            reply(payload, None)

        try:
            batcher.submit_nowait(accepted.job, done)
        except BaseException:
            self._done_with(accepted)
            raise

    async def submit(self, accepted: Accepted) -> tuple[StepOutput, BatchInfo]:
        """Queue an accepted request and wait for its rows of the batch output."""
        batcher = accepted.policy.batcher
        assert batcher is not None  # _accept refused a policy without one
        try:
            return await batcher.submit(accepted.job)
        finally:
            self._done_with(accepted)

    def observe_latency(self, accepted: Accepted, route: str) -> None:
        seconds = time.perf_counter() - accepted.started
        if self.metrics is not None:
            self.metrics.route_latency(accepted.name, route).observe(seconds)
        self.observe_version(accepted, seconds)

    def observe_version(self, accepted: Accepted, seconds: float | None = None) -> None:
        """One request answered by its version (the live results: requests, latency)."""
        if seconds is None:
            seconds = time.perf_counter() - accepted.started
        policy = accepted.policy
        results = policy.live
        if results is None:
            results = policy.live = self.registry.live.of(policy.name, policy.version)
        results.request(seconds)

    # ------------------------------------------------------------------ accept

    def _accept(self, name: str, version: str | None, rows: Rows, options: ActRequest | _Options,
                started: float) -> Accepted:
        """Everything before the batch: resolve, validate, bind sessions, build the job.
        Raises before any session changed if the request is refused. ``options`` is the
        JSON request itself (no copy on the hot path) or another format's ``_Options``."""
        if self.access_log:
            note_rows(len(rows))  # the access log's line of this request, refused or not
        return self.bind(self._check(name, version, rows, options, started))

    def check_rows(self, name: str, version: str | None, rows: Rows, *, explore: bool | None,
                   extras: frozenset[str] = _NO_KEYS, unsquash: bool | None = None, clip: bool | None = None,
                   started: float | None = None, episode: EpisodeDraw | None = None) -> Checked:
        """The first half of ``accept_rows``: resolved and validated, no session touched yet.
        A caller that submits several requests as one (a policy set's step, one request per
        policy) checks them all before it ``bind``s any, so a refusal leaves every session as it was."""
        options = _Options(explore, extras, unsquash, clip)
        return self._check(name, version, rows, options, time.perf_counter() if started is None else started,
                           episode)

    def _check(self, name: str, version: str | None, rows: Rows, options: ActRequest | _Options,
               started: float, episode: EpisodeDraw | None = None) -> Checked:
        entry = self.registry.entry(name)
        policy, binding = self._resolve(entry, version, rows, episode)
        if policy.batcher is None:
            raise NotReady(f"model {policy.key} is not serving yet")
        expect_steps = None if options.step is None else replay.expected_steps(int(options.step), rows)
        step = policy.preparer.prepare(rows, explore=options.explore,
                                       extras=frozenset(options.outputs) if options.outputs else _NO_KEYS,
                                       epsilon=options.epsilon)
        if options.step is not None:
            step.keep_answer, step.expect_steps = True, expect_steps
        policy.batcher.check_capacity(step.rows)  # before sessions change
        return Checked(started, name, policy, rows, binding, step, options, entry.sessions)

    def bind(self, checked: Checked) -> Accepted:
        """The second half: apply the checked request to its sessions and build its job."""
        started, name, policy, rows, binding, step, options = (
            checked.started, checked.name, checked.policy, checked.rows, checked.binding, checked.step,
            checked.options)
        bound = None if binding is _NO_SESSIONS else checked.lifecycle.bind(
            binding, policy.version, rows.episode_starts, rows.seeds, rows.single, rows.rewards, rows.ends)
        if bound is not None:
            step.take_sessions(bound)
        sessions = step.sessions
        if not step.has_sessions:
            keys = _NO_KEYS
        elif rows.single:
            first = sessions[0]
            assert first is not None  # a single row with a session_id was bound by _resolve
            keys = frozenset((first.id,))
        else:
            keys = frozenset(s.id for s in sessions if s is not None)
        unsquash = policy.unsquash_default if options.unsquash_actions is None else options.unsquash_actions
        # RLlib clips only what it does not unsquash (unsquashing already lands in the bounds).
        clip = (policy.clip_default and not unsquash) if options.clip_actions is None else options.clip_actions
        if not policy.pipeline.bounds_apply:  # no float Box action: both would return the actions as they are
            unsquash = clip = False
        step.unsquash, step.clip = unsquash, clip  # the experience log records the answered action
        return Accepted(started, name, policy, rows.single, unsquash, clip, options.debug, step,
                        Job(step, step.rows, keys), bound)

    def _finish(self, accepted: Accepted, output: StepOutput | KeptAnswer, info: BatchInfo) -> bytes:
        payload = self.answer(accepted, output, info)
        self.observe_latency(accepted, "act")
        return _ENCODER.encode(payload)

    def answer(self, accepted: Accepted, output: StepOutput | KeptAnswer, info: BatchInfo) -> ActResponse:
        """A request's rows of its batch as the act answer (a retried step's kept answer)."""
        if isinstance(output, KeptAnswer):  # a retried step, answered before
            return replay.kept_response(accepted.policy, accepted.step, accepted.unsquash, accepted.clip, output)
        return self._response(accepted, output, info)

    finish = _finish  # the act answer's encoder, for act bodies decoded elsewhere (``act.raw``)

    # ------------------------------------------------------------------ sessions

    @staticmethod
    def _resolve(entry: ModelEntry, version: str | None, rows: Rows, episode: EpisodeDraw | None = None
                 ) -> tuple[Policy, Binding]:
        """Which policy serves the request and which sessions it touches (no mutation). A
        request that names no version and binds no live session is drawn (``traffic``):
        per request when stateless, else from its first new session's id, or ``episode``'s
        (a policy set's episode: its version for this member when it has one, else its id)."""
        if not rows.has_sessions:
            if version is None and entry.traffic.weights is not None:
                version = entry.traffic.draw(None)
            return entry.policy(version), _NO_SESSIONS
        binding = entry.sessions.resolve(rows.session_ids, rows.episode_starts, version, rows.single)
        if binding.version is not None:
            return entry.policy(binding.version), binding
        if version is None and entry.traffic.weights is not None:
            if episode is not None:
                version = episode.version or entry.traffic.draw(episode.id)
            else:
                version = entry.traffic.draw(binding.new[0][1] if binding.new else None)
        elif version is None and episode is not None:
            version = episode.version
        return entry.policy(version), binding

    def abandon(self, accepted: Accepted) -> None:
        """Let go of a bound request that will not be submitted (one part of a request
        refused after another part was bound): its sessions are unpinned."""
        self._done_with(accepted)

    @staticmethod
    def _done_with(accepted: Accepted) -> None:
        """The request's batch is over (or it never got queued): unpin its sessions."""
        if accepted.bound is not None:
            accepted.bound.release()

    # ------------------------------------------------------------------ response

    @staticmethod
    def _response(accepted: Accepted, output: StepOutput, info: BatchInfo) -> ActResponse:
        policy, step, single = accepted.policy, accepted.step, accepted.single
        batch, start, stop = output.batch, output.start, output.stop
        pick = _item if single else _rows  # the single form answers with the row itself
        raw_action = pick(batch.actions_json, start, stop)
        if accepted.unsquash or accepted.clip:
            actions = output.actions()
            if accepted.unsquash:
                actions = policy.pipeline.unsquash(actions)
            if accepted.clip:
                actions = policy.pipeline.clip(actions)
            encoded = codec.encode_batch(policy.pipeline.action_space, actions)
            action = encoded[0] if single else encoded
        else:
            action = raw_action
        response = ActResponse(model=policy.name, version=policy.version, explore=step.explore,
                               logp=None if batch.logp is None else pick(batch.logp, start, stop))
        if single:
            response.action = action
        else:
            response.actions = action
        extras = step.extras
        if extras:
            if "value" in extras and batch.value is not None:
                response.value = pick(batch.value, start, stop)
            if "entropy" in extras:
                response.entropy = None if batch.entropy is None else pick(batch.entropy, start, stop)
            if "dist_inputs" in extras and batch.dist_inputs is not None:
                response.dist_inputs = pick(batch.dist_inputs, start, stop)
            if "q_values" in extras and batch.dist_inputs is not None:  # a Q-policy's dist_inputs
                response.q_values = pick(batch.dist_inputs, start, stop)
            if "raw_action" in extras:
                response.raw_action = raw_action
        if step.has_sessions:
            ids = [None if s is None else s.id for s in step.sessions]
            if single:
                response.session_id = ids[0]
            else:
                response.session_ids = ids
        if step.event_ids is not None:  # the experience log recorded these rows
            if single:
                response.event_id = step.event_ids[0] or msgspec.UNSET
            else:
                response.event_ids = step.event_ids
        if accepted.debug:
            response.debug = BatchDebug(
                batch_id=info.batch_id, batch_rows=info.rows, batch_requests=info.requests,
                queue_ms=round(accepted.job.queue_s * 1e3, 4), run_ms=round(info.run_s * 1e3, 4))
        return response


response_of = ActService._response  # a request's rows of its batch as the act answer (``rlserve.service.multiagent``)


def _item(values: list[Any], start: int, stop: int) -> Any:
    return values[start]


def _rows(values: list[Any], start: int, stop: int) -> list[Any]:
    return values[start:stop]
