"""The act routes' raw binary body (``application/octet-stream``, see ``binary``): the
rows go to ``ActService.accept_rows`` and the answer is the JSON batch form."""

from __future__ import annotations

from collections.abc import Iterable

from rlserve.service.act.binary import raw_rows
from rlserve.service.act.use_case import Accepted, ActService, Reply


def accept_raw(service: ActService, name: str, version: str | None, headers: Iterable[tuple[bytes, bytes]],
               body: bytes) -> Accepted:
    rows, options = raw_rows(headers, body, service.block_expect(name, version))
    return service.accept_rows(name, version, rows, explore=options.explore, extras=options.outputs)


def act_raw_nowait(service: ActService, name: str, version: str | None, headers: Iterable[tuple[bytes, bytes]],
                   body: bytes, reply: Reply) -> None:
    service.submit_nowait(accept_raw(service, name, version, headers, body), service.finish, reply)


async def act_raw(service: ActService, name: str, version: str | None, headers: Iterable[tuple[bytes, bytes]],
                  body: bytes) -> bytes:
    accepted = accept_raw(service, name, version, headers, body)
    output, info = await service.submit(accepted)
    return service.finish(accepted, output, info)
