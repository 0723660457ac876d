"""A session as bytes: the one format of the external store and of session export/import.

A record holds everything a session is: its tensors (recurrent or attention state,
previous-action and previous-reward windows), its step count, its seed and its seeded
generator's exact state, the model version it is bound to, and the answer kept for a
retried step. Format 1, little-endian unless noted::

    offset  bytes  field
    0       8      revision, big-endian u64: the compare-and-set word (the store's Lua
                   scripts compare these 8 bytes and nothing else)
    8       1      format (1)
    9       1      flags: 1 seeded, 2 generator state present, 4 the generator holds a spare u32
    10      2      V, the length of the version string
    12      4      steps answered in the current episode
    16      8      seed (when seeded)
    24      8      created, seconds since the epoch (f64)
    32      4      layout digest: CRC-32 of the tensors' shapes and dtypes, so a record
                   is never read into a model with another layout
    36      4      R, the length of the kept answer (0: none)
    40      16     PCG64 state (u128)
    56      16     PCG64 increment (u128)
    72      4      PCG64 spare u32
    76      4      L, the length of the experience log's open step (0: none; a record
                   written before the log existed has 0 here)
    80      V      version, UTF-8
    80+V    P      each tensor row in ``SessionLayout`` order, C order, its own dtype
    80+V+P  R      the kept answer (msgpack, see ``rlserve.service.step.batch``)
    ...+R   L      the experience log's open step (opaque here, see
                   ``rlserve.service.experience.trail``): whichever replica serves the
                   next step closes it

For an LSTM(256) the tensors are 2,048 bytes and a record 2,128 plus the version and
any kept answer. A batch's records are built with one numpy matrix (no per-session
packing loop); only seeded sessions read their generator in Python.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlserve.models.interface import ModelSignature

FORMAT = 1
HEADER = np.dtype([
    ("revision", ">u8"), ("format", "u1"), ("flags", "u1"), ("version_len", "<u2"), ("steps", "<u4"),
    ("seed", "<u8"), ("created", "<f8"), ("digest", "<u4"), ("answer_len", "<u4"),
    ("rng", "u1", (36,)), ("trail_len", "<u4"),
])
HEADER_BYTES = HEADER.itemsize  # 80
REVISION_BYTES = 8
SEEDED, HAS_RNG, RNG_SPARE = 1, 2, 4
MAX_REVISION = (1 << 64) - 1
MAX_STEPS = (1 << 32) - 1  # the header's u32
_U128 = 1 << 128


class RecordError(ValueError):
    """Bytes that are not a session record of this model's layout."""


@dataclass
class SessionRecord:
    """A decoded record; ``rows`` in ``SessionLayout`` order, one session's arrays each."""

    revision: int
    version: str
    steps: int
    seed: int | None
    rng: np.random.Generator | None
    created: float
    rows: list[np.ndarray]
    answer: bytes | None
    trail: bytes | None = None


@dataclass(frozen=True)
class _Part:
    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


class SessionLayout:
    """The byte layout of one model signature's sessions (the order of ``SessionSlabs.rows``)."""

    def __init__(self, signature: ModelSignature):
        parts = [_Part(tuple(s.shape), np.dtype(s.dtype)) for s in signature.state]
        prev = signature.prev
        if prev.n_prev_actions:
            parts.append(_Part((prev.n_prev_actions, prev.action_width), np.dtype(np.float32)))
        if prev.n_prev_rewards:
            parts.append(_Part((prev.n_prev_rewards,), np.dtype(np.float32)))
        self.parts = parts
        self.payload_bytes = sum(p.nbytes for p in parts)
        described = ";".join(f"{p.dtype.str}{list(p.shape)}" for p in parts)
        self.digest = zlib.crc32(described.encode())
        self.description = described or "no tensors"

    # ------------------------------------------------------------------ encode

    def encode(self, headers: np.ndarray, version: str, rows: Sequence[np.ndarray],
               answers: Sequence[bytes | None] | None = None,
               trails: Sequence[bytes | None] | None = None) -> list[bytes]:
        """One record per entry of ``headers`` (K,) ``HEADER``; ``rows`` holds each part's
        rows (K, *shape); ``answers`` the kept answers, ``trails`` the log's open steps
        (None: none)."""
        count = len(headers)
        version_bytes = version.encode()
        headers["format"] = FORMAT
        headers["version_len"] = len(version_bytes)
        headers["digest"] = self.digest
        if answers is not None:
            headers["answer_len"] = [0 if a is None else len(a) for a in answers]
        if trails is not None:
            headers["trail_len"] = [0 if t is None else len(t) for t in trails]
        fixed = HEADER_BYTES + len(version_bytes)
        matrix = np.empty((count, fixed + self.payload_bytes), np.uint8)
        matrix[:, :HEADER_BYTES] = headers.view(np.uint8).reshape(count, HEADER_BYTES)
        matrix[:, HEADER_BYTES:fixed] = np.frombuffer(version_bytes, np.uint8)
        offset = fixed
        for part, values in zip(self.parts, rows, strict=True):
            flat = np.ascontiguousarray(values, dtype=part.dtype).reshape(count, -1).view(np.uint8)
            matrix[:, offset:offset + part.nbytes] = flat
            offset += part.nbytes
        records = [row.tobytes() for row in matrix]
        if answers is not None:
            records = [r if a is None else r + a for r, a in zip(records, answers, strict=True)]
        if trails is not None:
            records = [r if t is None else r + t for r, t in zip(records, trails, strict=True)]
        return records

    # ------------------------------------------------------------------ decode

    def decode(self, data: bytes) -> SessionRecord:
        """``data`` as a record of this layout; ``RecordError`` saying what does not fit."""
        header = read_header(data)
        if int(header["digest"]) != self.digest:
            raise RecordError(f"the record's tensors do not fit this model: expected layout {self.description}")
        fixed = HEADER_BYTES + int(header["version_len"])
        answer_len, trail_len = int(header["answer_len"]), int(header["trail_len"])
        expected = fixed + self.payload_bytes + answer_len + trail_len
        if len(data) != expected:
            raise RecordError(f"a record of this model is {expected} bytes long; got {len(data)}")
        rows, offset = [], fixed
        for part in self.parts:
            rows.append(np.frombuffer(data, part.dtype, count=int(np.prod(part.shape, dtype=np.int64)),
                                      offset=offset).reshape(part.shape))
            offset += part.nbytes
        flags = int(header["flags"])
        return SessionRecord(
            revision=int(header["revision"]),
            version=bytes(data[HEADER_BYTES:fixed]).decode("utf-8", "replace"),
            steps=int(header["steps"]),
            seed=int(header["seed"]) if flags & SEEDED else None,
            rng=_rng_from(header["rng"].tobytes(), flags) if flags & HAS_RNG else None,
            created=float(header["created"]),
            rows=rows,
            answer=bytes(data[offset:offset + answer_len]) if answer_len else None,
            trail=bytes(data[offset + answer_len:]) if trail_len else None,
        )


