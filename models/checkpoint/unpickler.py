"""Read RLlib's pickles as data: nothing named in the file is imported or run (torch-free).

A pickle names globals (``module.qualname``) and asks the reader to call them. This
reader answers every name from three fixed tables and never imports anything:

- **data**: numpy arrays, dtypes and scalars, the builtin containers and numbers,
  ``OrderedDict``/``defaultdict``/``deque``, latin-1 bytes (``_codecs.encode``);
- **records**: classes known to be plain state in RLlib checkpoints (gymnasium spaces,
  RLlib's Repeated/Simplex, filters and running statistics, its config, callback, stats
  and enum classes, ``packaging`` versions, cloudpickle's by-value helpers, numpy's random
  generators). An object of such a class becomes a ``Record``: its class name, the
  arguments it was built with and the state it was given, nothing else. ``records.py``
  turns the records an export needs (spaces, filters) into real values;
- **everything else** becomes a ``ForeignClass`` marker. A checkpoint may *name* any class
  as a value (``config["env"] = MyEnv``): the marker keeps the dotted name. Building an
  object of it, or calling it, is refused with ``UnsafePickleError`` naming
  ``module.qualname``; so is any persistent id or out-of-band buffer.
"""

from __future__ import annotations

import _compat_pickle
import collections
import functools
import io
import pickle
from pathlib import Path
from typing import Any, ClassVar, cast

import numpy as np

from rlserve.models.checkpoint.errors import CheckpointError

__all__ = [
    "ForeignClass",
    "Record",
    "UnsafePickleError",
    "dotted_name",
    "load_pickle",
    "load_pickle_bytes",
]


class UnsafePickleError(CheckpointError):
    """The pickle asks to build or call something that is not known to be plain data."""


# --------------------------------------------------------------------------- records

class Record:
    """An object of a known plain-state class, kept as data (``qualname``, args, state).

    Pickle rebuilds objects through ``cls.__new__``/``cls(*args)``, ``__setstate__``,
    item and list appends: each is recorded here, none runs the class's own code.
    """

    qualname: ClassVar[str] = "Record"

    def __new__(cls, *args: Any, **kwargs: Any) -> Record:
        self = object.__new__(cls)
        self.__dict__.update(args=args, kwargs=kwargs, state=None, items={}, list_items=[])
        return self

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:
        self.__dict__["state"] = state

    def __setitem__(self, key: Any, value: Any) -> None:
        self.__dict__["items"][key] = value

    def append(self, value: Any) -> None:
        self.__dict__["list_items"].append(value)

    def extend(self, values: Any) -> None:
        self.__dict__["list_items"].extend(values)

    def __call__(self, *args: Any, **kwargs: Any) -> Record:
        # cloudpickle's helpers return functions and classes that are called again.
        return _record_class(f"{self.qualname}(...)")(*args, **kwargs)

    @property
    def fields(self) -> dict[str, Any]:
        """The object's attributes: its ``__setstate__`` dict (or the dict part of a
        ``(dict, slots)`` pair) merged with keyword arguments."""
        state = self.__dict__["state"]
        if isinstance(state, tuple) and len(state) == 2 and all(isinstance(s, dict | type(None)) for s in state):
            merged = {**(state[0] or {}), **(state[1] or {})}
        else:
            merged = dict(state) if isinstance(state, dict) else {}
        return {**self.__dict__["kwargs"], **merged}

    def __repr__(self) -> str:
        return f"<{self.qualname} record>"


@functools.cache
def _record_class(qualname: str) -> type[Record]:
    return type(qualname.rpartition(".")[2] or qualname, (Record,), {"qualname": qualname})


class ForeignClass:
    """Base of the markers for globals the reader does not know: inert as a value,
    refused when the pickle builds or calls one."""

    qualname: ClassVar[str] = "ForeignClass"

    def __new__(cls, *args: Any, **kwargs: Any) -> ForeignClass:
        raise UnsafePickleError(
            f"refusing to build or call {cls.qualname}: it is not among the classes known to "
            "hold plain data in RLlib checkpoints (nothing a checkpoint names is imported or run)"
        )


