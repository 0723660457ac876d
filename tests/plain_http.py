"""One-off HTTP calls for the tests, without the cost hidden in ``httpx.get``.

``httpx.get(url)`` (and ``post``, ``put``, ...) builds a client for its one call, and with
it an SSL context that loads every CA certificate: about 50 ms of CPU each time, even for
the plain-http URLs of the servers the tests start. A readiness poll every 100 ms kept half
a core busy for as long as a server took to start, on a machine of two cores. ``HTTP`` is
one client per process, its SSL context made once; like ``httpx.get`` it keeps no
connection open between calls (each call connects afresh), so a server killed and started
again on the same port is reached anew. Its default timeout is ``httpx.get``'s.
"""

from __future__ import annotations

import httpx

HTTP = httpx.Client(timeout=5.0, limits=httpx.Limits(max_keepalive_connections=0))
