"""Hostile WebSocket messages for the stream fuzzer (``test_stream_fuzz_e2e``), built frame by
frame (``ws_raw.frame``): each is ``Hostile(kind, frames, closes)``, where ``closes`` says the
message breaks the WebSocket protocol or the size limit, so the server must close the
connection with one of the documented codes, and otherwise it must answer it with one frame
(an error frame, or the answer of a message that is valid after all).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any

import msgpack
from ws_raw import BINARY, CLOSE, CONTINUATION, PING, TEXT, frame

# Observation sizes of the models the fuzzer's server serves (cartpole-memory: 2, cartpole: 4).
SINGLE_OBS, AGENT_OBS = 2, {"red_1": 2, "red_2": 2, "blue_1": 4}


@dataclass(frozen=True)
class Hostile:
    kind: str
    frames: list[bytes]
    closes: bool = False  # the server must close (protocol violation or too big)


def valid(rnd: random.Random, agents: bool) -> dict[str, Any]:
    """A well-formed step message of the route."""
    if not agents:
        return {"observation": [round(rnd.uniform(-1, 1), 3) for _ in range(SINGLE_OBS)], "tag": rnd.randrange(99)}
    acting = rnd.sample(sorted(AGENT_OBS), rnd.randint(1, len(AGENT_OBS)))
    return {"agents": {a: {"observation": [round(rnd.uniform(-1, 1), 3) for _ in range(AGENT_OBS[a])]}
                       for a in acting}, "tag": rnd.randrange(99)}


_WRONG = ["x", {}, [], None, -1, 1.5, True, [["a"]], {"__ndarray__": 1}, "9" * 400, [1] * 300, {"a": {"b": {}}}]


def _wrong_type(rnd: random.Random, agents: bool) -> dict[str, Any]:
    message = valid(rnd, agents)
    if agents and rnd.random() < 0.6:
        agent = next(iter(message["agents"]))
        field = rnd.choice(["observation", "reward", "done", "truncated", "action_mask", "prev_action", "bogus"])
        message["agents"][agent][field] = rnd.choice(_WRONG)
        return message
    fields = (["agents", "episode_start", "episode_end", "seed", "tag", "end", "observation"] if agents else
              ["observation", "reward", "terminated", "truncated", "step", "seed", "tag", "end", "episode_start",
               "agents"])
    message[rnd.choice(fields)] = rnd.choice(_WRONG)
    return message


def _ndarray(rnd: random.Random) -> dict[str, Any]:
    """A ``msgpack_numpy`` map that lies: a shape past its bytes, a dtype not read, a bad shape."""
    return rnd.choice([
        {"__ndarray__": True, "data": b"\0" * 8, "dtype": "<f4", "shape": [10**12, 10**12]},
        {"__ndarray__": True, "data": b"\0" * 8, "dtype": ">f8", "shape": [1]},
        {"__ndarray__": True, "data": b"\0" * 8, "dtype": "|O", "shape": [1]},
        {"__ndarray__": True, "data": "text", "dtype": "<f4", "shape": [1]},
        {"__ndarray__": True, "data": b"\0" * 8, "dtype": "<f4", "shape": [-2]},
        {"__ndarray__": True, "data": b"", "dtype": "<f4", "shape": [0] * 40},
        {"__ndarray__": True, "data": b"\0" * 8, "dtype": "<f4", "shape": "2"},
        {"__npgeneric__": True, "data": "x", "dtype": "<f4"},
    ])


def _msgpack_hostile(rnd: random.Random, agents: bool) -> bytes:
    message = valid(rnd, agents)
    if rnd.random() < 0.25:  # a header that declares 4 billion items, and no items
        return rnd.choice([b"\xdd\xff\xff\xff\xff", b"\xdf\xff\xff\xff\xff", b"\xc6\xff\xff\xff\xff\x00"])
    if agents:
        next(iter(message["agents"].values()))["observation"] = _ndarray(rnd)
    else:
        message["observation"] = _ndarray(rnd)
    return msgpack.packb(message)


def _split(data: bytes, parts: int, rnd: random.Random) -> list[bytes]:
    cuts = sorted(rnd.sample(range(1, len(data)), min(parts - 1, len(data) - 1)))
    return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]


def _fragments(opcode: int, data: bytes, rnd: random.Random, ping: bool) -> list[bytes]:
    pieces = _split(data, rnd.randint(2, 6), rnd)
    frames = []
    for i, piece in enumerate(pieces):
        frames.append(frame(opcode if i == 0 else CONTINUATION, piece, fin=i == len(pieces) - 1))
        if ping and i == 0:  # a control frame may come between a message's fragments
            frames.append(frame(PING, b"hi"))
    return frames


def hostile(rnd: random.Random, agents: bool, max_bytes: int) -> Hostile:
    """One random hostile message for the stream (``agents``: a policy set's) of a server
    whose messages are held to ``max_bytes``."""
    kind = rnd.choice(["garbage_text", "truncated", "wrong_type", "garbage_binary", "msgpack", "deep",
                       "fragmented", "fragmented_utf8", "invalid_utf8", "oversized", "oversized_fragments",
                       "huge_length", "protocol"])
    text = json.dumps(valid(rnd, agents)).encode()
    if kind == "garbage_text":
        junk = "".join(chr(rnd.choice([rnd.randrange(32, 127), rnd.randrange(160, 0x2FFF)]))
                       for _ in range(rnd.randint(0, 200)))
        return Hostile(kind, [frame(TEXT, junk.encode())])
    if kind == "truncated":
        return Hostile(kind, [frame(TEXT, text[:rnd.randrange(len(text))])])
    if kind == "wrong_type":
        return Hostile(kind, [frame(TEXT, json.dumps(_wrong_type(rnd, agents)).encode())])
    if kind == "garbage_binary":
        return Hostile(kind, [frame(BINARY, rnd.randbytes(rnd.randint(0, 300)))])
    if kind == "msgpack":
        return Hostile(kind, [frame(BINARY, _msgpack_hostile(rnd, agents))])
    if kind == "deep":
        depth = rnd.randint(1000, max_bytes // 2 - 8)
        nested = b"[" * depth + b"]" * depth if rnd.random() < 0.5 else b'{"a":' * (depth // 5)
        return Hostile(kind, [frame(TEXT, nested)])
    if kind == "fragmented":  # valid, in pieces (text or msgpack): answered
        if rnd.random() < 0.5:
            return Hostile(kind, _fragments(TEXT, text, rnd, rnd.random() < 0.5))
        return Hostile(kind, _fragments(BINARY, msgpack.packb(valid(rnd, agents)), rnd, rnd.random() < 0.5))
    if kind == "fragmented_utf8":  # a two-byte character split across two fragments: valid
        body = json.dumps({**valid(rnd, agents), "tag": "é" * 10}, ensure_ascii=False).encode()
        at = body.index("é".encode()) + 1
        return Hostile(kind, [frame(TEXT, body[:at], fin=False), frame(CONTINUATION, body[at:])])
    if kind == "invalid_utf8":
        return Hostile(kind, [frame(TEXT, text[:5] + b"\xff\xfe\xc3" + text[5:])], closes=True)
    if kind == "oversized":
        return Hostile(kind, [frame(rnd.choice([TEXT, BINARY]), b" " * (max_bytes + rnd.randint(1, 4096)))],
                       closes=True)
    if kind == "oversized_fragments":
        piece = b" " * (max_bytes // 3 + 1)
        return Hostile(kind, [frame(TEXT, piece, fin=False)] + [frame(CONTINUATION, piece, fin=False)] * 3,
                       closes=True)
    if kind == "huge_length":  # the header declares 2**62 bytes; none follow
        return Hostile(kind, [frame(BINARY, b"", length=1 << 62)], closes=True)
    return Hostile(kind, [rnd.choice([
        frame(TEXT, text, mask=False),  # clients must mask
        frame(TEXT, text, rsv=rnd.randint(1, 7)),  # reserved bits, no extension negotiated
        frame(rnd.choice([3, 4, 5, 6, 7, 11, 12, 15]), text),  # reserved opcodes
        frame(CONTINUATION, text),  # a continuation of nothing
        frame(PING, b"p" * 126),  # a control frame over 125 bytes
        frame(PING, b"p", fin=False),  # a fragmented control frame
        frame(CLOSE, (999).to_bytes(2, "big")),  # a close code no one may send
        frame(TEXT, text[:3], fin=False) + frame(TEXT, text[3:]),  # a new message inside a fragmented one
    ])], closes=True)
