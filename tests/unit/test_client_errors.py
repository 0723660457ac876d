"""The client's reading of an error answer (``rlserve.service.client.errors``): a header it
cannot read is left out, never raised from inside the error it builds."""

from __future__ import annotations

import httpx
import pytest

from rlserve.service.client.errors import OverloadedError, error_from_response


@pytest.mark.parametrize(("header", "seconds"), [("2", 2.0), ("1.5", 1.5), (".5", 0.5), ("\xb2", None),
                                                  ("1\xb9", None), ("1.2.3", None), ("soon", None)])
def test_retry_after_is_read_only_from_ascii_seconds(header, seconds):
    # '²' passed str.isdigit() and then made float() raise while building the error.
    response = httpx.Response(503, headers={"retry-after": header.encode("latin-1")},
                              json={"error": {"code": "queue_full", "message": "busy"}})
    error = error_from_response(response)
    assert isinstance(error, OverloadedError) and error.retry_after == seconds
