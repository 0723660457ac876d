"""Reading a request body from ASGI ``receive`` with one size bound, for every route:
whole (``read_body``) or chunk by chunk (``body_chunks``, for archive uploads).

The act protocol (``rlserve.service.act.protocol``) sees the body arrive chunk by chunk in
uvicorn's parser instead; it refuses with the same ``body_too_large`` error.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from typing import Any

from rlserve.service.errors import body_too_large

Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
_DIGITS = re.compile(r"[0-9]{1,19}")


def _refuse_declared(declared: str | None, limit: int) -> None:
    """413 for a declared ``content-length`` past ``limit``; one that is not ASCII digits is
    left to the server's parser (str.isdigit() would take '²', which int() refuses)."""
    if declared is not None and _DIGITS.fullmatch(declared) is not None and int(declared) > limit:
        raise body_too_large(int(declared), limit)


async def read_body(receive: Receive, limit: int, *, declared: str | None = None) -> bytes:
    """The whole body; 413 as soon as it (or its declared ``content-length``) passes ``limit``."""
    _refuse_declared(declared, limit)
    message = await receive()
    body = message.get("body", b"")
    if not message.get("more_body", False) and len(body) <= limit:
        return body  # the usual case: one message holds the whole body
    chunks, size = [body], len(body)
    while True:
        if size > limit:
            raise body_too_large(size, limit)
        if not message.get("more_body", False):
            return b"".join(chunks)
        message = await receive()
        chunk = message.get("body", b"")
        size += len(chunk)
        chunks.append(chunk)


async def body_chunks(receive: Receive, limit: int, *, declared: str | None = None) -> AsyncIterator[bytes]:
    """The body chunk by chunk, with the same bound as ``read_body``."""
    _refuse_declared(declared, limit)
    size = 0
    while True:
        message = await receive()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise body_too_large(size, limit)
        if chunk:
            yield chunk
        if not message.get("more_body", False):
            return