def read_header(data: bytes) -> np.void:
    """The fixed header of a record (format checked), without its tensors."""
    if len(data) < HEADER_BYTES:
        raise RecordError(f"a session record starts with a {HEADER_BYTES}-byte header; got {len(data)} bytes")
    header = np.frombuffer(data, HEADER, count=1)[0]
    if int(header["format"]) != FORMAT:
        raise RecordError(f"unknown session record format {int(header['format'])}; this server reads {FORMAT}")
    if HEADER_BYTES + int(header["version_len"]) > len(data):
        raise RecordError("the record is shorter than its version string")
    return header


def record_version(data: bytes) -> str:
    """The model version a record is bound to (reads the header only)."""
    header = read_header(data)
    return bytes(data[HEADER_BYTES:HEADER_BYTES + int(header["version_len"])]).decode("utf-8", "replace")


def revision_bytes(revision: int) -> bytes:
    return revision.to_bytes(REVISION_BYTES, "big")


def with_revision(data: bytes, revision: int) -> bytes:
    """``data`` with its compare-and-set word replaced (an import starts a new history)."""
    return revision_bytes(revision) + data[REVISION_BYTES:]


def headers_for(count: int) -> np.ndarray:
    return np.zeros(count, HEADER)


def set_generator(headers: np.ndarray, index: int, rng: np.random.Generator) -> None:
    """Write ``rng``'s exact PCG64 state into ``headers[index]`` (flags included)."""
    state = rng.bit_generator.state
    if state.get("bit_generator") != "PCG64":
        raise RecordError(f"only PCG64 generators can be stored, not {state.get('bit_generator')}")
    inner = state["state"]
    packed = (int(inner["state"]).to_bytes(16, "little") + int(inner["inc"]).to_bytes(16, "little")
              + int(state["uinteger"]).to_bytes(4, "little"))
    headers["rng"][index] = np.frombuffer(packed, np.uint8)
    headers["flags"][index] |= HAS_RNG | (RNG_SPARE if state["has_uint32"] else 0)


def _rng_from(packed: bytes, flags: int) -> np.random.Generator:
    bit_generator = np.random.PCG64()
    bit_generator.state = {
        "bit_generator": "PCG64",
        "state": {"state": int.from_bytes(packed[:16], "little") % _U128,
                  "inc": int.from_bytes(packed[16:32], "little") % _U128},
        "has_uint32": 1 if flags & RNG_SPARE else 0,
        "uinteger": int.from_bytes(packed[32:36], "little"),
    }
    return np.random.Generator(bit_generator)


def encode_sessions(layout: SessionLayout, version: str, sessions: Sequence[Any], revisions: Sequence[int],
                    rows: list[np.ndarray], now: float) -> list[bytes]:
    """Records of ``sessions`` (``Session``s of a store whose clock reads ``now``), their
    rows already read from the slabs (``SessionSlabs.rows``), one matrix for all."""
    headers = headers_for(len(sessions))
    headers["revision"] = revisions
    # The header's step count is 32 bits: a session past 2**32 - 1 steps (one imported with a
    # count near it, or one that ran that long) is stored at that count, not refused.
    headers["steps"] = [min(s.steps, MAX_STEPS) for s in sessions]
    wall = time.time()
    headers["created"] = [wall - (now - s.created) for s in sessions]
    for index, session in enumerate(sessions):
        if session.seed is not None:
            headers["seed"][index] = session.seed
            headers["flags"][index] |= SEEDED
        if session.rng is not None:
            set_generator(headers, index, session.rng)
    answers = [s.answer for s in sessions]
    trails = [None if s.trail is None else bytes(s.trail) for s in sessions]
    return layout.encode(headers, version, rows, answers if any(a is not None for a in answers) else None,
                         trails if any(t is not None for t in trails) else None)
