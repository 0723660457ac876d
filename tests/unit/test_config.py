"""Model config: defaults, merge, deprecated keys, type checks, fixture configs."""

from __future__ import annotations

import warnings

import pytest
from gymnasium import spaces as gs
from oracle import case_names, catalog_config, load_case

from rlserve.models.config import (
    DEPRECATED_VALUE,
    MODEL_DEFAULTS,
    ConfigError,
    canonical_activation,
    merge_model_config,
    validate_model_config,
)


def test_defaults_cover_the_seed_keys_with_rllib_values() -> None:
    # Values from RLlib's documented MODEL_DEFAULTS (shared/seeds/001, ray 2.60 adds more keys).
    expected = {
        "fcnet_hiddens": [256, 256], "fcnet_activation": "tanh", "conv_filters": None,
        "conv_activation": "relu", "post_fcnet_hiddens": [], "post_fcnet_activation": "relu",
        "free_log_std": False, "no_final_linear": False, "vf_share_layers": True, "use_lstm": False,
        "max_seq_len": 20, "lstm_cell_size": 256, "lstm_use_prev_action": False,
        "lstm_use_prev_reward": False, "_time_major": False, "use_attention": False,
        "attention_num_transformer_units": 1, "attention_dim": 64, "attention_num_heads": 1,
        "attention_head_dim": 32, "attention_memory_inference": 50, "attention_memory_training": 50,
        "attention_position_wise_mlp_dim": 32, "attention_init_gru_gate_bias": 2.0,
        "attention_use_n_prev_actions": 0, "attention_use_n_prev_rewards": 0, "framestack": True,
        "dim": 84, "grayscale": False, "zero_mean": True, "custom_model": None,
        "custom_model_config": {}, "custom_action_dist": None, "custom_preprocessor": None,
        "encoder_latent_dim": None, "always_check_shapes": False,
        "lstm_use_prev_action_reward": DEPRECATED_VALUE, "_use_default_native_models": DEPRECATED_VALUE,
        "_disable_preprocessor_api": False, "_disable_action_flattening": False,
    }
    for key, value in expected.items():
        assert MODEL_DEFAULTS[key] == value, key
    assert DEPRECATED_VALUE == -1


def test_every_fixture_config_loads_unchanged() -> None:
    configs = [
        {k: v for k, v in catalog_config(meta).items() if k != "q_model"}
        for meta in (load_case(n).meta for n in case_names())
        if "model_config" in meta
    ]
    assert configs, "no oracle cases with a model_config"
    for config in configs:
        assert set(config) == set(MODEL_DEFAULTS)
        assert merge_model_config(config) == config


def test_merge_deep_copies_defaults_and_overrides() -> None:
    hiddens = [8, 8]
    cfg = merge_model_config({"fcnet_hiddens": hiddens})
    cfg["fcnet_hiddens"].append(1)
    cfg["custom_model_config"]["x"] = 1
    assert hiddens == [8, 8]
    assert MODEL_DEFAULTS["custom_model_config"] == {}
    assert merge_model_config(None) == MODEL_DEFAULTS


def test_unknown_key_suggests_the_closest() -> None:
    with pytest.raises(ConfigError, match="did you mean 'fcnet_hiddens'") as info:
        merge_model_config({"fcnet_hidden": [16]})
    assert info.value.key == "fcnet_hidden" and isinstance(info.value, ValueError)
    with pytest.raises(ConfigError, match="see MODEL_DEFAULTS"):
        merge_model_config({"zzzz": 1})


def test_lstm_and_attention_together_is_an_error() -> None:
    with pytest.raises(ConfigError, match="only one of 'use_lstm' or 'use_attention'"):
        merge_model_config({"use_lstm": True, "use_attention": True})


@pytest.mark.parametrize("value", [True, False])
def test_lstm_use_prev_action_reward_maps_with_a_warning(value) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cfg = merge_model_config({"lstm_use_prev_action_reward": value})
    assert cfg["lstm_use_prev_action"] is value and cfg["lstm_use_prev_reward"] is value
    assert cfg["lstm_use_prev_action_reward"] == DEPRECATED_VALUE
    assert any(issubclass(w.category, DeprecationWarning) and "lstm_use_prev_action" in str(w.message) for w in caught)


