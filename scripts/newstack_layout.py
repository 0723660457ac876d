"""What a new-stack checkpoint folder holds, as reference.json's ``layout`` and pipeline
fields describe it (``shared/oracle/newstack/README.md`` (a)): every file with its size and
format, for pickles the globals the unpickler resolves (found by unpickling with a
recording unpickler) and a structural summary, the ``class_and_ctor_args.pkl`` contents,
the connector states, and the restored EnvRunner's connector pipelines. Needs ray (the
pickles name its classes); used by record_custom_modules.py.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from newstack_json import _jsonable, space_json
from newstack_restored import _state_dicts

# --------------------------------------------------------------------------- summaries

_KEYS_SHOWN = 12  # a summarised dict names this many of its keys
_LONG = 60  # longer strings are cut to this many characters


def _dotted(obj: Any) -> str:
    return f"{obj.__module__}.{obj.__qualname__}"


def summarize(value: Any, depth: int = 0, dict_limit: int = 3, seq_limit: int = 4) -> Any:
    """A JSON value describing ``value``'s structure: dicts above ``dict_limit`` and sequences
    above ``seq_limit`` levels deep by their keys / length, the rest in full; arrays by shape
    and dtype; long strings cut; classes, spaces, callables and other objects by their dotted
    names."""
    if isinstance(value, str) and len(value) > _LONG:
        return f"{value[:_LONG]}...({len(value)} chars)"
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return f"ndarray{list(value.shape)} {value.dtype}"
    if isinstance(value, dict):
        if depth >= dict_limit:
            keys = [str(k) for k in value]
            return {"__dict__": f"{len(keys)} keys: {', '.join(keys[:_KEYS_SHOWN])}"}
        return {str(k): summarize(v, depth + 1, dict_limit, seq_limit) for k, v in value.items()}
    if isinstance(value, list | tuple):
        if depth >= seq_limit:
            return f"{type(value).__name__}[{len(value)}]"
        return [summarize(v, depth + 1, dict_limit, seq_limit) for v in value]
    if isinstance(value, set | frozenset):
        return repr(sorted(value, key=str)).replace("[", "{").replace("]", "}")
    if isinstance(value, bytes):
        return f"bytes[{len(value)}]"
    if isinstance(value, type):
        return f"<class {_dotted(value)}>"
    if isinstance(value, gym.Space):
        return f"<space {value}>"
    if callable(value) and hasattr(value, "__qualname__"):
        return f"<function {value.__module__}.{value.__qualname__}>"
    return f"<{_dotted(type(value))}>"


class _RecordingUnpickler(pickle.Unpickler):
    """Unpickles as usual and notes every global it resolves."""

    def __init__(self, file):
        super().__init__(file)
        self.globals: set[str] = set()

    def find_class(self, module: str, name: str) -> Any:
        self.globals.add(f"{module}.{name}")
        return super().find_class(module, name)


def _load_pickle(path: Path) -> tuple[Any, list[str]]:
    with path.open("rb") as f:
        unpickler = _RecordingUnpickler(f)
        value = unpickler.load()
    return value, sorted(unpickler.globals)


def _load_msgpack(path: Path) -> Any:
    import msgpack
    import msgpack_numpy

    return msgpack.unpackb(path.read_bytes(), object_hook=msgpack_numpy.decode, strict_map_key=False)


def _file_entry(checkpoint: Path, path: Path) -> dict[str, Any]:
    entry: dict[str, Any] = {"path": str(path.relative_to(checkpoint)), "size": path.stat().st_size}
    if path.suffix == ".json":
        entry.update(format="json", content=json.loads(path.read_text()))
    elif path.suffix == ".pkl":
        value, imports = _load_pickle(path)
        entry.update(format="pickle (ray.cloudpickle)", imports_globals=imports, summary=summarize(value))
    elif path.suffix == ".msgpack":
        entry.update(format="msgpack", summary=summarize(_load_msgpack(path)))
    else:
        entry["format"] = "other"
    return entry


def _ctor_file(value: dict[str, Any]) -> dict[str, Any]:
    args, kwargs = value["ctor_args_and_kwargs"]
    # the shared cases' depths: the args tuple one level below the kwargs dict, one limit for both
    return {"class": summarize(value["class"]), "args": summarize(list(args), 1, 3, 3),
            "kwargs": summarize(kwargs, 0, 3, 3)}


def layout(checkpoint: Path) -> dict[str, Any]:
    """reference.json's ``layout``: files (walk order: a folder's files, then its subfolders),
    module state dicts, class_and_ctor_args per file, connector states, total bytes."""
    files: list[Path] = []

    def walk(folder: Path) -> None:
        entries = sorted(folder.iterdir(), key=lambda p: p.name)
        files.extend(p for p in entries if p.is_file())
        for sub in (p for p in entries if p.is_dir()):
            walk(sub)

    walk(checkpoint)
    ctor = {str(p.relative_to(checkpoint)): _ctor_file(_load_pickle(p)[0])
            for p in files if p.name == "class_and_ctor_args.pkl"}
    states = {}
    for p in files:
        rel = p.relative_to(checkpoint)
        if p.stem == "state" and "connector" in str(rel.parent) and rel.parent.name not in (
                "env_to_module_connector", "module_to_env_connector"):
            value = _load_pickle(p)[0] if p.suffix == ".pkl" else _load_msgpack(p)
            states[str(rel)] = summarize(value)
    return {
        "files": [_file_entry(checkpoint, p) for p in files],
        "module_state_dicts": _state_dicts(checkpoint),
        "class_and_ctor_args": ctor,
        "connector_states": states,
        "total_bytes": sum(p.stat().st_size for p in files),
    }


# --------------------------------------------------------------------------- pipelines

def _space(space: Any) -> Any:
    if space is None:
        return None
    try:
        return space_json(space)
    except TypeError:
        return str(space)


def _ctor_kwargs(connector: Any) -> dict[str, Any]:
    _, kwargs = connector.get_ctor_args_and_kwargs()
    out = {}
    for key, value in kwargs.items():
        if isinstance(value, gym.Space):
            out[key] = _space(value)
        elif value is None or isinstance(value, bool | int | float | str):
            out[key] = value
        elif callable(value) and hasattr(value, "__qualname__") and not isinstance(value, type):
            out[key] = f"<callable {value.__module__}.{value.__qualname__}>"
        elif isinstance(value, dict | list | tuple | set | frozenset | type | np.ndarray):
            out[key] = summarize(value, 2)
        else:  # e.g. a torch.device: its string
            out[key] = str(value)
    return out


def pipeline_json(pipeline: Any) -> dict[str, Any]:
    """A restored connector pipeline: its input spaces, output obs space and per connector
    the class, stored ctor kwargs, output obs space and state."""
    connectors = []
    for connector in pipeline.connectors:
        state = connector.get_state()
        connectors.append({"class": _dotted(type(connector)), "ctor_kwargs": _ctor_kwargs(connector),
                           "output_observation_space": _space(connector.observation_space),
                           "state": _jsonable(state) if state else {}})
    return {"input_observation_space": _space(pipeline.input_observation_space),
            "input_action_space": _space(pipeline.input_action_space),
            "output_observation_space": _space(pipeline.observation_space),
            "connectors": connectors}
