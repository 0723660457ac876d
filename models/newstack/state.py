"""Reading a new-stack component's files as data: its constructor and its state (torch-free).

Every file goes through the one restricted unpickler (``models/checkpoint/unpickler.py``): a
class the pickle names is recorded by its dotted name and never imported; building or
calling anything that is not known plain data is refused with ``UnsafePickleError`` naming
it. msgpack state files are read as msgpack (numpy arrays in the ``msgpack_numpy`` form).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rlserve.models.checkpoint.errors import CheckpointError
from rlserve.models.checkpoint.files import read_msgpack
from rlserve.models.checkpoint.unpickler import Record, dotted_name, load_pickle

__all__ = ["class_label", "read_ctor", "read_state_file"]

CTOR_FILE = "class_and_ctor_args.pkl"
_BY_VALUE = ("ray.cloudpickle.cloudpickle._make_skeleton_class", "cloudpickle.cloudpickle._make_skeleton_class")


def read_state_file(path: Path) -> Any:
    """A state file (``*.pkl`` or ``*.msgpack``) as data."""
    return read_msgpack(path) if path.suffix == ".msgpack" else load_pickle(path)


def read_ctor(directory: Path) -> dict[str, Any]:
    """``class_and_ctor_args.pkl`` of a component: ``{"class", "args", "kwargs"}``.

    ``class`` stays what the unpickler made of the class reference (a marker or record);
    ``class_label`` names it."""
    path = directory / CTOR_FILE
    data = load_pickle(path)
    if not isinstance(data, Mapping) or "class" not in data:
        raise CheckpointError(f"{path}: expected {{'class': ..., 'ctor_args_and_kwargs': (args, kwargs)}}")
    pair = data.get("ctor_args_and_kwargs", ((), {}))
    if not (isinstance(pair, list | tuple) and len(pair) == 2 and isinstance(pair[1], Mapping)):
        raise CheckpointError(f"{path}: 'ctor_args_and_kwargs' is not (args, kwargs)")
    return {"class": data["class"], "args": tuple(pair[0] or ()), "kwargs": dict(pair[1])}


def class_label(value: Any) -> str:
    """The dotted name of a class reference; a class pickled by value (defined in a script's
    ``__main__``) is named by its own name, as cloudpickle recorded it."""
    dotted = dotted_name(value)
    if dotted is None:
        return type(value).__name__
    if isinstance(value, Record) and dotted.startswith(_BY_VALUE):
        args = value.__dict__["args"]
        name = args[1] if len(args) > 1 and isinstance(args[1], str) else "?"
        return f"{name} (a class pickled by value from its defining script)"
    return dotted
