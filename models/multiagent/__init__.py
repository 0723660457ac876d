"""Multi-agent: the agent-to-policy mapping and policy sets (several bundles under one name).

Torch-free: the server reads both. Exporting a set from a checkpoint is
``rlserve.models.export.policy_set_export``.
"""
