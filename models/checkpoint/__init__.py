"""Read RLlib (old API stack, torch) checkpoints without ray and without running their code.

    read_checkpoint(path, policy_id=None) -> PolicyCheckpoint   spaces, model config,
        filter statistics, normalize/clip settings and weights of one policy
    locate(path, policy_id=None) -> CheckpointFiles            which files hold it

Pickles are read by a data-only unpickler (``unpickler.py``); msgpack checkpoints need the
``msgpack`` package. Errors are ``CheckpointError`` (a ``ValueError``) naming the file.
"""

from rlserve.models.checkpoint.errors import CheckpointError
from rlserve.models.checkpoint.files import CheckpointFiles, locate, read_state
from rlserve.models.checkpoint.policy import PolicyCheckpoint, policy_weights, read_checkpoint
from rlserve.models.checkpoint.unpickler import UnsafePickleError, load_pickle, load_pickle_bytes

__all__ = [
    "CheckpointError",
    "CheckpointFiles",
    "PolicyCheckpoint",
    "UnsafePickleError",
    "load_pickle",
    "load_pickle_bytes",
    "locate",
    "policy_weights",
    "read_checkpoint",
    "read_state",
]
