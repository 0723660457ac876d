"""Python client for rlserve, sync and async, on httpx.

Two layers:

- ``act`` / ``act_batch``: one HTTP call each, the wire format as it is.
- The episode API, in the spirit of RLlib's ``PolicyClient``: ``start_episode``,
  ``get_action``, ``log_action``, ``log_returns``, ``end_episode``. Rewards logged with
  ``log_returns`` are summed and sent with the next observation, which is when the server
  feeds them to the model as the previous reward.

Retries happen only where a repeat cannot change what the server did: a 503 ``queue_full``
(the request was refused before it touched any session; the ``Retry-After`` header is
honoured) and a connection that failed before the request was sent. A timeout after the
request was sent is never retried for ``act``, since the session may already have stepped.

Errors mirror the service's error codes (``error.code`` in every JSON error body); their
classes are in ``rlserve.client.errors`` and importable from ``rlserve.client``.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from collections.abc import Sequence
from typing import Any

import httpx

# The error classes were defined here first; they stay importable from this module.
from rlserve.client.errors import (  # noqa: F401
    AllActionsMaskedError,
    AuthError,
    BadRequestError,
    ConflictError,
    ConnectionFailed,
    InvalidInputError,
    ModelNotFoundError,
    NotFoundError,
    OverloadedError,
    RLServeError,
    ServerError,
    SessionExpiredError,
    SessionNotFoundError,
    error_from_response,
)
from rlserve.client.stream import AsyncStream, Stream
from rlserve.client.wire import ActResult, _act_body, _batch_body, _Episode

__all__ = [
    "ActResult",
    "AsyncPolicyClient",
    "PolicyClient",
    "RLServeError",
]


_UNSET: Any = object()  # "not given", distinct from a JSON null


class _Base:
    def __init__(self, base_url: str, model: str, *, version: str | None = None,
                 token: str | None = None, timeout: float = 10.0, max_retries: int = 3,
                 explore: bool | None = None):
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.version = version
        self.explore = explore
        self.max_retries = max_retries
        self._headers = {"authorization": f"Bearer {token}"} if token else {}
        self._timeout = timeout
        self._episodes: dict[str, _Episode] = {}

    def _stream_options(self, options: dict[str, Any]) -> dict[str, Any]:
        """A stream's options with this client's version, explore default, token and timeout."""
        options.setdefault("version", self.version)
        options.setdefault("explore", self.explore)
        return {"headers": self._headers, "timeout": self._timeout, **options}

    @property
    def _act_path(self) -> str:
        if self.version:
            return f"/v1/models/{self.model}/versions/{self.version}/act"
        return f"/v1/models/{self.model}/act"

    @staticmethod
    def _retry_delay(error: RLServeError, attempt: int) -> float | None:
        """Seconds to wait before a safe retry, or None when the error is not retryable."""
        if isinstance(error, OverloadedError) and error.code == "queue_full":
            return error.retry_after if error.retry_after is not None else 0.05 * 2 ** attempt
        if isinstance(error, ConnectionFailed):
            return 0.05 * 2 ** attempt
        return None

    def _delay_or_raise(self, error: RLServeError, attempt: int) -> float:
        """The wait before retry number ``attempt + 1``; raises ``error`` when none is allowed."""
        delay = self._retry_delay(error, attempt)
        if delay is None or attempt >= self.max_retries:
            raise error
        return delay

    def _transport_error(self, exc: httpx.TransportError, method: str, path: str,
                         retry_on_timeout: bool) -> RLServeError:
        """A failed connect may be retried; a timeout after sending only when asked."""
        if isinstance(exc, httpx.TimeoutException) and not isinstance(exc, httpx.ConnectTimeout) \
                and not retry_on_timeout:
            raise ConnectionFailed(f"{method} {path} timed out after sending: {exc}") from exc
        return _connect_error(exc, self.base_url + path)

    def _session_body(self, session_id: str | None, seed: int | None) -> dict[str, Any]:
        return {k: v for k, v in (("session_id", session_id), ("seed", seed), ("version", self.version))
                if v is not None}

    def _close_episode(self, episode_id: str) -> _Episode:
        episode = self._episodes.pop(episode_id, None)
        if episode is None:
            raise SessionNotFoundError(f"episode {episode_id!r} is not open", field="episode_id", received=episode_id)
        return episode

    def _episode(self, episode_id: str) -> _Episode:
        try:
            return self._episodes[episode_id]
        except KeyError:
            raise SessionNotFoundError(f"episode {episode_id!r} was not started by this client",
                                       field="episode_id", received=episode_id) from None

    def _episode_act_body(self, episode_id: str, observation: Any, action_mask: Any,
                          outputs: Sequence[str] | None) -> dict[str, Any]:
        episode = self._episode(episode_id)
        body = _act_body(observation, session_id=episode.session_id, explore=self.explore,
                         reward=episode.pending_reward, prev_action=episode.pending_action,
                         has_prev_action=episode.has_pending_action, episode_start=False,
                         action_mask=action_mask, seed=None, outputs=outputs, extra=None)
        return body

    def _final_act_body(self, episode_id: str, observation: Any, truncated: bool) -> dict[str, Any]:
        """The episode's last observation, with its pending reward and how it ended."""
        body = self._episode_act_body(episode_id, observation, None, None)
        body["truncated" if truncated else "terminated"] = True
        return body

    def _after_episode_act(self, episode_id: str) -> None:
        episode = self._episodes[episode_id]
        episode.pending_reward = None
        episode.pending_action = None
        episode.has_pending_action = False

    def _log_returns(self, episode_id: str, reward: float) -> None:
        episode = self._episode(episode_id)
        episode.pending_reward = (episode.pending_reward or 0.0) + float(reward)
        episode.total_reward += float(reward)

    def _log_action(self, episode_id: str, action: Any) -> None:
        episode = self._episode(episode_id)
        episode.pending_action = action
        episode.has_pending_action = True


