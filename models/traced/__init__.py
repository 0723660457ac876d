"""Custom RLModules exported by tracing them: the only part of rlserve that runs a checkpoint's code.

``rlserve export CHECKPOINT --trust-code`` comes here for a module class that is not one of
RLlib's defaults (``models/newstack/modules.py``). RLlib restores the module (ray and the
module's package must import: ``loader.py``), ``policy.py`` puts it behind the uniform
contract, ``dists.py`` establishes which rlserve distribution computes what its distribution
class computes, and ``export.py`` traces it into an ordinary bundle, verified against the
eager module. Nothing under ``service/`` knows a bundle was traced.
"""

from rlserve.models.traced.loader import TraceError, require_rllib

__all__ = ["TraceError", "require_rllib"]