def test_lstm_use_prev_action_reward_conflict() -> None:
    with pytest.raises(ConfigError, match="lstm_use_prev_reward"):
        merge_model_config({"lstm_use_prev_action_reward": True, "lstm_use_prev_reward": False})


def test_removed_keys_point_to_their_replacement() -> None:
    with pytest.raises(ConfigError, match="custom_model_config"):
        merge_model_config({"custom_options": {"a": 1}})
    with pytest.raises(ConfigError, match="_use_default_native_models.*removed|removed.*_use_default_native_models"):
        merge_model_config({"_use_default_native_models": True})
    assert merge_model_config({"_use_default_native_models": False})["_use_default_native_models"] is False
    with pytest.raises(ConfigError, match="custom preprocessors are not supported"):
        merge_model_config({"custom_preprocessor": "my_prep"})


@pytest.mark.parametrize(
    ("overrides", "key", "expected"),
    [
        ({"fcnet_hiddens": [64, 0]}, "fcnet_hiddens", "positive integers"),
        ({"fcnet_hiddens": 64}, "fcnet_hiddens", "positive integers"),
        ({"post_fcnet_hiddens": [True]}, "post_fcnet_hiddens", "positive integers"),
        ({"fcnet_activation": "gelu_fast"}, "fcnet_activation", "'tanh'"),
        ({"conv_activation": 3}, "conv_activation", "torch.nn"),
        ({"use_lstm": 1}, "use_lstm", "true or false"),
        ({"lstm_cell_size": 0}, "lstm_cell_size", "positive integer"),
        ({"attention_use_n_prev_actions": -1}, "attention_use_n_prev_actions", ">= 0"),
        ({"conv_filters": [[16, [4, 4], 2], [32, 4]]}, "conv_filters[1]", "out_channels"),
        ({"custom_model_config": None}, "custom_model_config", "object"),
        ({"fcnet_weights_initializer_config": []}, "fcnet_weights_initializer_config", "object"),
        ({"log_std_clip_param": "big"}, "log_std_clip_param", "number"),
        ({"dim": 84.0}, "dim", "positive integer"),
    ],
)
def test_type_errors_name_key_expected_and_received(overrides, key, expected) -> None:
    with pytest.raises(ConfigError) as info:
        merge_model_config(overrides)
    err = info.value
    assert err.key == key
    assert expected in err.expected
    assert f"model config '{key}'" in str(err) and "got " in str(err)


def test_valid_overrides_pass() -> None:
    cfg = merge_model_config({
        "fcnet_hiddens": [], "fcnet_activation": None, "conv_activation": "Swish",
        "post_fcnet_activation": "GELU", "conv_filters": [[16, [8, 8], 4], [32, 4, [2, 2]]],
        "custom_model": "pkg.mod.Model", "encoder_latent_dim": 8,
    })
    assert cfg["fcnet_hiddens"] == []


@pytest.mark.parametrize(
    ("name", "canonical"),
    [(None, None), ("linear", None), ("Linear", None), ("tanh", "tanh"), ("RELU", "relu"), ("swish", "silu"),
     ("silu", "silu"), ("elu", "elu"), ("Tanh", "tanh"), ("GELU", "GELU"), ("LeakyReLU", "LeakyReLU")],
)
def test_canonical_activation_follows_rllib_lookup(name, canonical) -> None:
    assert canonical_activation(name) == canonical


def test_prev_actions_with_tuple_action_space_need_flattening_disabled() -> None:
    space = gs.Tuple([gs.Discrete(2), gs.Discrete(3)])
    with pytest.raises(ConfigError, match="_disable_action_flattening"):
        merge_model_config({"use_attention": True, "attention_use_n_prev_actions": 2}, action_space=space)
    validate_model_config(merge_model_config({"lstm_use_prev_action": True}), action_space=gs.Discrete(2))