def _connect_error(exc: httpx.TransportError, url: str) -> RLServeError:
    return ConnectionFailed(f"could not reach {url}: {exc}")


# --------------------------------------------------------------------------- sync

class PolicyClient(_Base):
    """Blocking client. Use as a context manager or call ``close()``."""

    def __init__(self, base_url: str, model: str, **kwargs: Any):
        """A client of model ``model`` at ``base_url`` (e.g. ``"http://127.0.0.1:8000"``).

        ``version`` pins a model version (default: the current one, or the version a
        session is bound to); ``token`` is sent as ``Authorization: Bearer`` (needed only by
        the admin API); ``timeout`` is in seconds per HTTP call; ``max_retries`` bounds the
        safe retries (a full queue, a refused connection); ``explore`` is the default of
        every act call that does not say (None: the model's own default).
        """
        super().__init__(base_url, model, **kwargs)
        self._http = httpx.Client(base_url=self.base_url, headers=self._headers, timeout=self._timeout)

    def __enter__(self) -> PolicyClient:
        """The client itself; leaving the ``with`` block closes it."""
        return self

    def __exit__(self, *exc: object) -> None:
        """Close the HTTP connections."""
        self.close()

    def close(self) -> None:
        """Close the HTTP connections (the client cannot be used afterwards)."""
        self._http.close()

    def _request(self, method: str, path: str, *, json: Any = None, retry_on_timeout: bool = False) -> Any:
        for attempt in itertools.count():
            try:
                response = self._http.request(method, path, json=json)
            except (httpx.ConnectError, httpx.TimeoutException) as exc:
                error = self._transport_error(exc, method, path, retry_on_timeout)
            else:
                if response.is_success:
                    return response.json()
                error = error_from_response(response)
            time.sleep(self._delay_or_raise(error, attempt))

    # -- wire-level calls
    def act(self, observation: Any, *, session_id: str | None = None, explore: bool | None = None,
            reward: float | None = None, episode_start: bool = False, action_mask: Any = None,
            seed: int | None = None, outputs: Sequence[str] | None = None,
            prev_action: Any = _UNSET, **extra: Any) -> ActResult:
        """One observation in, one action out: ``POST /v1/models/{model}/act``.

        ``observation`` is in the observation space's JSON structure (lists for a Box, a
        dict for a Dict space). With ``session_id`` the session's recurrent state, previous
        actions and rewards are used and updated on the server; ``reward`` is the reward of
        the previous step, ``episode_start=True`` resets (or creates) the session, and
        ``seed`` seeds its sampler when it starts. ``explore=False`` takes the
        distribution's deterministic action. ``action_mask`` is a 0/1 list per categorical
        action. ``outputs`` asks for extras: ``"value"``, ``"entropy"``, ``"dist_inputs"``,
        ``"raw_action"`` (``"q_values"`` for Q-policies). ``prev_action`` reports the action
        actually taken at the previous step, if not the one served. Other request fields
        (``step``, ``epsilon``, ``clip_actions``, ``window``, ...) pass through ``extra``.
        Returns an ``ActResult`` (``.action``, ``.logp``, ``.raw``); raises an
        ``RLServeError`` subclass for a refusal (``InvalidInputError`` for a bad observation).
        """
        body = _act_body(observation, session_id=session_id,
                         explore=self.explore if explore is None else explore, reward=reward,
                         prev_action=prev_action, has_prev_action=prev_action is not _UNSET,
                         episode_start=episode_start, action_mask=action_mask, seed=seed,
                         outputs=outputs, extra=extra)
        return ActResult.from_json(self._request("POST", self._act_path, json=body))

    def act_batch(self, observations: Sequence[Any], *, session_ids: Sequence[str | None] | None = None,
                  explore: bool | None = None, rewards: Sequence[float | None] | None = None,
                  episode_starts: Sequence[bool] | None = None, action_masks: Sequence[Any] | None = None,
                  outputs: Sequence[str] | None = None, **extra: Any) -> ActResult:
        """Many observations in one call: the batch form of ``act``.

        Per-row lists (``session_ids``, ``rewards``, ``episode_starts``, ``action_masks``,
        and ``seeds`` through ``extra``) have one entry per observation, None for "not
        given". Returns an ``ActResult`` with ``.actions`` and ``.logps``.
        """
        body = _batch_body(observations, session_ids=session_ids,
                           explore=self.explore if explore is None else explore, rewards=rewards,
                           episode_starts=episode_starts, action_masks=action_masks,
                           outputs=outputs, extra=extra)
        return ActResult.from_json(self._request("POST", self._act_path, json=body))

    def create_session(self, session_id: str | None = None, *, seed: int | None = None) -> dict[str, Any]:
        """Create a session (``POST /v1/models/{model}/sessions``); returns its JSON.

        Without ``session_id`` the server makes one up (in the answer's ``session_id``);
        ``seed`` makes the session's sampled actions replay exactly. A live id is a
        ``ConflictError``.
        """
        body = self._session_body(session_id, seed)
        return self._request("POST", f"/v1/models/{self.model}/sessions", json=body)

    def end_session(self, session_id: str) -> dict[str, Any]:
        """End a session (``DELETE``); its id then answers ``SessionExpiredError`` (410)."""
        return self._request("DELETE", f"/v1/models/{self.model}/sessions/{session_id}")

    def stream(self, **options: Any) -> Stream:
        """Open a stream of one session (``seed``, ``explore``, ``outputs``, ``session_id`` to
        resume, ``binary`` for msgpack frames): ``step(observation, reward=...)`` per step."""
        return Stream(self.base_url, self.model, **self._stream_options(options))

    def model_info(self) -> dict[str, Any]:
        """The model's metadata (``GET /v1/models/{model}``): spaces, config, state layout, versions."""
        return self._request("GET", f"/v1/models/{self.model}", retry_on_timeout=True)

    # -- episode API
    def start_episode(self, episode_id: str | None = None, *, seed: int | None = None) -> str:
        """Start an episode (a new server session); returns its id for the episode calls.

        ``episode_id`` names it (default: a random hex id); ``seed`` as in ``create_session``.
        """
        episode_id = episode_id or uuid.uuid4().hex
        info = self.create_session(episode_id, seed=seed)
        self._episodes[episode_id] = _Episode(session_id=info["session_id"])
        return episode_id

    def get_action(self, episode_id: str, observation: Any, *, action_mask: Any = None) -> Any:
        """The action for ``observation`` in episode ``episode_id``.

        Sends the rewards logged with ``log_returns`` since the last call (summed: the server
        feeds them to the model as the previous reward) and an action reported with
        ``log_action``, then forgets both.
        """
        body = self._episode_act_body(episode_id, observation, action_mask, None)
        result = ActResult.from_json(self._request("POST", self._act_path, json=body))
        self._after_episode_act(episode_id)
        return result.action

    def log_action(self, episode_id: str, action: Any) -> None:
        """Report the action the environment really took (sent with the next observation)."""
        self._log_action(episode_id, action)

    def log_returns(self, episode_id: str, reward: float) -> None:
        """Add ``reward`` to the episode's pending reward (sent with the next observation) and its total."""
        self._log_returns(episode_id, reward)

    def end_episode(self, episode_id: str, observation: Any = _UNSET, *, truncated: bool = False) -> float:
        """End the episode's server session; returns the episode's total logged reward.

        With the episode's last ``observation``, send it first (with the pending reward,
        marked terminated, or truncated with ``truncated=True``), so the server's
        experience log closes the episode; that call's action is not played.
        """
        if observation is not _UNSET:
            self._request("POST", self._act_path, json=self._final_act_body(episode_id, observation, truncated))
        episode = self._close_episode(episode_id)
        self.end_session(episode.session_id)
        return episode.total_reward


