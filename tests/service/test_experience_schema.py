"""Both forms of the experience log against what RLlib 2.60's offline reader expects.

The expectations are recorded from RLlib itself (scripts/record_rllib_offline_schema.py,
run with RLlib installed) in tests/fixtures/rllib_offline/schema.json: the columns RLlib's
own recorder writes for CartPole and their Arrow types, the reader's schema (columns it
reads as such; every other column becomes an extra model output, batched as a tensor),
and the fields of ``SingleAgentEpisode.get_state()``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import msgpack
import numpy as np
import pyarrow as pa
import pytest
from gymnasium import spaces as gs

from rlserve.service.experience import episode_state, tables
from rlserve.service.experience.records import TERMINATED, ModelLog, Transition
from rlserve.service.experience.trail import Trail

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "rllib_offline" / "schema.json"
RLLIB = json.loads(FIXTURE.read_text())
CARTPOLE = ModelLog("cartpole", gs.Box(-np.inf, np.inf, (4,), np.float32), gs.Discrete(2), Path("unused"))


def _segment(length: int = 3, end: int = TERMINATED) -> list[Transition]:
    rng = np.random.default_rng(0)
    obs = [row.tobytes() for row in rng.normal(size=(length + 1, 4)).astype(np.float32)]  # packed
    out = []
    for t in range(length):
        step = Trail("s:1", t, f"e{t}", obs[t], t % 2, None, -0.5, None, True, "1", 1.0 + t)
        out.append(Transition(step, obs[t + 1], 1.0, end if t == length - 1 else 0))
    return out


def test_the_fixture_was_recorded_from_rllib_2_60() -> None:
    assert RLLIB["ray_version"] == "2.60.0"
    assert RLLIB["episode_state"]["item_column"] == "item"


def _tensor(arrow_type: str) -> tuple[tuple[int, ...], str] | None:
    """(shape, value type) of Ray's tensor type as the fixture spells it."""
    match = re.fullmatch(r"ArrowTensorTypeV2\(shape=\((.*?)\), dtype=(\w+)\)", arrow_type)
    if match is None:
        return None
    return tuple(int(x) for x in match[1].split(",") if x.strip()), match[2]


def _shape_of(kind: pa.DataType) -> tuple[tuple[int, ...], str]:
    shape = []
    while pa.types.is_fixed_size_list(kind):
        shape.append(kind.list_size)
        kind = kind.value_type
    return tuple(shape), str(kind)


def test_the_columns_form_has_rllibs_columns_and_types() -> None:
    schema = tables.columns_table(CARTPOLE, _segment()).schema
    ours = {field.name: field.type for field in schema}
    for name, rllib_type in RLLIB["written_columns"].items():
        assert name in ours, f"RLlib's recordings have a column {name!r}"
        tensor = _tensor(rllib_type)
        if tensor is not None:  # RLlib's arrays: Ray's tensor type; here nested fixed-size lists
            assert _shape_of(ours[name]) == tensor, name
        elif rllib_type == "null":  # RLlib writes None agent/module ids; a nullable string holds them
            assert ours[name] == pa.string(), name
        else:
            assert str(ours[name]) == rllib_type, name


def test_every_extra_column_is_one_a_learner_can_batch() -> None:
    """RLlib's reader makes each column outside its schema an extra model output of the
    step, which learner connectors stack into tensors: numbers or booleans only."""
    schema = tables.columns_table(CARTPOLE, _segment()).schema
    read_as_such = set(RLLIB["prelearner_schema"].values())
    extra = [f for f in schema if f.name not in read_as_such]
    assert {f.name for f in extra} == {"action_logp", "actions_for_env", "explore"}
    for field in extra:
        assert pa.types.is_floating(field.type) or pa.types.is_integer(field.type) \
            or pa.types.is_boolean(field.type), field
    # RLlib's own names for what these are
    assert RLLIB["columns"]["ACTION_LOGP"] == "action_logp"
    assert RLLIB["columns"]["ACTIONS_FOR_ENV"] == "actions_for_env"
    assert schema.field("infos").type == tables.INFOS  # read as the step's info, never batched


def _strict(value: dict) -> object:
    """msgpack_numpy's decoding, refusing what it would unpickle (kind ``O``)."""
    if b"nd" not in value:
        return value
    assert value[b"kind"] == b"", "an array msgpack_numpy would unpickle"
    return np.frombuffer(value[b"data"], np.dtype(value[b"type"])).reshape(value[b"shape"])


def test_the_episodes_form_holds_get_state_as_rllibs_reader_decodes_it() -> None:
    segment = _segment(5)
    table = tables.episodes_table(CARTPOLE, [segment])
    assert RLLIB["episode_state"]["item_column"] in table.column_names
    item = table.column("item")[0].as_py()
    state = msgpack.unpackb(item, object_hook=_strict)  # RLlib: object_hook=msgpack_numpy.decode
    assert sorted(state) == RLLIB["episode_state"]["keys"]
    for name in RLLIB["episode_state"]["buffers"]:
        assert sorted(state[name]) == RLLIB["episode_state"]["buffer_keys"], name
    for output in state["extra_model_outputs"].values():
        assert sorted(output) == RLLIB["episode_state"]["buffer_keys"]
    # What SingleAgentEpisode.validate() checks after from_state.
    observations, actions = state["observations"]["data"], state["actions"]["data"]
    assert len(observations) == len(state["infos"]["data"]) == len(actions) + 1 == len(segment) + 1
    assert len(state["rewards"]["data"]) == len(actions)
    assert state["observations"]["data"].dtype == np.float32 and observations.shape == (6, 4)
    assert state["actions"]["data"].dtype == np.int64
    assert (state["t_started"], state["t"], state["is_terminated"]) == (0, 5, True)
    assert state["_observation_space"] is None and state["_action_space"] is None  # nothing to unpickle


def test_an_array_of_python_objects_is_never_written() -> None:
    with pytest.raises(TypeError, match="pickle"):
        episode_state._encode_array(np.array([{"a": 1}], dtype=object))


def test_an_item_is_the_bytes_msgpack_writes_for_the_same_state() -> None:
    """Items are encoded with msgspec (faster), byte for byte as msgpack with msgpack_numpy's
    arrays writes them: a Box and Discrete segment, and a Dict action (JSON values) with a
    numpy float64 (its times) and str_ (its version) where msgpack writes the plain value."""
    dict_space = gs.Dict({"a": gs.Discrete(3), "b": gs.Box(-1, 1, (2,), np.float32)})
    composite = ModelLog("dicts", CARTPOLE.obs_space, dict_space, Path("unused"))
    segment = _segment(4)
    composite_segment = [Transition(Trail(r.step.eps_id, r.step.t, r.step.event_id, r.step.obs,
                                          {"a": r.step.t, "b": [0.5, -0.25]}, None, np.float64(-0.5), 0.25, True,
                                          np.str_("1"), np.float64(2.0 + r.step.t)), r.next_obs, 1.0, r.end)
                         for r in segment]
    for model, rows in ((CARTPOLE, segment), (composite, composite_segment)):
        [state] = episode_state.segment_states(model, [rows])
        expected = msgpack.packb(state, default=episode_state._encode_array)
        assert episode_state.encode_segments(model, [rows]) == [expected]
        # A write encodes all its segments at once, each from its slices of shared arrays:
        # the same bytes as each segment alone.
        halves = [rows[:2], rows[2:]]
        assert episode_state.encode_segments(model, halves) == [episode_state.encode_segments(model, [half])[0]
                                                                 for half in halves]