@functools.cache
def _foreign_class(qualname: str) -> type[ForeignClass]:
    return type(qualname.rpartition(".")[2] or qualname, (ForeignClass,), {"qualname": qualname})


def dotted_name(value: Any) -> str | None:
    """``module.qualname`` of a record or marker (class or instance); None for plain data."""
    for kind in (Record, ForeignClass):
        if isinstance(value, kind) or (isinstance(value, type) and issubclass(value, kind)):
            return cast(Any, value).qualname
    return None


# --------------------------------------------------------------------------- tables

def _latin1_bytes(text: str, encoding: str = "latin1") -> bytes:
    """Protocol-2 pickles spell bytes as ``_codecs.encode(text, 'latin1')``; nothing else."""
    if encoding not in ("latin1", "latin-1") or not isinstance(text, str):
        raise UnsafePickleError(f"_codecs.encode with encoding {encoding!r}: only latin1 bytes are read")
    return text.encode("latin1")


_SINGLETON_TYPES = {type(None): None, type(...): ..., type(NotImplemented): NotImplemented}


def _singleton_type(*args: object) -> type:
    """cloudpickle spells ``NoneType`` (and the Ellipsis/NotImplemented types) as
    ``type(None)``; ``type`` with any other argument, or three (a new class), is refused."""
    for kind, instance in _SINGLETON_TYPES.items():
        if len(args) == 1 and args[0] is instance:
            return kind
    raise UnsafePickleError(f"refusing to call builtins.type with {len(args)} argument(s): only type(None) is read")


def _numpy_globals() -> dict[tuple[str, str], Any]:
    # Taken from numpy's own reductions so the names match this numpy's module layout.
    reconstruct = cast(tuple[Any, ...], np.zeros(1).__reduce__())[0]
    scalar = cast(tuple[Any, ...], np.float32(0).__reduce__())[0]
    frombuffer = cast(tuple[Any, ...], np.zeros(1).__reduce_ex__(5))[0]  # protocol 5
    table: dict[tuple[str, str], Any] = {("numpy", "ndarray"): np.ndarray, ("numpy", "dtype"): np.dtype}
    for module in ("numpy.core.multiarray", "numpy._core.multiarray"):
        table[(module, "_reconstruct")] = reconstruct
        table[(module, "scalar")] = scalar
    for module in ("numpy.core.numeric", "numpy._core.numeric"):
        table[(module, "_frombuffer")] = frombuffer
    numeric = (np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32,
               np.uint64, np.float16, np.float32, np.float64, np.complex64, np.complex128)
    table.update({("numpy", t.__name__): t for t in numeric})
    return table


_DATA: dict[tuple[str, str], Any] = {
    **_numpy_globals(),
    **{("builtins", t.__name__): t for t in (
        int, float, complex, bool, str, bytes, bytearray, list, dict, tuple, set, frozenset, slice, range,
    )},
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("collections", "defaultdict"): collections.defaultdict,
    ("collections", "deque"): collections.deque,
    ("_codecs", "encode"): _latin1_bytes,
    ("builtins", "type"): _singleton_type,
}