# --------------------------------------------------------------------------- async

class AsyncPolicyClient(_Base):
    """asyncio client with the same methods as ``PolicyClient`` (awaitable)."""

    def __init__(self, base_url: str, model: str, **kwargs: Any):
        """As ``PolicyClient``, for asyncio: every HTTP call is awaited."""
        super().__init__(base_url, model, **kwargs)
        self._http = httpx.AsyncClient(base_url=self.base_url, headers=self._headers, timeout=self._timeout)

    async def __aenter__(self) -> AsyncPolicyClient:
        """The client itself; leaving the ``async with`` block closes it."""
        return self

    async def __aexit__(self, *exc: object) -> None:
        """Close the HTTP connections."""
        await self.aclose()

    async def aclose(self) -> None:
        """Close the HTTP connections (the client cannot be used afterwards)."""
        await self._http.aclose()

    async def _request(self, method: str, path: str, *, json: Any = None, retry_on_timeout: bool = False) -> Any:
        for attempt in itertools.count():
            try:
                response = await self._http.request(method, path, json=json)
            except (httpx.ConnectError, httpx.TimeoutException) as exc:
                error = self._transport_error(exc, method, path, retry_on_timeout)
            else:
                if response.is_success:
                    return response.json()
                error = error_from_response(response)
            await asyncio.sleep(self._delay_or_raise(error, attempt))

    async def act(self, observation: Any, *, session_id: str | None = None, explore: bool | None = None,
                  reward: float | None = None, episode_start: bool = False, action_mask: Any = None,
                  seed: int | None = None, outputs: Sequence[str] | None = None,
                  prev_action: Any = _UNSET, **extra: Any) -> ActResult:
        """Awaitable: one observation in, one action out: ``POST /v1/models/{model}/act``.

        Arguments, result and errors as ``PolicyClient.act``.
        """
        body = _act_body(observation, session_id=session_id,
                         explore=self.explore if explore is None else explore, reward=reward,
                         prev_action=prev_action, has_prev_action=prev_action is not _UNSET,
                         episode_start=episode_start, action_mask=action_mask, seed=seed,
                         outputs=outputs, extra=extra)
        return ActResult.from_json(await self._request("POST", self._act_path, json=body))

    async def act_batch(self, observations: Sequence[Any], *, session_ids: Sequence[str | None] | None = None,
                        explore: bool | None = None, rewards: Sequence[float | None] | None = None,
                        episode_starts: Sequence[bool] | None = None, action_masks: Sequence[Any] | None = None,
                        outputs: Sequence[str] | None = None, **extra: Any) -> ActResult:
        """Awaitable: many observations in one call: the batch form of ``act``.

        Arguments, result and errors as ``PolicyClient.act_batch``.
        """
        body = _batch_body(observations, session_ids=session_ids,
                           explore=self.explore if explore is None else explore, rewards=rewards,
                           episode_starts=episode_starts, action_masks=action_masks,
                           outputs=outputs, extra=extra)
        return ActResult.from_json(await self._request("POST", self._act_path, json=body))

    async def create_session(self, session_id: str | None = None, *, seed: int | None = None) -> dict[str, Any]:
        """Awaitable: create a session (``POST /v1/models/{model}/sessions``); returns its JSON.

        Arguments, result and errors as ``PolicyClient.create_session``.
        """
        body = self._session_body(session_id, seed)
        return await self._request("POST", f"/v1/models/{self.model}/sessions", json=body)

    async def end_session(self, session_id: str) -> dict[str, Any]:
        """Awaitable: end a session (``DELETE``); its id then answers ``SessionExpiredError`` (410).

        Arguments, result and errors as ``PolicyClient.end_session``.
        """
        return await self._request("DELETE", f"/v1/models/{self.model}/sessions/{session_id}")

    def stream(self, **options: Any) -> AsyncStream:
        """``PolicyClient.stream`` for asyncio: ``async with client.stream(seed=1) as stream``."""
        return AsyncStream(self.base_url, self.model, **self._stream_options(options))

    async def model_info(self) -> dict[str, Any]:
        """Awaitable: the model's metadata (``GET /v1/models/{model}``): spaces, config, state layout, versions.

        Arguments, result and errors as ``PolicyClient.model_info``.
        """
        return await self._request("GET", f"/v1/models/{self.model}", retry_on_timeout=True)

    async def start_episode(self, episode_id: str | None = None, *, seed: int | None = None) -> str:
        """Awaitable: start an episode (a new server session); returns its id for the episode calls.

        Arguments, result and errors as ``PolicyClient.start_episode``.
        """
        episode_id = episode_id or uuid.uuid4().hex
        info = await self.create_session(episode_id, seed=seed)
        self._episodes[episode_id] = _Episode(session_id=info["session_id"])
        return episode_id

    async def get_action(self, episode_id: str, observation: Any, *, action_mask: Any = None) -> Any:
        """Awaitable: the action for ``observation`` in episode ``episode_id``.

        Arguments, result and errors as ``PolicyClient.get_action``.
        """
        body = self._episode_act_body(episode_id, observation, action_mask, None)
        result = ActResult.from_json(await self._request("POST", self._act_path, json=body))
        self._after_episode_act(episode_id)
        return result.action

    def log_action(self, episode_id: str, action: Any) -> None:
        """Report the action the environment really took (sent with the next observation).

        Not awaited: it only records.
        """
        self._log_action(episode_id, action)

    def log_returns(self, episode_id: str, reward: float) -> None:
        """Add ``reward`` to the episode's pending reward (sent with the next observation) and its total.

        Not awaited: it only records.
        """
        self._log_returns(episode_id, reward)

    async def end_episode(self, episode_id: str, observation: Any = _UNSET, *, truncated: bool = False) -> float:
        """Awaitable: end the episode's server session; returns the episode's total logged reward.

        Arguments, result and errors as ``PolicyClient.end_episode``.
        """
        if observation is not _UNSET:
            await self._request("POST", self._act_path, json=self._final_act_body(episode_id, observation, truncated))
        episode = self._close_episode(episode_id)
        await self.end_session(episode.session_id)
        return episode.total_reward
