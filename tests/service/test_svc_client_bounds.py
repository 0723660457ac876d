"""The two rules of issue 29, unit by unit: a declared size is held to what came before
anything is allocated (``rlserve.service.step.sizes``), and a client's long string is
reported by its length in error bodies and log lines (``rlserve.service.errors``).

tests/e2e/test_declared_sizes_e2e.py and test_long_strings_e2e.py hold a real server to them.
"""

from __future__ import annotations

import io
import logging

import msgspec
import pytest

from rlserve.service.act.body import body_chunks, read_body
from rlserve.service.errors import (
    MAX_ECHO,
    BadRequest,
    BoundedLogLines,
    InvalidInput,
    PayloadTooLarge,
    bounded,
    quoted,
)
from rlserve.service.step.sizes import Expect, Fields, check_shape

FIELDS = Fields("x.shape", "x.data")
LONG = "k" * (3 << 20)
SPACED = "ab " * (1 << 20)


# --------------------------------------------------------------------------- declared sizes

@pytest.mark.parametrize(("shape", "nbytes", "field"), [
    ([20000000, 0], 0, "x.shape"),  # zero-width: the model's row is 4 wide
    ([1170185322465, 0, 50, 811, 55, 53288349742, 3], 0, "x.shape"),  # overflows int64, holds nothing
    ([4, 1], 16, "x.shape"),  # the right byte count, the wrong row
    ([1 << 62, 4], 16, "x.data"),  # a product far past int64: compared as a Python int
    ([1, 4], 15, "x.data"),
    ([0, 4], 0, "x.shape"),  # no rows
    ([1, -4], 0, "x.shape"),
    ("1,4", 16, "x.shape"),
    ([1] * 33, 4, "x.shape"),  # more dimensions than any observation has
])
def test_a_declared_shape_that_does_not_fit_is_refused_naming_its_field(shape, nbytes, field):
    with pytest.raises(InvalidInput) as info:
        check_shape(shape, Expect(1000, ((4,),)), FIELDS, itemsize=4, nbytes=nbytes)
    assert info.value.field == field
    assert info.value.expected is not None and info.value.received is not None
    assert len(info.value.body()) < 1024


def test_the_row_limit_is_a_413_once_the_body_really_holds_the_rows():
    expect = Expect(8, ((4,),))
    assert check_shape([8, 4], expect, FIELDS, itemsize=4, nbytes=128) == 32
    with pytest.raises(InvalidInput):  # a claim of 9 rows the body does not hold: the bytes are wrong
        check_shape([9, 4], expect, FIELDS, itemsize=4, nbytes=0)
    with pytest.raises(PayloadTooLarge) as info:
        check_shape([9, 4], expect, FIELDS, itemsize=4, nbytes=144)
    assert info.value.status == 413 and "RLSERVE_MAX_ROWS" in info.value.message


def test_where_the_model_is_not_known_yet_a_zero_dimension_is_refused():
    unknown = Expect(1000)
    assert check_shape([2, 3], unknown, FIELDS, itemsize=1, nbytes=6) == 6
    with pytest.raises(InvalidInput, match="dimension of 0"):
        check_shape([1, 0, 1 << 40], unknown, FIELDS, itemsize=4, nbytes=0)


def test_a_scalar_leaf_takes_its_two_spellings_and_a_custom_error_class():
    scalar = Expect(10, ((), (1,)))
    assert check_shape([3], scalar, FIELDS) == 3 and check_shape([3, 1], scalar, FIELDS) == 3
    with pytest.raises(BadRequest):
        check_shape([3, 2], scalar, FIELDS, error=BadRequest)


# --------------------------------------------------------------------------- client strings

def test_quoted_says_a_long_value_by_its_length():
    assert quoted("abc") == "'abc'" and quoted(["a"]) == "['a']"
    assert quoted(LONG) == f"<str of {len(LONG)} characters>"
    assert quoted(["x"] * 1000) == "<list of 1000 items>"
    assert quoted(b"b" * 1000) == "<bytes of 1000 bytes>"


def test_bounded_replaces_long_words_and_cuts_long_text():
    assert bounded("short message") == "short message"
    assert bounded(f"session {LONG} is gone") == f"session <{len(LONG)} characters> is gone"
    cut = bounded(f"unknown key {SPACED}")
    assert len(cut) <= 2048 and cut.endswith("characters in all>")


@pytest.mark.parametrize("long", [LONG, SPACED], ids=["one word", "many words"])
def test_an_error_body_never_repeats_a_long_client_string(long):
    """Whether the message quotes it (a library's message), it is the field, or what was
    received, alone or inside a list or as a key."""
    errors = [
        BadRequest(f"Invalid enum value {long!r}", field="outputs[0]", received=long),
        BadRequest(f"{long}: extra fields are not permitted", field=long, received=1),
        InvalidInput("bad keys", field="observation", received={long: 1, "b": [long]}),
        InvalidInput("bad", field="x", expected=f"not {long}", received=long),
        InvalidInput("bad", field="x", received=[long] * 100),
    ]
    for error in errors:
        body = error.body()
        assert len(body) < 4096, body[:300]
        assert long[:MAX_ECHO + 1].encode() not in body, body[:300]
        msgspec.json.decode(body)  # still JSON


def test_log_lines_say_a_long_string_by_its_length_tracebacks_included():
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.addFilter(BoundedLogLines())
    logger = logging.getLogger("rlserve.test_client_bounds")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.warning("session %s failed", LONG)
        try:
            raise KeyError(SPACED)
        except KeyError:
            logger.exception("lookup of %r failed", SPACED)
    finally:
        logger.removeHandler(handler)
    text = out.getvalue()
    assert len(text) < 20_000, len(text)
    assert f"session <{len(LONG)} characters> failed" in text and "KeyError" in text
    assert SPACED[:MAX_ECHO + 1] not in text.replace("\n", "")


@pytest.mark.asyncio
async def test_read_body_leaves_a_declared_length_of_non_ascii_digits_to_the_parser():
    async def receive() -> dict[str, object]:
        return {"body": b"abc", "more_body": False}

    assert await read_body(receive, 10, declared="\xb2") == b"abc"
    assert [c async for c in body_chunks(receive, 10, declared="1\xb9")] == [b"abc"]
    with pytest.raises(PayloadTooLarge) as info:
        await read_body(receive, 10, declared="11")
    assert info.value.status == 413
