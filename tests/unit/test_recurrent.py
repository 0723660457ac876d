"""Unit tests of the LSTM and GTrXL wrappers: batching, resets, prev actions, traceability."""

from __future__ import annotations

import warnings

import gymnasium.spaces as gs
import numpy as np
import pytest
import torch

from rlserve.models.config import MODEL_DEFAULTS
from rlserve.models.networks.attention_modules import (
    GRUGate,
    RelativePositionEmbedding,
    rel_shift,
    sinusoid_inverse_freq,
)
from rlserve.models.networks.fcnet import FullyConnectedNetwork
from rlserve.models.networks.gtrxl import AttentionWrapper, GTrXLCore
from rlserve.models.networks.lstm import LSTMWrapper
from rlserve.models.networks.wrapper_inputs import PrevActionEncoder

OBS = gs.Box(-1.0, 1.0, (5,), np.float32)

ACTION_SPACES = {
    "discrete": gs.Discrete(3),
    "multidiscrete": gs.MultiDiscrete([2, 4]),
    "box": gs.Box(-1.0, 1.0, (2,), np.float32),
    "tuple": gs.Tuple((gs.Discrete(2), gs.Box(-1.0, 1.0, (2,), np.float32))),
}


def _config(**overrides) -> dict:
    cfg = dict(MODEL_DEFAULTS)
    cfg.update(fcnet_hiddens=[16, 16], lstm_cell_size=8, attention_dim=16, attention_head_dim=8)
    cfg.update(attention_memory_inference=4, attention_position_wise_mlp_dim=8)
    cfg.update(overrides)
    return cfg


def _perturb(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    # Fresh heads are near zero (and gate biases identical); perturbing makes every
    # parameter matter, so a test cannot pass by accident.
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.3)
    return model.eval()


def _lstm(action_space: gs.Space, **overrides) -> LSTMWrapper:
    torch.manual_seed(0)
    cfg = _config(use_lstm=True, **overrides)
    base = FullyConnectedNetwork(OBS, None, cfg)
    return _perturb(LSTMWrapper(base, OBS, action_space, 4, cfg))


def _attention(action_space: gs.Space, **overrides) -> AttentionWrapper:
    torch.manual_seed(0)
    cfg = _config(use_attention=True, **overrides)
    base = FullyConnectedNetwork(OBS, None, cfg)
    return _perturb(AttentionWrapper(base, OBS, action_space, 4, cfg))


