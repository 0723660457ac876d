"""Malformed requests for the end-to-end fuzz tests, each with the error it must get.

The expected error paths are derived from the spaces here, not from the service's codec:
Dict keys as ``.key``, Tuple items and Repeated entries as ``[i]``, batch rows as
``observations[k]``. Valid values come from an independent seeded sampler.

``Case.bug`` marks a request the service answers wrongly today (the test keeps asserting
the right answer and is a strict xfail); ``BUGS`` holds the precise descriptions.
The random generator leaves no known trigger out: it sends non-ASCII text, invalid UTF-8
bytes, a "shape" key and doubles that overflow float32.
"""

from __future__ import annotations

import functools
import json
import random
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium.spaces as gs
import numpy as np

from rlserve.models.spaces import Repeated

ANY = "<any>"  # Case.field: the error's field is not checked (no single field is at fault)
F32 = np.float32
# Error codes of docs/api.md with a 4xx status.
DOCUMENTED_4XX = {
    "invalid_json", "bad_request", "path_outside_repository", "unauthorized", "forbidden",
    "model_not_found", "session_not_found", "not_found", "admin_disabled", "method_not_allowed",
    "session_conflict", "version_conflict", "session_expired", "payload_too_large",
    "invalid_input", "all_actions_masked", "bundle_invalid", "no_traffic",
}

# Observation space, action space, model config of every bundle the fuzz server serves
# (plus the embedded cartpole/cartpole-memory bundles, copied into the same repository).
LSTM = {"fcnet_hiddens": [16], "use_lstm": True, "lstm_cell_size": 8,
        "lstm_use_prev_action": True, "lstm_use_prev_reward": True}
BUNDLES: dict[str, tuple[gs.Space, gs.Space, dict[str, Any]]] = {
    "box": (gs.Box(-1.0, 1.0, (4,), F32), gs.Discrete(3), {"fcnet_hiddens": [8]}),
    "disc": (gs.Discrete(5, start=-2), gs.Discrete(2), {"fcnet_hiddens": [8]}),
    "nested": (gs.Dict({"pos": gs.Box(-1.0, 1.0, (3,), F32),
                        "sensors": gs.Tuple((gs.Discrete(3), gs.Box(-1.0, 1.0, (2,), F32),
                                             gs.Dict({"a": gs.Box(-1.0, 1.0, (1,), F32),
                                                      "b": gs.Discrete(4, start=1)}))),
                        "mode": gs.Discrete(3)}),
               gs.MultiDiscrete([2, 3]), {"fcnet_hiddens": [8]}),
    "repeated": (Repeated(gs.Box(-1.0, 1.0, (2,), F32), max_len=3), gs.Discrete(2), {"fcnet_hiddens": [8]}),
    "image": (gs.Box(0, 255, (42, 42, 3), np.uint8), gs.Discrete(4),
              {"conv_filters": [[4, [4, 4], 2], [8, [4, 4], 2], [8, [11, 11], 1]]}),
    "masked": (gs.Dict({"action_mask": gs.Box(0.0, 1.0, (5,), F32), "observations": gs.Box(-1.0, 1.0, (3,), F32)}),
               gs.Dict({"a": gs.Discrete(2), "b": gs.Discrete(3)}), {"fcnet_hiddens": [8]}),
    "memory": (gs.Box(-1.0, 1.0, (3,), F32), gs.Discrete(3), LSTM),
}
DEFAULT_BUNDLES = ("cartpole", "cartpole-memory")
DEFAULTS = Path(__file__).resolve().parents[2] / "service" / "default_models"
MASK_KEY = "action_mask"  # RLlib's convention: a Dict observation entry carrying the mask


def build_repository(tmp_path_factory: Any, root: Path) -> Path:
    """Every ``BUNDLES`` entry (seeded) and the embedded defaults, copied into ``root``."""
    import shutil

    export_bundles(tmp_path_factory, root, BUNDLES)
    for name in DEFAULT_BUNDLES:
        shutil.copytree(DEFAULTS / name, root / name)
    return root


def export_bundles(tmp_path_factory: Any, root: Path, names: Iterable[str]) -> None:
    """The ``BUNDLES`` entries ``names`` (seeded) in ``root``, one folder each: each exported
    once per test run for all its xdist workers (``run_cache``) and copied here."""
    import shutil

    from run_cache import shared_folder

    for name in names:
        kept = shared_folder(tmp_path_factory, f"fuzz-bundles/{name}", lambda out, name=name: _export(name, out))
        shutil.copytree(kept, root / name)


