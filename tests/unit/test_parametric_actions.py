"""RLlib's TorchParametricActionsModel: build-time checks and the masking rule.

The recorded cases (kind ``parametric_actions``) are compared by the conformance suite
(catalog and both runtimes) and served over HTTP in tests/e2e/test_custom_models_e2e.py.
"""

from __future__ import annotations

import gymnasium.spaces as gs
import numpy as np
import pytest
import torch

from rlserve.models.catalog import build_model, describe_model
from rlserve.models.preprocessors import get_preprocessor

PATH = "ray.rllib.examples._old_api_stack.models.parametric_actions_model.TorchParametricActionsModel"


def _obs_space(n: int = 3, embed: int = 2, cart: int = 4) -> gs.Dict:
    return gs.Dict({"action_mask": gs.Box(0.0, 1.0, (n,)), "avail_actions": gs.Box(-1.0, 1.0, (n, embed)),
                    "cart": gs.Box(-1.0, 1.0, (cart,))})


def _config(**custom) -> dict:
    return {"custom_model": PATH, "custom_model_config": custom, "fcnet_hiddens": [8]}


def test_recognised_by_rllibs_class_path() -> None:
    assert describe_model(_obs_space(), gs.Discrete(3), _config()) == "TorchParametricActionsModel"


@pytest.mark.parametrize(
    ("obs_space", "action_space", "custom", "message"),
    [
        (_obs_space(n=4), gs.Discrete(3), {}, "'action_mask' must have shape [3]"),
        (_obs_space(embed=3), gs.Discrete(3), {}, "'avail_actions' must have shape [3, 2]"),
        (_obs_space(cart=5), gs.Discrete(3), {}, "true_obs_shape: expected 5 values"),
        (_obs_space(), gs.Discrete(3), {"use_noisy": True}, "use_noisy"),
        (gs.Box(-1.0, 1.0, (4,)), gs.Discrete(3), {}, "expected a Dict observation space"),
        (_obs_space(), gs.Box(-1.0, 1.0, (3,)), {}, "expected a Discrete action space"),
    ],
)
def test_mismatches_are_refused_at_build(obs_space, action_space, custom, message) -> None:
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        build_model(obs_space, action_space, _config(**custom))


def test_masked_slots_are_float_min_and_logits_are_dot_products() -> None:
    space = _obs_space(n=3, embed=2, cart=4)
    config = _config(true_obs_shape=[2, 2], dueling=True, q_hiddens=[5])
    model = build_model(space, gs.Discrete(3), config).eval()
    assert {n for n, _ in model.named_parameters() if n.startswith("base.value_module.")}  # dueling V-head built
    rows = [{"action_mask": np.array(m, np.float32), "avail_actions": np.full((3, 2), v, np.float32),
             "cart": np.linspace(-1, 1, 4).astype(np.float32)} for m, v in (([1, 0, 1], 0.5), ([0, 1, 0], -2.0))]
    flat = torch.from_numpy(get_preprocessor(space, config).transform_batch(rows))
    with torch.no_grad():
        logits, value = model(flat)
        intent, inner_value = model.base.action_embed_model(flat[:, -4:].reshape(2, 2, 2))
    torch.testing.assert_close(value, inner_value)
    assert logits[0, 0] == pytest.approx(float(intent[0].sum()) * 0.5, abs=1e-6)
    assert logits[1, 1] == pytest.approx(float(intent[1].sum()) * -2.0, abs=1e-6)
    float_min = float(np.float32(-3.4e38))
    assert logits[0, 1].item() == logits[1, 0].item() == logits[1, 2].item() == float_min
    assert torch.isfinite(torch.log_softmax(logits, dim=1)).all()