def _sample_actions(space: gs.Space, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """Flattened raw actions (..., A) as the server feeds them."""
    rng = np.random.default_rng(seed)
    cols = []
    leaves = space.spaces if isinstance(space, gs.Tuple) else (space,)
    for leaf in leaves:
        if isinstance(leaf, gs.Discrete):
            cols.append(rng.integers(0, leaf.n, shape + (1,)))
        elif isinstance(leaf, gs.MultiDiscrete):
            cols.append(np.stack([rng.integers(0, n, shape) for n in leaf.nvec], axis=-1))
        else:
            cols.append(rng.uniform(-1, 1, shape + (int(np.prod(leaf.shape)),)))
    return torch.tensor(np.concatenate(cols, axis=-1), dtype=torch.float32)


def _inputs(model, space: gs.Space, batch: int, seed: int, state=None) -> list[torch.Tensor]:
    """Random positional inputs in ``signature().input_names`` order."""
    sig = model.signature()
    gen = torch.Generator().manual_seed(seed)
    inputs = [torch.rand(batch, *sig.obs_shape, generator=gen) * 2 - 1]
    if state is None:
        state = [torch.randn(batch, *s.shape, generator=gen) for s in sig.state]
    inputs += list(state)
    window = (sig.prev.n_prev_actions,) if sig.prev.windowed else ()
    if sig.uses_prev_actions:
        inputs.append(_sample_actions(space, (batch, *window), seed))
    if sig.uses_prev_rewards:
        shape = (batch, sig.prev.n_prev_rewards) if sig.prev.windowed else (batch,)
        inputs.append(torch.randn(*shape, generator=gen))
    return inputs


MODEL_CASES = {
    "lstm_plain": lambda: (_lstm, "discrete", {}),
    "lstm_prev_a_r_discrete": lambda: (
        _lstm,
        "discrete",
        dict(lstm_use_prev_action=True, lstm_use_prev_reward=True),
    ),
    "lstm_prev_a_multidiscrete": lambda: (_lstm, "multidiscrete", dict(lstm_use_prev_action=True)),
    "lstm_prev_a_box": lambda: (_lstm, "box", dict(lstm_use_prev_action=True)),
    "lstm_prev_r": lambda: (_lstm, "discrete", dict(lstm_use_prev_reward=True)),
    "attention_plain": lambda: (_attention, "discrete", {}),
    "attention_2units_prev_discrete": lambda: (
        _attention,
        "discrete",
        dict(
            attention_num_transformer_units=2,
            attention_num_heads=2,
            attention_use_n_prev_actions=2,
            attention_use_n_prev_rewards=3,
        ),
    ),
    "attention_prev_multidiscrete": lambda: (
        _attention,
        "multidiscrete",
        dict(attention_use_n_prev_actions=3),
    ),
    "attention_prev_tuple": lambda: (
        _attention,
        "tuple",
        dict(attention_use_n_prev_actions=2, attention_use_n_prev_rewards=1),
    ),
}


@pytest.fixture(params=sorted(MODEL_CASES))
def built(request):
    factory, space_name, overrides = MODEL_CASES[request.param]()
    space = ACTION_SPACES[space_name]
    return factory(space, **overrides), space


def test_forward_matches_signature(built):
    model, space = built
    sig = model.signature()
    inputs = _inputs(model, space, 3, seed=1)
    assert len(inputs) == len(sig.input_names)
    with torch.no_grad():
        outputs = model(*inputs)
    assert len(outputs) == len(sig.output_names)
    assert outputs[0].shape == (3, sig.num_outputs)
    assert outputs[1].shape == (3,)
    for spec, out in zip(sig.state, outputs[2:], strict=True):
        assert out.shape == (3, *spec.shape)
        assert out.dtype == torch.float32
    assert all(torch.isfinite(o).all() for o in outputs)


def test_wrong_number_of_inputs_is_rejected(built):
    model, space = built
    inputs = _inputs(model, space, 2, seed=1)
    with pytest.raises(ValueError, match="expected"):
        model(*inputs, inputs[0])


def test_batch_equals_single_rows(built):
    model, space = built
    inputs = _inputs(model, space, 4, seed=2)
    with torch.no_grad():
        batched = model(*inputs)
        for row in range(4):
            single = model(*[x[row : row + 1] for x in inputs])
            for got, want in zip(single, batched, strict=True):
                torch.testing.assert_close(got[0], want[row], rtol=1e-5, atol=1e-6)


def test_state_carries_information(built):
    """The state input matters: the same step with another state gives other outputs."""
    model, space = built
    first = _inputs(model, space, 2, seed=3)
    sig = model.signature()
    other = list(first)
    n_state = len(sig.state)
    # Random, not constant: LayerNorm makes GTrXL blind to a constant shift of a memory row.
    other[1 : 1 + n_state] = [s + torch.randn(s.shape) for s in first[1 : 1 + n_state]]
    with torch.no_grad():
        a, b = model(*first), model(*other)
    assert not torch.allclose(a[0], b[0])


def _rollout(model, steps: list[list[torch.Tensor]], state: list[torch.Tensor]):
    """Feed per-step (obs, *prev) with the carried state; return per-step outputs."""
    n_state = len(state)
    outs = []
    for step in steps:
        obs, prev = step[0], step[1 + n_state :]
        with torch.no_grad():
            out = model(obs, *state, *prev)
        outs.append(out)
        state = list(out[2:])
    return outs


def test_episode_start_reset_gives_a_fresh_episode(built):
    """Rows reset to initial_state continue exactly like a brand-new episode."""
    model, space = built
    sig = model.signature()
    assert all(s.initial_value == 0.0 for s in sig.state)
    steps = [_inputs(model, space, 3, seed=10 + t) for t in range(3)]
    carried = _rollout(model, steps, model.initial_state(3))[-1][2:]
    # Row 1 starts a new episode: its state is replaced by the initial rows.
    initial = model.initial_state(3)
    reset = [
        torch.where(torch.arange(3).reshape(3, *[1] * (s.dim() - 1)) == 1, i, s)
        for s, i in zip(carried, initial, strict=True)
    ]
    fresh_steps = [_inputs(model, space, 3, seed=20 + t) for t in range(2)]
    resumed = _rollout(model, fresh_steps, reset)
    alone = _rollout(
        model, [[x[1:2] for x in step] for step in fresh_steps], model.initial_state(1)
    )
    for got, want in zip(resumed, alone, strict=True):
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g[1:2], w, rtol=1e-5, atol=1e-6)
    # ...and rows that were not reset really do differ from a fresh start.
    other_alone = _rollout(
        model, [[x[0:1] for x in step] for step in fresh_steps], model.initial_state(1)
    )
    assert not torch.allclose(resumed[0][0][0:1], other_alone[0][0])


def test_attention_returns_rolled_memory():
    space = ACTION_SPACES["discrete"]
    model = _attention(space, attention_num_transformer_units=2)
    inputs = _inputs(model, space, 2, seed=4)
    with torch.no_grad():
        _, _, *memory_out = model(*inputs)
    for mem_in, mem_out in zip(inputs[1:3], memory_out, strict=True):
        torch.testing.assert_close(mem_out[:, :-1], mem_in[:, 1:])
        assert not torch.allclose(mem_out[:, -1], mem_in[:, -1])