def _export(name: str, out: Path) -> None:
    import torch

    from rlserve.models.catalog import build_model
    from rlserve.models.export.exporter import export_bundle

    torch.set_num_threads(1)
    obs, act, config = BUNDLES[name]
    torch.manual_seed(0)
    export_bundle(build_model(obs, act, config), obs_space=obs, action_space=act, model_config=config,
                  out_dir=out, name=name, version="1", formats=["onnx"])


def spaces_of(name: str) -> tuple[gs.Space, gs.Space]:
    """(observation, action) space of bundle ``name``: ours, or read from its manifest."""
    if name in BUNDLES:
        return BUNDLES[name][0], BUNDLES[name][1]
    from rlserve.models.spaces import space_from_json

    manifest = json.loads((DEFAULTS / name / "manifest.json").read_text())
    return space_from_json(manifest["observation_space"]), space_from_json(manifest["action_space"])


# --------------------------------------------------------------------------- JSON text

class Raw:
    """A literal JSON token Python's json cannot write (1e400, a 5000-digit integer)."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return f"Raw({self.text[:20]})"


def dumps(obj: Any) -> bytes:
    raws: list[str] = []

    def default(o: Any) -> Any:
        if isinstance(o, Raw):
            raws.append(o.text)
            return f"@@RAW{len(raws) - 1}@@"
        raise TypeError(type(o).__name__)

    text = json.dumps(obj, default=default, allow_nan=False)
    for i, raw in enumerate(raws):
        text = text.replace(f'"@@RAW{i}@@"', raw, 1)
    return text.encode()


# --------------------------------------------------------------------------- valid values

@functools.singledispatch
def sample(space: gs.Space, rng: np.random.Generator) -> Any:
    raise TypeError(f"no sampler for {space}")


@sample.register
def _(space: gs.Box, rng: np.random.Generator) -> Any:
    if space.dtype.kind in "iu":
        return rng.integers(space.low, space.high, endpoint=True).astype(int).tolist()
    low, high = np.maximum(space.low, -1.0), np.minimum(space.high, 1.0)
    return np.round(rng.uniform(low, high), 4).tolist()


@sample.register
def _(space: gs.Discrete, rng: np.random.Generator) -> Any:
    return int(space.start + rng.integers(space.n))


@sample.register
def _(space: gs.MultiDiscrete, rng: np.random.Generator) -> Any:
    return (space.start + rng.integers(space.nvec)).astype(int).tolist()


@sample.register
def _(space: gs.Tuple, rng: np.random.Generator) -> Any:
    return [sample(s, rng) for s in space.spaces]


@sample.register
def _(space: gs.Dict, rng: np.random.Generator) -> Any:
    value = {k: sample(s, rng) for k, s in space.spaces.items()}
    if MASK_KEY in value:
        value[MASK_KEY] = [1] * len(value[MASK_KEY])  # allow every action
    return value


@sample.register
def _(space: Repeated, rng: np.random.Generator) -> Any:
    # At least two items, so that item paths [0] and [1] both get mutated.
    return [sample(space.child_space, rng) for _ in range(int(rng.integers(2, space.max_len + 1)))]


def mask_blocks(space: gs.Space) -> list[int]:
    """Categorical block sizes of an action space, flattened order (Dict keys sorted)."""
    if isinstance(space, gs.Discrete):
        return [int(space.n)]
    if isinstance(space, gs.MultiDiscrete):
        return [int(n) for n in np.ravel(space.nvec)]
    if isinstance(space, gs.Tuple):
        return [b for s in space.spaces for b in mask_blocks(s)]
    if isinstance(space, gs.Dict):
        return [b for k in sorted(space.spaces) for b in mask_blocks(space.spaces[k])]
    return []


# --------------------------------------------------------------------------- wrong values

@dataclass(frozen=True)
class Wrong:
    """A value wrong at one node; ``status``/``code`` it must get; ``sub`` lets the error
    name an element below the node (msgspec names the number it could not parse)."""

    label: str
    value: Any
    status: int = 422
    code: str = "invalid_input"
    sub: bool = False


def _common() -> list[Wrong]:
    return [Wrong("null", None), Wrong("string", "oops"), Wrong("bool", True)]


@functools.singledispatch
def wrong_values(space: gs.Space, valid: Any) -> list[Wrong]:
    raise TypeError(f"no wrong values for {space}")


def _first(valid: Any, element: Any) -> Any:
    """``valid`` (nested lists) with its first number replaced by ``element``."""
    arr = np.array(valid, dtype=object)
    arr.flat[0] = element
    return arr.tolist()


@wrong_values.register
def _(space: gs.Box, valid: Any) -> list[Wrong]:
    shape, flat = space.shape, np.asarray(valid).ravel().tolist()
    out = _common() + [
        Wrong("object", {"zz": 1}), Wrong("empty-list", []),
        Wrong("too-deep", [valid]), Wrong("strings", np.full(shape, "a").tolist()),
        Wrong("ragged", [flat, flat[:-1]] if len(flat) > 1 else [[1], []]),
        Wrong("int-beyond-int64", _first(valid, 10**30)),
        Wrong("1e400", _first(valid, Raw("1e400")), 400, "bad_request", sub=True),
        Wrong("5000-digit-int", _first(valid, Raw("9" * 5000)), 400, "bad_request", sub=True),
    ]
    if len(shape) == 1:
        out.append(Wrong("one-short", flat[:-1]))
        out.append(Wrong("one-long", flat + flat[:1]))
    if space.dtype.kind == "f":
        out.append(Wrong("1e39-overflows-float32", np.full(shape, 1e39).tolist()))
    else:
        out += [Wrong("300-over-uint8", np.full(shape, 300).tolist()),
                Wrong("negative-uint8", np.full(shape, -1).tolist()),
                Wrong("fractional", np.full(shape, 1.5).tolist())]
    return out


@wrong_values.register
def _(space: gs.Discrete, valid: Any) -> list[Wrong]:
    low, high = int(space.start), int(space.start + space.n - 1)
    return _common() + [
        Wrong("below-start", low - 1), Wrong("above-end", high + 1), Wrong("fraction", low + 0.5),
        Wrong("numeric-string", str(low)), Wrong("list", [low]), Wrong("object", {"v": low}),
        Wrong("int-beyond-int64", 10**30),
        Wrong("1e400", Raw("1e400"), 400, "bad_request"),
    ]


@wrong_values.register
def _(space: gs.Tuple, valid: Any) -> list[Wrong]:
    return _common() + [Wrong("object", {"0": valid[0]}), Wrong("one-short", valid[:-1]),
                        Wrong("one-long", [*valid, valid[0]]), Wrong("empty", [])]


@wrong_values.register
def _(space: gs.Dict, valid: Any) -> list[Wrong]:
    first = next(iter(valid))
    return _common() + [Wrong("list", list(valid.values())), Wrong("empty", {}),
                        Wrong(f"missing-{first}", {k: v for k, v in valid.items() if k != first}),
                        Wrong("extra-key", {**valid, "zz_extra": 0})]


@wrong_values.register
def _(space: Repeated, valid: Any) -> list[Wrong]:
    item = valid[0]
    return _common() + [Wrong("object", {"0": item}), Wrong("max_len+1", [item] * (space.max_len + 1))]


def _children(space: gs.Space, valid: Any):
    """(path suffix, child space, child value, rebuild(child) -> parent value)."""
    if isinstance(space, gs.Dict):
        for key, sub in space.spaces.items():
            yield f".{key}", sub, valid[key], lambda b, key=key: {**valid, key: b}
    elif isinstance(space, gs.Tuple):
        for i, sub in enumerate(space.spaces):
            yield f"[{i}]", sub, valid[i], lambda b, i=i: [*valid[:i], b, *valid[i + 1:]]
    elif isinstance(space, Repeated):
        for i, item in enumerate(valid):
            yield f"[{i}]", space.child_space, item, lambda b, i=i: [*valid[:i], b, *valid[i + 1:]]


def mutations(space: gs.Space, valid: Any, path: str = ""):
    """Every (label, whole value with one node wrong, path of that node, Wrong)."""
    for wrong in wrong_values(space, valid):
        yield f"{path or '$'}:{wrong.label}", wrong.value, path, wrong
    for suffix, sub, sub_valid, rebuild in _children(space, valid):
        for label, bad, where, wrong in mutations(sub, sub_valid, path + suffix):
            yield label, rebuild(bad), where, wrong


@functools.singledispatch
def wrong_actions(space: gs.Space) -> list[tuple[str, Any]]:
    return [("string", "x")]


@wrong_actions.register
def _(space: gs.Discrete) -> list[tuple[str, Any]]:
    low = int(space.start)
    return [("above-end", low + int(space.n)), ("below-start", low - 1), ("string", "x"),
            ("list", [low]), ("fraction", low + 0.5), ("bool", True), ("object", {"a": low})]


@wrong_actions.register
def _(space: gs.MultiDiscrete) -> list[tuple[str, Any]]:
    nvec = np.ravel(space.nvec).astype(int).tolist()
    return [("out-of-range", nvec), ("one-short", nvec[:-1]), ("string", "x"), ("too-deep", [[0] * len(nvec)]),
            ("negative", [-1] * len(nvec))]


@wrong_actions.register
def _(space: gs.Dict) -> list[tuple[str, Any]]:
    keys = list(space.spaces)
    zeros = {k: 0 for k in keys}
    return [("leaf-out-of-range", {**zeros, keys[0]: 99}), ("missing-key", {k: 0 for k in keys[1:]}),
            ("extra-key", {**zeros, "zz": 0}), ("list", [0] * len(keys)), ("string", "x")]


# --------------------------------------------------------------------------- random fuzz

_KEYS = ["a", "b", "b64", "dtype", "shape", "observation", "x", "0"]
_FIELDS = ["observation", "observations", "session_id", "session_ids", "episode_start", "episode_starts",
           "reward", "rewards", "prev_action", "prev_actions", "action_mask", "action_masks", "seed", "seeds",
           "explore", "clip_actions", "unsquash_actions", "outputs", "debug", "zz_unknown"]
_ASCII = [chr(c) for c in range(32, 127)]
_TEXT = _ASCII + ["\u00e9", "\u2603", "\U0001f600", "\u0000"]
_BAD_UTF8 = [b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xe2\x82"]


def random_json(rnd: random.Random, depth: int = 0) -> Any:
    """A random JSON value, including non-ASCII text, a base64 "shape" key and finite
    doubles that overflow float32 (1e39, -3.5e38)."""
    kind = rnd.randrange(9 if depth < 3 else 6)
    if kind == 0:
        return None
    if kind == 1:
        return rnd.choice([True, False])
    if kind == 2:
        return rnd.choice([0, 1, -1, 2, 3, 255, 256, -2**31, 2**63, 2**64, 10**25, rnd.randint(-9, 9)])
    if kind == 3:
        return rnd.choice(
            [0.0, -0.0, 0.5, -1e-45, 1e38, -3.4e38, 1e39, -3.5e38, 3.4028236e38, -1e300, 1e-300, rnd.uniform(-2, 2)]
        )
    if kind == 4:
        return "".join(rnd.choice(_TEXT) for _ in range(rnd.randrange(0, 12)))
    if kind == 5:
        return rnd.choice(["value", "entropy", "dist_inputs", "uint8", "float32", "AAAA", "", "inf", "nan"])
    if kind in (6, 7):
        return [random_json(rnd, depth + 1) for _ in range(rnd.randrange(0, 5))]
    return {rnd.choice(_KEYS): random_json(rnd, depth + 1) for _ in range(rnd.randrange(0, 4))}


def _random_node_edit(rnd: random.Random, value: Any) -> Any:
    """``value`` with one random node replaced, removed, or duplicated."""
    if isinstance(value, dict) and value and rnd.random() < 0.7:
        key = rnd.choice(list(value))
        out = dict(value)
        roll = rnd.random()
        if roll < 0.2:
            del out[key]
        elif roll < 0.3:
            out[rnd.choice(_KEYS)] = random_json(rnd)
        else:
            out[key] = _random_node_edit(rnd, value[key])
        return out
    if isinstance(value, list) and value and rnd.random() < 0.7:
        i = rnd.randrange(len(value))
        out = list(value)
        roll = rnd.random()
        if roll < 0.15:
            del out[i]
        elif roll < 0.3:
            out.insert(i, value[i])
        else:
            out[i] = _random_node_edit(rnd, value[i])
        return out
    return random_json(rnd)


def random_request(rnd: random.Random, valid_obs: Any) -> bytes:
    """A valid single-observation request bent by 1-3 random edits (JSON or raw bytes)."""
    body: Any = {"observation": valid_obs}
    for _ in range(rnd.randint(1, 3)):
        roll = rnd.random()
        if roll < 0.45:
            body["observation"] = _random_node_edit(rnd, body.get("observation", valid_obs))
        elif roll < 0.75:
            body[rnd.choice(_FIELDS)] = random_json(rnd)
        elif roll < 0.85 and body:
            body.pop(rnd.choice(list(body)))
        else:
            body = {"observations": [body.get("observation", valid_obs)] * rnd.randint(1, 3)}
    text = bytearray(dumps(body))
    if rnd.random() < 0.25:  # byte-level damage: printable ASCII or invalid UTF-8
        for _ in range(rnd.randint(1, 3)):
            i = rnd.randrange(len(text) + 1)
            op = rnd.random()
            if op < 0.4 and i < len(text):
                del text[i]
            elif op < 0.7 and i < len(text):
                text[i] = ord(rnd.choice(_ASCII + list('{}[],:"')))
            else:
                text[i:i] = rnd.choice([c.encode() for c in _ASCII + list('{}[],:"')] + _BAD_UTF8)
    return bytes(text)
