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

Errors mirror the service's error codes (``error.code`` in every JSON error body).
"""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

__all__ = [
    "ActResult",
    "AsyncPolicyClient",
    "PolicyClient",
    "RLServeError",
]


_UNSET: Any = object()  # "not given", distinct from a JSON null


# --------------------------------------------------------------------------- errors

class RLServeError(Exception):
    """An error answer from the service (or no answer at all: ``status`` 0)."""

    status: int = 0
    code: str = "error"

    def __init__(self, message: str, *, status: int = 0, code: str | None = None,
                 field: str | None = None, expected: Any = None, received: Any = None,
                 retry_after: float | None = None):
        super().__init__(message)
        self.message = message
        self.status = status or type(self).status
        self.code = code or type(self).code
        self.field = field
        self.expected = expected
        self.received = received
        self.retry_after = retry_after

    def __str__(self) -> str:
        where = f" (field {self.field!r})" if self.field else ""
        return f"[{self.status} {self.code}]{where} {self.message}"


class BadRequestError(RLServeError):
    status, code = 400, "bad_request"


class AuthError(RLServeError):
    status, code = 401, "unauthorized"


class NotFoundError(RLServeError):
    status, code = 404, "not_found"


class ModelNotFoundError(NotFoundError):
    code = "model_not_found"


class SessionNotFoundError(NotFoundError):
    code = "session_not_found"


class ConflictError(RLServeError):
    status, code = 409, "conflict"


class SessionExpiredError(RLServeError):
    status, code = 410, "session_expired"


class InvalidInputError(RLServeError):
    status, code = 422, "invalid_input"


class AllActionsMaskedError(InvalidInputError):
    code = "all_actions_masked"


class OverloadedError(RLServeError):
    status, code = 503, "queue_full"


class ServerError(RLServeError):
    status, code = 500, "internal_error"


class ConnectionFailed(RLServeError):
    status, code = 0, "connection_failed"


_BY_CODE: dict[str, type[RLServeError]] = {
    "model_not_found": ModelNotFoundError,
    "session_not_found": SessionNotFoundError,
    "session_expired": SessionExpiredError,
    "all_actions_masked": AllActionsMaskedError,
    "queue_full": OverloadedError,
}
_BY_STATUS: dict[int, type[RLServeError]] = {
    400: BadRequestError, 401: AuthError, 403: AuthError, 404: NotFoundError,
    409: ConflictError, 410: SessionExpiredError, 422: InvalidInputError, 503: OverloadedError,
}


def error_from_response(response: httpx.Response) -> RLServeError:
    """Build the typed error for a non-2xx answer."""
    try:
        body = response.json().get("error", {})
    except (ValueError, AttributeError):
        body = {}
    code = body.get("code") or f"http_{response.status_code}"
    cls = _BY_CODE.get(code) or _BY_STATUS.get(response.status_code)
    if cls is None:
        cls = ServerError if response.status_code >= 500 else RLServeError
    retry_after = response.headers.get("retry-after")
    return cls(
        body.get("message") or response.text[:200] or response.reason_phrase,
        status=response.status_code,
        code=code,
        field=body.get("field"),
        expected=body.get("expected"),
        received=body.get("received"),
        retry_after=float(retry_after) if retry_after and retry_after.replace(".", "", 1).isdigit() else None,
    )


# --------------------------------------------------------------------------- results

@dataclass
class ActResult:
    """One act answer: single form fills ``action``/``logp``; batch form ``actions``/``logps``."""

    model: str
    version: str
    raw: dict[str, Any]
    action: Any = None
    logp: float | None = None
    actions: list[Any] = field(default_factory=list)
    logps: list[float | None] = field(default_factory=list)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ActResult:
        result = cls(model=data["model"], version=data["version"], raw=data)
        if "action" in data:
            result.action, result.logp = data["action"], data.get("logp")
        if "actions" in data:
            result.actions, result.logps = data["actions"], list(data.get("logp") or [])
        return result

    @property
    def value(self) -> Any:
        return self.raw.get("value")

    @property
    def entropy(self) -> Any:
        return self.raw.get("entropy")


@dataclass
class _Episode:
    session_id: str
    pending_reward: float | None = None
    pending_action: Any = None
    has_pending_action: bool = False
    started: bool = True
    total_reward: float = 0.0


def _act_body(observation: Any, *, session_id: str | None, explore: bool | None,
              reward: float | None, prev_action: Any, has_prev_action: bool, episode_start: bool,
              action_mask: Any, seed: int | None, outputs: Sequence[str] | None,
              extra: dict[str, Any] | None) -> dict[str, Any]:
    body: dict[str, Any] = {"observation": observation}
    if session_id is not None:
        body["session_id"] = session_id
    if explore is not None:
        body["explore"] = explore
    if reward is not None:
        body["reward"] = reward
    if has_prev_action:
        body["prev_action"] = prev_action
    if episode_start:
        body["episode_start"] = True
    if action_mask is not None:
        body["action_mask"] = action_mask
    if seed is not None:
        body["seed"] = seed
    if outputs:
        body["outputs"] = list(outputs)
    if extra:
        body.update(extra)
    return body


def _batch_body(observations: Sequence[Any], *, session_ids: Sequence[str | None] | None,
                explore: bool | None, rewards: Sequence[float | None] | None,
                episode_starts: Sequence[bool] | None, action_masks: Sequence[Any] | None,
                outputs: Sequence[str] | None, extra: dict[str, Any] | None) -> dict[str, Any]:
    body: dict[str, Any] = {"observations": list(observations)}
    for key, value in (("session_ids", session_ids), ("rewards", rewards),
                       ("episode_starts", episode_starts), ("action_masks", action_masks)):
        if value is not None:
            body[key] = list(value)
    if explore is not None:
        body["explore"] = explore
    if outputs:
        body["outputs"] = list(outputs)
    if extra:
        body.update(extra)
    return body


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
        super().__init__(base_url, model, **kwargs)
        self._http = httpx.Client(base_url=self.base_url, headers=self._headers, timeout=self._timeout)

    def __enter__(self) -> PolicyClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
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
        body = _batch_body(observations, session_ids=session_ids,
                           explore=self.explore if explore is None else explore, rewards=rewards,
                           episode_starts=episode_starts, action_masks=action_masks,
                           outputs=outputs, extra=extra)
        return ActResult.from_json(self._request("POST", self._act_path, json=body))

    def create_session(self, session_id: str | None = None, *, seed: int | None = None) -> dict[str, Any]:
        body = self._session_body(session_id, seed)
        return self._request("POST", f"/v1/models/{self.model}/sessions", json=body)

    def end_session(self, session_id: str) -> dict[str, Any]:
        return self._request("DELETE", f"/v1/models/{self.model}/sessions/{session_id}")

    def model_info(self) -> dict[str, Any]:
        return self._request("GET", f"/v1/models/{self.model}", retry_on_timeout=True)

    # -- episode API
    def start_episode(self, episode_id: str | None = None, *, seed: int | None = None) -> str:
        episode_id = episode_id or uuid.uuid4().hex
        info = self.create_session(episode_id, seed=seed)
        self._episodes[episode_id] = _Episode(session_id=info["session_id"])
        return episode_id

    def get_action(self, episode_id: str, observation: Any, *, action_mask: Any = None) -> Any:
        body = self._episode_act_body(episode_id, observation, action_mask, None)
        result = ActResult.from_json(self._request("POST", self._act_path, json=body))
        self._after_episode_act(episode_id)
        return result.action

    def log_action(self, episode_id: str, action: Any) -> None:
        """Report the action the environment really took (sent with the next observation)."""
        self._log_action(episode_id, action)

    def log_returns(self, episode_id: str, reward: float) -> None:
        self._log_returns(episode_id, reward)

    def end_episode(self, episode_id: str, observation: Any = _UNSET, *, truncated: bool = False) -> float:
        """Delete the server session; returns the episode's logged total reward. With the
        episode's last ``observation``, send it first (with the pending reward, marked
        terminated, or truncated), so the server's experience log closes the episode."""
        if observation is not _UNSET:
            self._request("POST", self._act_path, json=self._final_act_body(episode_id, observation, truncated))
        episode = self._close_episode(episode_id)
        self.end_session(episode.session_id)
        return episode.total_reward