def test_attention_memory_out_is_the_unit_input():
    """Unit 0's new memory row is gtrxl.linear_layer's output (RLlib's state_out/0)."""
    space = ACTION_SPACES["discrete"]
    model = _attention(space)
    inputs = _inputs(model, space, 2, seed=5)
    with torch.no_grad():
        _, _, memory_out = model(*inputs)
        expected = model.gtrxl.linear_layer(model.base.forward_out(inputs[0]))
    torch.testing.assert_close(memory_out[:, -1], expected)


def test_trace_matches_eager(built):
    model, space = built
    example = _inputs(model, space, 2, seed=6)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # trace is deprecated in torch 2.13; failures still raise
        traced = torch.jit.trace(model, tuple(example), check_trace=False)
    other = _inputs(model, space, 5, seed=7)  # another batch size and other values
    with torch.no_grad():
        for got, want in zip(traced(*other), model(*other), strict=True):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


# --- previous actions ------------------------------------------------------------------


def test_prev_action_encoder_discrete_is_one_hot():
    enc = PrevActionEncoder(gs.Discrete(4))
    assert (enc.in_width, enc.out_width) == (1, 4)
    actions = torch.tensor([[0.0], [3.0], [1.0]])
    expected = torch.nn.functional.one_hot(actions[:, 0].long(), 4).float()
    torch.testing.assert_close(enc(actions), expected)


def test_prev_action_encoder_windowed_and_out_of_range():
    enc = PrevActionEncoder(gs.Discrete(3))
    actions = torch.tensor([[[2.0], [0.0]], [[7.0], [-1.0]]])  # (B=2, n=2, A=1)
    out = enc(actions)
    assert out.shape == (2, 2, 3)
    torch.testing.assert_close(out[0], torch.tensor([[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]]))
    torch.testing.assert_close(out[1], torch.zeros(2, 3))  # no class: an all-zero row


def test_prev_action_encoder_multidiscrete_and_tuple():
    md = PrevActionEncoder(gs.MultiDiscrete([2, 3]))
    assert (md.in_width, md.out_width) == (2, 5)
    torch.testing.assert_close(
        md(torch.tensor([[1.0, 2.0]])), torch.tensor([[0.0, 1.0, 0.0, 0.0, 1.0]])
    )
    mixed = PrevActionEncoder(gs.Dict({"b": gs.Box(-1, 1, (2,)), "a": gs.Discrete(2)}))
    # Dict leaves in sorted key order: "a" (1 column) then "b" (2 columns).
    assert (mixed.in_width, mixed.out_width) == (3, 4)
    torch.testing.assert_close(
        mixed(torch.tensor([[1.0, 0.5, -0.25]])), torch.tensor([[0.0, 1.0, 0.5, -0.25]])
    )


def test_prev_action_encoder_box_is_raw():
    enc = PrevActionEncoder(gs.Box(-1, 1, (2, 3)))
    assert (enc.in_width, enc.out_width) == (6, 6)
    x = torch.randn(4, 6)
    torch.testing.assert_close(enc(x), x)


@pytest.mark.parametrize("space_name,columns,width", [("discrete", 1, 3), ("multidiscrete", 2, 6)])
def test_lstm_one_hot_prev_action_changes_output(space_name, columns, width):
    """RLlib crashes here (SKIPPED.md); ours one-hot encodes the discrete prev action."""
    space = ACTION_SPACES[space_name]
    model = _lstm(space, lstm_use_prev_action=True)
    assert model.lstm.input_size == 16 + width
    assert model.signature().prev.action_width == columns
    inputs = _inputs(model, space, 1, seed=8)
    changed = list(inputs)
    changed[3] = (inputs[3] + 1) % 2  # another valid index in every column
    with torch.no_grad():
        a, b = model(*inputs), model(*changed)
    assert not torch.allclose(a[0], b[0])
    assert not torch.allclose(a[2], b[2])


def test_attention_linear_layer_input_width():
    model = _attention(
        ACTION_SPACES["multidiscrete"],
        attention_use_n_prev_actions=3,
        attention_use_n_prev_rewards=2,
    )
    assert model.gtrxl.linear_layer._model[0].in_features == 16 + 3 * 6 + 2
    assert model.signature().prev.action_width == 2


# --- LSTM whole-sequence mode ----------------------------------------------------------


