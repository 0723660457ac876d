"""Which RLModule classes rlserve rebuilds: RLlib's default modules, by class name (torch-free).

A module class is known by its dotted name (never imported). RLlib's default modules are
built by their algorithm's catalog from the model config alone, so they can be rebuilt
here exactly; any other class (or a default module with a custom catalog) holds code the
checkpoint does not carry as data, and is refused with a message saying how to serve it.
"""

from __future__ import annotations

from rlserve.models.checkpoint.errors import CheckpointError

__all__ = ["CUSTOM_KIND", "DEFAULT_MODULES", "CustomModuleError", "module_kind"]

CUSTOM_KIND = "custom"  # a module class of the user's: exported by tracing it (--trust-code)

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


TRUST_HINT = ("export it by tracing, with `rlserve export CHECKPOINT --trust-code --out DIR` run where ray and the "
              "module's code import (it imports and runs the checkpoint's classes); the bundle it writes is "
              "served without either (docs/newstack.md, \"Your own module\")")


def module_kind(module_class: str, catalog_class: str | None, where: str, *, trust_code: bool = False) -> str:
    """``ppo``, ``dqn`` or ``sac``; ``CustomModuleError`` for any other module or catalog,
    or ``"custom"`` for those when ``trust_code`` (the exporter traces them)."""
    known = DEFAULT_MODULES.get(module_class)
    if known is None:
        if trust_code:
            return CUSTOM_KIND
        raise CustomModuleError(
            f"{where}: the RLModule class {module_class} is not one of RLlib's default modules "
            f"({', '.join(name.rpartition('.')[2] for name in DEFAULT_MODULES)}), so its architecture is code, "
            f"not data in the checkpoint: {TRUST_HINT}"
        )
    kind, catalogs = known
    if catalog_class is not None and catalog_class not in catalogs:
        if trust_code:
            return CUSTOM_KIND
        raise CustomModuleError(
            f"{where}: {module_class.rpartition('.')[2]} is built by the custom catalog {catalog_class} "
            f"(the default is {catalogs[0]}); its networks may differ from the model config's: {TRUST_HINT}"
        )
    return kind
