"""``rlserve export CHECKPOINT --out DIR`` as one function (needs torch).

    bundle = export_checkpoint("path/to/checkpoint", "my-policy", policy_id=None)

Everything comes from the checkpoint: spaces, model config, filter statistics or connector
pipelines, ``normalize_actions``/``clip_actions``/``explore`` and weights. Which stack wrote
it is read from its files: an old-stack (ModelV2/Policy) checkpoint goes through
``rlserve.models.checkpoint.read_checkpoint``, a new-stack (RLModule) one through
``rlserve.models.newstack.read_module_checkpoint`` and ``from_rlmodule.export_rlmodule``
(``policy_id`` then picks the module). A server that serves a checkpoint directly exports
it this way into a directory of its own. The command line adds overrides
(``models/export/cli.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from rlserve.models.checkpoint import CheckpointError, PolicyCheckpoint, read_checkpoint
from rlserve.models.export.bundle import Bundle
from rlserve.models.export.describe import describe_action_dist
from rlserve.models.export.from_rlmodule import export_rlmodule
from rlserve.models.newstack import is_new_stack, read_module_checkpoint
from rlserve.models.newstack.modules import CUSTOM_KIND

__all__ = ["export_checkpoint"]


def export_checkpoint(
    checkpoint: str | Path | PolicyCheckpoint,
    out_dir: str | Path,
    *,
    policy_id: str | None = None,
    formats: Sequence[str] = ("onnx", "torchscript"),
    name: str | None = None,
    version: str | None = None,
    progress: Callable[[str], None] | None = None,
    trust_code: bool = False,
) -> Bundle:
    """Export one policy of an RLlib checkpoint to a verified bundle at ``out_dir``.

    Raises ``CheckpointError`` when the checkpoint cannot be read or lacks the filter its
    config names (``CustomModuleError`` for an RLModule that is not a default one, unless
    ``trust_code``: then it is traced, ``TraceError`` where it cannot be),
    ``WeightImportError``/``RLModuleWeightError`` when its weights do not fit the model its
    config describes, ``RLModuleExportError`` for connectors a bundle cannot reproduce,
    ``BundleError`` when a runtime disagrees with eager torch.
    """
    from rlserve.models.catalog import build_model
    from rlserve.models.export.exporter import export_bundle
    from rlserve.models.rllib_import import load_rllib_weights

    if not isinstance(checkpoint, PolicyCheckpoint) and is_new_stack(checkpoint):
        module = read_module_checkpoint(checkpoint, policy_id, trust_code=trust_code)
        if module.kind == CUSTOM_KIND:  # the user's module class: traced (needs ray)
            from rlserve.models.traced.export import export_traced_module

            return export_traced_module(module, out_dir, formats=tuple(formats), name=name, version=version,
                                        progress=progress)
        return export_rlmodule(module, out_dir, formats=tuple(formats), name=name, version=version,
                               progress=progress)
    ckpt = checkpoint if isinstance(checkpoint, PolicyCheckpoint) else read_checkpoint(checkpoint, policy_id)
    if ckpt.filter_missing:
        raise CheckpointError(ckpt.filter_missing)
    model = build_model(ckpt.observation_space, ckpt.action_space, ckpt.model_config)
    load_rllib_weights(model, ckpt.weights)
    return export_bundle(
        model.eval(), obs_space=ckpt.observation_space, action_space=ckpt.action_space,
        model_config=ckpt.model_config, out_dir=out_dir, formats=formats, filter_state=ckpt.filter_state,
        name=name or ckpt.policy_id or Path(out_dir).name, version=version, progress=progress,
        explore=ckpt.explore, action_dist=describe_action_dist(ckpt.action_space, ckpt.model_config),
        normalize_actions=ckpt.normalize_actions, clip_actions=ckpt.clip_actions, source=ckpt.source_json(),
    )
