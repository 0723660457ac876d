"""RLlib's new-stack env-to-module connectors for a bundle (torch-free).

``plan.py`` decides which run on the server (numpy, ``stages.py``) and which in the model's
graph (``models/rlmodules/graph.py``); ``flatten.py`` is ``FlattenObservations``' arithmetic.
"""

from rlserve.models.connectors.plan import ConnectorLayout, ConnectorPlanError, plan_connectors
from rlserve.models.connectors.stages import ConnectorPipeline

__all__ = ["ConnectorLayout", "ConnectorPipeline", "ConnectorPlanError", "plan_connectors"]
