"""Read RLlib new-API-stack (RLModule) checkpoints without ray and without running their code.

    is_new_stack(path) -> bool                                which stack a directory is
    read_module_checkpoint(path, module_id=None) -> ModuleCheckpoint   spaces, model config,
        weights and connector pipelines of one module
    locate_module(path, module_id=None) -> ModuleFiles        which files hold it
    checkpoint_module_ids(path) -> list[str]                  the modules it holds

Accepts the algorithm directory, ``learner_group/learner/rl_module`` or one module's
directory. Errors are ``CheckpointError`` (a ``ValueError``) naming the file; an RLModule
that is not one of RLlib's default modules raises ``CustomModuleError``.
"""

from rlserve.models.newstack.connectors import ConnectorPlan, ConnectorStep
from rlserve.models.newstack.layout import (
    ModuleFiles,
    checkpoint_module_ids,
    is_new_stack,
    locate_module,
    module_ids,
)
from rlserve.models.newstack.modules import CustomModuleError
from rlserve.models.newstack.reader import ModuleCheckpoint, read_module_checkpoint

__all__ = [
    "ConnectorPlan",
    "ConnectorStep",
    "CustomModuleError",
    "ModuleCheckpoint",
    "ModuleFiles",
    "checkpoint_module_ids",
    "is_new_stack",
    "locate_module",
    "module_ids",
    "read_module_checkpoint",
]