# Classes whose objects in RLlib checkpoints are plain state (see the module docstring).
_RECORD_NAMES: dict[str, tuple[str, ...]] = {
    "gymnasium.spaces.box": ("Box",),
    "gymnasium.spaces.discrete": ("Discrete",),
    "gymnasium.spaces.multi_discrete": ("MultiDiscrete",),
    "gymnasium.spaces.multi_binary": ("MultiBinary",),
    "gymnasium.spaces.tuple": ("Tuple",),
    "gymnasium.spaces.dict": ("Dict",),
    "gymnasium.spaces.text": ("Text",),
    "gymnasium.core": ("Env",),
    "gym.spaces.box": ("Box",),
    "gym.spaces.discrete": ("Discrete",),
    "gym.spaces.multi_discrete": ("MultiDiscrete",),
    "gym.spaces.multi_binary": ("MultiBinary",),
    "gym.spaces.tuple": ("Tuple",),
    "gym.spaces.dict": ("Dict",),
    "ray.rllib.utils.spaces.repeated": ("Repeated",),
    "ray.rllib.utils.spaces.simplex": ("Simplex",),
    "ray.rllib.utils.spaces.flexdict": ("FlexDict",),
    "ray.rllib.utils.filter": ("MeanStdFilter", "ConcurrentMeanStdFilter", "NoFilter", "RunningStat"),
    "ray.rllib.algorithms.algorithm_config": (
        "AlgorithmConfig", "TorchCompileWhatToCompile", "AlgorithmConfig.DEFAULT_POLICY_MAPPING_FN",
    ),
    "ray.rllib.policy.policy": ("PolicySpec",),
    "ray.rllib.callbacks.callbacks": ("RLlibCallback",),
    "ray.rllib.algorithms.callbacks": ("DefaultCallbacks",),
    "ray.rllib.evaluation.collectors.simple_list_collector": ("SimpleListCollector",),
    "packaging.version": ("Version", "_Version"),
    # New API stack: module specs (spaces, model config, class names) and the device a
    # connector pipeline's NumpyToTensor was built for.
    "ray.rllib.core.rl_module.rl_module": ("RLModuleSpec",),
    "ray.rllib.core.rl_module.multi_rl_module": ("MultiRLModuleSpec",),
    "torch": ("device",),
    # cloudpickle spells a class attribute it needs (e.g. a method of a by-value class)
    # as ``getitem(cls.__dict__, name)``; as a record it is only the pair, nothing is looked up.
    "_operator": ("getitem",),
    # ... and a by-value module's ``logger = logging.getLogger(name)`` as that call.
    "logging": ("getLogger",),
    "ray.rllib.core.rl_module.default_model_config": ("DefaultModelConfig",),
    "numpy.random._pickle": ("__generator_ctor", "__bit_generator_ctor", "__randomstate_ctor"),
    "numpy.random.bit_generator": ("__pyx_unpickle_SeedSequence",),
}
# Whole modules of plain-state classes: RLlib's metrics statistics and its algorithm
# configs (``PPOConfig`` ...), and cloudpickle's helpers that rebuild by-value classes
# and functions (their results stay records: no code object is ever built).
_RECORD_MODULE_PREFIXES = (
    "ray.rllib.utils.metrics.stats.",
    "ray.cloudpickle.cloudpickle",
    "cloudpickle.cloudpickle",
)
_RECORD_SUFFIX_IN = {"ray.rllib.algorithms.": "Config"}


def _is_record(module: str, name: str) -> bool:
    if name in _RECORD_NAMES.get(module, ()):
        return True
    if module.startswith(_RECORD_MODULE_PREFIXES):
        return True
    return any(module.startswith(p) and name.endswith(s) for p, s in _RECORD_SUFFIX_IN.items())


# --------------------------------------------------------------------------- reader

class _DataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        # Protocol 0-2 pickles may spell builtins the Python 2 way (__builtin__.set).
        module, name = _compat_pickle.NAME_MAPPING.get((module, name), (module, name))
        module = _compat_pickle.IMPORT_MAPPING.get(module, module)
        if (module, name) in _DATA:
            return _DATA[(module, name)]
        qualname = f"{module}.{name}"
        if _is_record(module, name):
            return _record_class(qualname)
        return _foreign_class(qualname)

    def persistent_load(self, pid: Any) -> Any:
        raise UnsafePickleError(f"the pickle refers to an external object (persistent id {pid!r}); not supported")


def load_pickle_bytes(data: bytes, source: str | Path) -> Any:
    """Read one pickle from ``data``; errors name ``source`` (the file it came from)."""
    try:
        return _DataUnpickler(io.BytesIO(data)).load()
    except UnsafePickleError as exc:
        raise UnsafePickleError(f"{source}: {exc}") from None
    except (pickle.UnpicklingError, EOFError, TypeError, ValueError, AttributeError, IndexError, KeyError) as exc:
        raise CheckpointError(f"{source}: not a readable pickle ({type(exc).__name__}: {exc})") from None


def load_pickle(path: str | Path) -> Any:
    """Read the pickle file at ``path`` as data (see the module docstring)."""
    path = Path(path)
    return load_pickle_bytes(path.read_bytes(), path)
