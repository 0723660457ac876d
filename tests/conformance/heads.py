"""What a model with an action head (kinds ``q_model`` and ``autoregressive``) must output.

The graph's outputs (``HeadedPolicy``: ``dist_inputs``, ``value``, ``model_out`` and the
head's extras) against the io keys RLlib recorded, per kind (never per case):

- q_model: ``dist_inputs`` = ``q_values`` (the policy's dueling sum), ``value`` = max_a Q,
  ``model_out`` (the embedding), ``advantages``, ``state_value`` (dueling only), ``base_value``.
- autoregressive: ``dist_inputs`` = [``a1_logits`` | ``a2_logits/a1=0`` | ``a2_logits/a1=1``],
  ``value``, ``model_out`` (the context).
"""

from __future__ import annotations

import numpy as np
from oracle import OracleCase

HEAD_KINDS = ("q_model", "autoregressive")


def a2_keys(case: OracleCase) -> list[str]:
    """``a2_logits/a1=<v>`` keys in a1 order."""
    keys = [k for k in case.io if k.startswith("a2_logits/a1=")]
    return sorted(keys, key=lambda k: int(k.rsplit("=", 1)[1]))


def expected_graph_outputs(case: OracleCase) -> dict[str, tuple[np.ndarray, tuple[str, ...]]]:
    """graph output name -> (expected array, the io keys it stands for)."""
    io = case.io
    if case.kind == "q_model":
        out = {
            "dist_inputs": (io["q_values"], ("q_values",)),
            "value": (io["q_values"].max(axis=1), ()),
            "model_out": (io["model_out"], ("model_out",)),
            "advantages": (io["advantages"], ("advantages",)),
            "base_value": (io["base_value"], ("base_value",)),
        }
        if "state_value" in io:
            out["state_value"] = (io["state_value"], ("state_value",))
        return out
    if case.kind == "autoregressive":
        blocks = ["a1_logits", *a2_keys(case)]
        return {
            "dist_inputs": (np.concatenate([io[k] for k in blocks], axis=1), tuple(blocks)),
            "value": (io["value"], ("value",)),
            "model_out": (io["model_out"], ("model_out",)),
        }
    return {"dist_inputs": (io["model_out"], ("model_out",)), "value": (io["value"], ("value",))}
