"""RLlib's new-stack default RLModules rebuilt in torch (for export), beside the old networks.

``build_rlmodule_policy`` / ``load_rlmodule_weights`` (``catalog.py``); the modules
(``modules.py``), their encoders and layers, the connector stages exported into the graph
(``graph.py``) and the adapter to the uniform policy contract (``policy.py``).
"""