def test_lstm_sequence_mode_equals_steps():
    space = ACTION_SPACES["box"]
    model = _lstm(space, lstm_use_prev_action=True, lstm_use_prev_reward=True)
    batch, steps = 3, 5
    per_step = [_inputs(model, space, batch, seed=30 + t) for t in range(steps)]
    outs = _rollout(model, per_step, model.initial_state(batch))
    stack = lambda i: torch.stack([s[i] for s in per_step], dim=1)  # noqa: E731
    with torch.no_grad():
        logits, value, h, c = model.forward_sequence(
            stack(0), *model.initial_state(batch), stack(3), stack(4)
        )
    torch.testing.assert_close(logits, torch.stack([o[0] for o in outs], 1), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(value, torch.stack([o[1] for o in outs], 1), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(h, outs[-1][2], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(c, outs[-1][3], rtol=1e-5, atol=1e-6)


# --- GTrXL blocks ----------------------------------------------------------------------


def test_inverse_freq_formula_and_buffer():
    emb = RelativePositionEmbedding(8)
    expected = 1.0 / 10000.0 ** (np.arange(0, 8, 2) / 8)
    np.testing.assert_allclose(emb.inverse_freq.numpy(), expected, rtol=1e-6)
    torch.testing.assert_close(sinusoid_inverse_freq(8), emb.inverse_freq)
    assert "inverse_freq" in emb.state_dict()
    table = emb(3)  # positions 2, 1, 0; [sin | cos] concatenated
    torch.testing.assert_close(table[-1], torch.tensor([0.0] * 4 + [1.0] * 4))
    torch.testing.assert_close(table[0, :4], torch.sin(2.0 * emb.inverse_freq))


def test_rel_shift_aligns_relative_distance():
    """After the shift, query i / key j reads the score for distance Tau+i-j."""
    t, tau = 3, 4
    x = torch.randn(2, t, tau + t, 1)
    shifted = rel_shift(x)
    for i in range(t):
        for j in range(tau + i + 1):  # keys the causal mask keeps
            # Row p of the position table encodes distance Tau+T-1-p.
            torch.testing.assert_close(shifted[:, i, j], x[:, i, j + t - 1 - i])


def test_rel_shift_is_identity_for_one_step():
    x = torch.randn(2, 1, 6, 3)
    torch.testing.assert_close(rel_shift(x), x)


def test_gtrxl_core_segment_equals_steps_with_growing_memory():
    """A T-step segment (mask + rel_shift for T > 1) equals T single steps whose memory
    holds the original memory plus every earlier step's unit input."""
    torch.manual_seed(1)
    core = _perturb(GTrXLCore(5, 8, 2, 2, 4, 6, 2.0))
    tau, t = 3, 4
    x = torch.randn(2, t, 5)
    memories = [torch.randn(2, tau, 8) for _ in range(2)]
    with torch.no_grad():
        segment, segment_inputs = core(x, memories)
        grown = list(memories)
        for i in range(t):
            out, unit_inputs = core(x[:, i : i + 1], grown)
            torch.testing.assert_close(out[:, 0], segment[:, i], rtol=1e-5, atol=1e-6)
            for k in range(2):
                torch.testing.assert_close(
                    unit_inputs[k][:, 0], segment_inputs[k][:, i], rtol=1e-5, atol=1e-6
                )
            grown = [torch.cat([m, u], dim=1) for m, u in zip(grown, unit_inputs, strict=True)]


def test_gtrxl_core_is_causal():
    torch.manual_seed(1)
    core = _perturb(GTrXLCore(5, 8, 1, 2, 4, 6, 2.0))
    x = torch.randn(2, 4, 5)
    memories = [torch.randn(2, 3, 8)]
    later = x.clone()
    later[:, -1] += 5.0  # the future must not leak into earlier outputs
    with torch.no_grad():
        out, _ = core(x, memories)
        out_changed, _ = core(later, memories)
    torch.testing.assert_close(out[:, :-1], out_changed[:, :-1])
    assert not torch.allclose(out[:, -1], out_changed[:, -1])


def test_gru_gate_starts_near_identity():
    """With the subtracted bias b_z = 2 and zero weights, z = sigmoid(-2): mostly the skip input."""
    gate = GRUGate(4, init_bias=2.0)
    with torch.no_grad():
        for name in ("_w_r", "_w_z", "_w_h", "_u_r", "_u_z", "_u_h"):
            getattr(gate, name).zero_()
    h = torch.randn(3, 4)
    z = torch.sigmoid(torch.tensor(-2.0))
    torch.testing.assert_close(gate(h, torch.randn(3, 4)), (1 - z) * h)


def test_invalid_config_names_the_field():
    with pytest.raises(ValueError, match="attention_memory_inference"):
        _attention(ACTION_SPACES["discrete"], attention_memory_inference=0)
    with pytest.raises(ValueError, match="lstm_cell_size"):
        _lstm(ACTION_SPACES["discrete"], lstm_cell_size=0)
