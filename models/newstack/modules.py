"""Which RLModule classes rlserve rebuilds: RLlib's default modules, by class name (torch-free).

A module class is known by its dotted name (never imported). RLlib's default modules are
built by their algorithm's catalog from the model config alone, so they can be rebuilt
here exactly; any other class (or a default module with a custom catalog) holds code the
checkpoint does not carry as data, and is refused with a message saying how to serve it.
"""

from __future__ import annotations

from rlserve.models.checkpoint.errors import CheckpointError

__all__ = ["DEFAULT_MODULES", "CustomModuleError", "module_kind"]

_PPO = "ray.rllib.algorithms.ppo.torch.default_ppo_torch_rl_module.DefaultPPOTorchRLModule"
_APPO = "ray.rllib.algorithms.appo.torch.default_appo_torch_rl_module.DefaultAPPOTorchRLModule"
_DQN = "ray.rllib.algorithms.dqn.torch.default_dqn_torch_rl_module.DefaultDQNTorchRLModule"
_SAC = "ray.rllib.algorithms.sac.torch.default_sac_torch_rl_module.DefaultSACTorchRLModule"

# module class -> (kind, the catalog classes its default build uses)
DEFAULT_MODULES: dict[str, tuple[str, tuple[str, ...]]] = {
    _PPO: ("ppo", ("ray.rllib.algorithms.ppo.ppo_catalog.PPOCatalog",)),
    _APPO: ("ppo", ("ray.rllib.algorithms.appo.appo_catalog.APPOCatalog",
                    "ray.rllib.algorithms.ppo.ppo_catalog.PPOCatalog")),
    _DQN: ("dqn", ("ray.rllib.algorithms.dqn.dqn_catalog.DQNCatalog",)),
    _SAC: ("sac", ("ray.rllib.algorithms.sac.sac_catalog.SACCatalog",)),
}


class CustomModuleError(CheckpointError):
    """The checkpoint's RLModule (or its catalog) is not one of RLlib's default modules."""


def module_kind(module_class: str, catalog_class: str | None, where: str) -> str:
    """``ppo``, ``dqn`` or ``sac``; ``CustomModuleError`` for any other module or catalog."""
    known = DEFAULT_MODULES.get(module_class)
    if known is None:
        raise CustomModuleError(
            f"{where}: the RLModule class {module_class} is not one of RLlib's default modules "
            f"({', '.join(name.rpartition('.')[2] for name in DEFAULT_MODULES)}), so its architecture is code, "
            "not data in the checkpoint. To serve it, register a torch model with rlserve that computes the same "
            "outputs under the same parameter names (a custom model, docs/custom_models.md) and export it with its "
            "weights: `rlserve export --obs-space ... --action-space ... --config ... --weights "
            "<module dir>/module_state.pkl --out ...`"
        )
    kind, catalogs = known
    if catalog_class is not None and catalog_class not in catalogs:
        raise CustomModuleError(
            f"{where}: {module_class.rpartition('.')[2]} is built by the custom catalog {catalog_class} "
            f"(the default is {catalogs[0]}); its networks may differ from the model config's. Serve it as a "
            "custom model registered with rlserve (docs/custom_models.md)"
        )
    return kind