# --------------------------------------------------------------------------- async

class AsyncPolicyClient(_Base):
    """asyncio client with the same methods as ``PolicyClient`` (awaitable)."""

    def __init__(self, base_url: str, model: str, **kwargs: Any):
        super().__init__(base_url, model, **kwargs)
        self._http = httpx.AsyncClient(base_url=self.base_url, headers=self._headers, timeout=self._timeout)

    async def __aenter__(self) -> AsyncPolicyClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
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
        body = _batch_body(observations, session_ids=session_ids,
                           explore=self.explore if explore is None else explore, rewards=rewards,
                           episode_starts=episode_starts, action_masks=action_masks,
                           outputs=outputs, extra=extra)
        return ActResult.from_json(await self._request("POST", self._act_path, json=body))

    async def create_session(self, session_id: str | None = None, *, seed: int | None = None) -> dict[str, Any]:
        body = self._session_body(session_id, seed)
        return await self._request("POST", f"/v1/models/{self.model}/sessions", json=body)

    async def end_session(self, session_id: str) -> dict[str, Any]:
        return await self._request("DELETE", f"/v1/models/{self.model}/sessions/{session_id}")

    async def model_info(self) -> dict[str, Any]:
        return await self._request("GET", f"/v1/models/{self.model}", retry_on_timeout=True)

    async def start_episode(self, episode_id: str | None = None, *, seed: int | None = None) -> str:
        episode_id = episode_id or uuid.uuid4().hex
        info = await self.create_session(episode_id, seed=seed)
        self._episodes[episode_id] = _Episode(session_id=info["session_id"])
        return episode_id

    async def get_action(self, episode_id: str, observation: Any, *, action_mask: Any = None) -> Any:
        body = self._episode_act_body(episode_id, observation, action_mask, None)
        result = ActResult.from_json(await self._request("POST", self._act_path, json=body))
        self._after_episode_act(episode_id)
        return result.action

    def log_action(self, episode_id: str, action: Any) -> None:
        self._log_action(episode_id, action)

    def log_returns(self, episode_id: str, reward: float) -> None:
        self._log_returns(episode_id, reward)

    async def end_episode(self, episode_id: str, observation: Any = _UNSET, *, truncated: bool = False) -> float:
        if observation is not _UNSET:
            await self._request("POST", self._act_path, json=self._final_act_body(episode_id, observation, truncated))
        episode = self._close_episode(episode_id)
        await self.end_session(episode.session_id)
        return episode.total_reward
