"""Load a checkpoint's RLModule with RLlib's own loader: the one place that runs its code.

Only ``rlserve export --trust-code`` comes here. ``require_rllib`` says in one line what to
install when ray cannot be imported; ``load_module`` restores the module the way RLlib
restores it (``RLModule.from_checkpoint``, which unpickles the class and its constructor
arguments and loads the weights), and returns what a forward pass needs:

- a module inside a MultiRLModule checkpoint is reached through the MultiRLModule, so a
  member that reads what its parent computes (a shared encoder) gets it;
- a module directory saved on its own is restored alone.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rlserve.models.newstack.layout import CTOR_FILE, ModuleFiles

__all__ = ["LoadedModule", "TraceError", "import_user_modules", "load_module", "require_rllib"]

RLLIB_REQUIREMENT = 'ray[rllib]==2.60.0'


class TraceError(ValueError):
    """The module cannot be exported by tracing (the message says why, in one line)."""


def require_rllib(module_class: str) -> None:
    """Import RLlib, or say in one line what ``--trust-code`` needs."""
    try:
        importlib.import_module("ray.rllib.core.rl_module.rl_module")
    except ImportError as exc:
        raise TraceError(
            f"--trust-code restores {module_class} with RLlib's own loader, and ray cannot be imported here "
            f"({exc.name or exc}): run the export in the environment the module was trained in, or install "
            f"\"{RLLIB_REQUIREMENT}\" and the module's package beside rlserve[torch]"
        ) from None


def import_user_modules(names: Sequence[str]) -> None:
    """``--import``: the user's modules, which register their classes with RLlib's catalog."""
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as exc:
            raise TraceError(f"--import {name}: {type(exc).__name__}: {exc}") from None


@dataclass
class LoadedModule:
    """The restored module (``member``) and the object whose forward pass serves it (``root``:
    the MultiRLModule around it, or the module itself)."""

    root: Any
    member: Any
    module_id: str | None  # the key of ``member`` in ``root``; None when root is the member

    def torch_modules(self) -> dict[str, Any]:
        """The torch modules whose parameters the forward pass may read (a MultiRLModule is
        no ``torch.nn.Module`` itself: its members are)."""
        if self.module_id is None:
            return {"module": self.root}
        return {str(mid): member for mid, member in self.root.items()}

    def forward(self, method: str, batch: dict[str, Any]) -> dict[str, Any]:
        """``root.<method>`` on a one-module batch; the member's outputs."""
        if self.module_id is None:
            return getattr(self.root, method)(batch)
        return getattr(self.root, method)({self.module_id: batch})[self.module_id]


def load_module(files: ModuleFiles, module_class: str) -> LoadedModule:
    """Restore the module of ``files`` (imports and runs the checkpoint's classes)."""
    require_rllib(module_class)
    from ray.rllib.core.rl_module.rl_module import RLModule

    parent = files.directory.parent.resolve()  # RLlib reads a relative path as a URI without a scheme
    try:
        if (parent / CTOR_FILE).is_file() and (parent / "metadata.json").is_file():
            root = RLModule.from_checkpoint(str(parent))
            if files.module_id in getattr(root, "keys", lambda: ())():
                for member in root.values():
                    member.eval()
                return LoadedModule(root=root, member=root[files.module_id], module_id=files.module_id)
        module = RLModule.from_checkpoint(str(files.directory.resolve()))
    except ImportError as exc:
        raise TraceError(f"{module_class}: its code does not import here ({exc}); install the package that "
                         "defines it, or run the export where it was trained") from None
    except Exception as exc:  # whatever the user's constructor raises
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise TraceError(f"{module_class}: RLlib could not restore it from {files.directory.name}: "
                         f"{type(exc).__name__}: {first}") from None
    module.eval()
    return LoadedModule(root=module, member=module, module_id=None)
