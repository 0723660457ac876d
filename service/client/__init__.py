"""The rlserve client side: an HTTP client for policies, a gymnasium runner and the demo.

Imports nothing of the server (a test checks it), so an environment process needs only
httpx and websockets (and gymnasium for the runner, ``rlserve.client.gym_runner``). docs/client.md shows
how to use it.
"""

from rlserve.client.errors import (
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
)
from rlserve.client.policy_client import AsyncPolicyClient, PolicyClient
from rlserve.client.stream import AsyncStream, Stream
from rlserve.client.wire import ActResult

__all__ = [
    "ActResult",
    "AllActionsMaskedError",
    "AsyncPolicyClient",
    "AsyncStream",
    "AuthError",
    "BadRequestError",
    "ConflictError",
    "ConnectionFailed",
    "InvalidInputError",
    "ModelNotFoundError",
    "NotFoundError",
    "OverloadedError",
    "PolicyClient",
    "RLServeError",
    "ServerError",
    "SessionExpiredError",
    "SessionNotFoundError",
    "Stream",
]
