"""An imported session record is refused for what it holds, not only for its form.

A record of the right length and layout may still carry a NaN state (every later step of
the session was a 500), a previous-action window no action writes, or an experience-log
open step with the wrong bytes (the log's writer then dropped a whole file of other
sessions' transitions). Each is a 422 naming the body before anything is stored; the
session the import would replace is left as it was. Also here: a step count past what a
record keeps refuses ``step`` checks, a kept action is answered as the policy spells it,
and an episode record's agent ids are held to the request's limit.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import msgpack
import numpy as np
import pytest
from conftest import error_of
from gymnasium import spaces as gs
from svc_session_steps import forge_answer, observations, step

from rlserve.service.sessions.import_check import _window_problem
from rlserve.service.sessions.record import HEADER_BYTES, MAX_STEPS, read_header

OCTET = {"content-type": "application/octet-stream"}
EXPORT = {"accept": "application/octet-stream"}


async def _exported(client, model: str, sid: str, steps: int = 2, **extra) -> bytes:
    obs = observations(5, steps)
    for t in range(steps):
        assert (await step(client, model, sid, obs[t], t, **extra)).status_code == 200
    return (await client.get(f"/v1/models/{model}/sessions/{sid}", headers=EXPORT)).content


def _parts(app, model: str, data: bytes) -> list[tuple[int, np.ndarray]]:
    """(offset, float32 view) of each tensor of the record, in the layout's order."""
    offset = HEADER_BYTES + int(read_header(data)["version_len"])
    out = []
    for part in app.state.registry.entry(model).policy().sessions.layout.parts:
        out.append((offset, np.frombuffer(data, part.dtype, count=int(np.prod(part.shape)), offset=offset)))
        offset += part.nbytes
    return out


def _with(data: bytes, offset: int, values: np.ndarray) -> bytes:
    raw = values.astype(np.float32).tobytes()
    return data[:offset] + raw + data[offset + len(raw):]


async def _refused(client, model: str, sid: str, data: bytes, says: str) -> None:
    before = (await client.get(f"/v1/models/{model}/sessions/{sid}", headers=EXPORT)).content
    r = await client.put(f"/v1/models/{model}/sessions/{sid}", content=data, headers=OCTET)
    assert r.status_code == 422 and error_of(r)["field"] == "body" and says in error_of(r)["message"], r.text
    after = (await client.get(f"/v1/models/{model}/sessions/{sid}", headers=EXPORT)).content
    assert after[:24] + after[32:] == before[:24] + before[32:]  # nothing was stored (24-32: the export's time)


@pytest.mark.asyncio
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("part", [0, 2, 3], ids=["lstm-state", "prev-action", "prev-reward"])
async def test_a_record_holding_nan_or_inf_is_refused(make_client, bad, part):
    """The lstm bundle's record: its h and c states, its previous (Box) action, its previous
    reward. Before, a NaN state was stored and every later step of it answered 500."""
    app, client = make_client(("lstm",))
    data = await _exported(client, "lstm", "s")
    offset, values = _parts(app, "lstm", data)[part]
    forged = values.copy()
    forged[0] = bad
    await _refused(client, "lstm", "s", _with(data, offset, forged), "NaN or infinite")
    obs = observations(6, 1)[0]
    assert (await client.post("/v1/models/lstm/act", json={"observation": obs, "session_id": "s",
                                                          "reward": 1.0})).status_code == 200


@pytest.mark.asyncio
@pytest.mark.parametrize("value", [-1.0, 2.5, 3.0, 1e9])
async def test_a_discrete_previous_action_window_holds_only_actions(make_client, value):
    """gtrxl reads its two previous Discrete(3) actions as a (2, 1) window of indices: one
    that is no index of the space is refused; the real window imports."""
    app, client = make_client(("gtrxl",))
    data = await _exported(client, "gtrxl", "g", steps=3)
    offset, window = _parts(app, "gtrxl", data)[-2]
    assert window.size == 2 and set(window.tolist()) <= {0.0, 1.0, 2.0}
    await _refused(client, "gtrxl", "g", _with(data, offset, np.array([value, window[1]])), "Discrete(3)")
    assert (await client.put("/v1/models/gtrxl/sessions/g2", content=data, headers=OCTET)).status_code == 200


def test_a_one_hot_window_holds_one_hot_rows_or_zeros():
    """A new-stack module reading one-hot previous actions (``Pipeline.one_hot_actions``)."""
    pipeline = SimpleNamespace(one_hot_actions=True, action_space=gs.Discrete(3))
    assert _window_problem(np.array([[0, 1, 0], [0, 0, 0]], np.float32), pipeline) is None
    for bad in ([[1, 1, 0]], [[0.5, 0, 0]], [[0, 2, 0]], [[-1, 0, 0]]):
        assert "one-hot" in _window_problem(np.array(bad, np.float32), pipeline), bad


def test_flat_windows_of_multi_discrete_and_box_leaves():
    pipeline = SimpleNamespace(action_space=gs.Tuple((gs.MultiDiscrete([2, 3]), gs.Box(-1, 1, (1,)))))
    assert _window_problem(np.array([[1, 2, 7.5], [0, 0, -9.0]], np.float32), pipeline) is None  # Box: raw
    assert "MultiDiscrete" in _window_problem(np.array([[2, 0, 0.0]], np.float32), pipeline)
    assert "MultiDiscrete" in _window_problem(np.array([[0, 1.5, 0.0]], np.float32), pipeline)
    # The window holds model-space indices (from 0), whatever the space's start.
    shifted = SimpleNamespace(action_space=gs.Discrete(3, start=5))
    assert _window_problem(np.array([[0], [2]], np.float32), shifted) is None
    assert "Discrete(3, start=5)" in _window_problem(np.array([[5]], np.float32), shifted)


def _trail_of(data: bytes) -> tuple[bytes, list]:
    length = int.from_bytes(data[76:80], "little")
    return data[:len(data) - length], msgpack.unpackb(data[len(data) - length:])


def _with_trail(head: bytes, trail: list) -> bytes:
    packed = msgpack.packb(trail)
    return head[:76] + len(packed).to_bytes(4, "little") + head[80:] + packed


@pytest.mark.asyncio
@pytest.mark.parametrize("field,value,says", [
    (3, b"\x00" * 5, "observation"),  # a packed Box(4) observation is 16 bytes
    (4, "not-an-action", "action"),
    (5, b"\x00" * 3, "environment action"),
    (1, -1, "step index"),
], ids=["obs-bytes", "action-string", "env-action-bytes", "negative-t"])
async def test_an_open_step_the_model_could_not_have_logged_is_refused(make_client, tmp_path, field, value, says):
    """With the experience log on, an exported record carries the open step (the trail).
    One whose packed values do not fit the spaces is refused; the same record untouched
    imports, and a step of it closes a transition the log writes."""
    app, client = make_client(("lstm",), experience_log=tmp_path / "log")
    data = await _exported(client, "lstm", "t")
    head, trail = _trail_of(data)
    assert isinstance(trail, list) and isinstance(trail[3], bytes) and len(trail[3]) == 16
    forged = list(trail)
    forged[field] = value
    await _refused(client, "lstm", "t", _with_trail(head, forged), says)
    assert (await client.put("/v1/models/lstm/sessions/t2", content=data, headers=OCTET)).status_code == 200
    assert (await step(client, "lstm", "t2", observations(7, 1)[0], 1)).status_code == 200


@pytest.mark.asyncio
async def test_a_step_count_past_what_a_record_keeps_refuses_step_checks(make_client):
    """A record counts at most 2**32 - 1 steps; a session at that count (imported, or read
    back from a store) cannot tell a retry from a new step, so ``step`` is refused (409)
    where it could have been applied twice; steps without ``step`` go on."""
    _, client = make_client(("lstm",))
    data = await _exported(client, "lstm", "c")
    counted = data[:12] + MAX_STEPS.to_bytes(4, "little") + data[16:]
    assert (await client.put("/v1/models/lstm/sessions/c", content=counted, headers=OCTET)).status_code == 200
    obs = observations(8, 2)
    for want in (MAX_STEPS - 1, MAX_STEPS):
        r = await step(client, "lstm", "c", obs[0], 1, step=want)
        assert r.status_code == 409 and error_of(r)["field"] == "step" and "new episode" in error_of(r)["message"]
    assert (await step(client, "lstm", "c", obs[1], 1)).status_code == 200


@pytest.mark.asyncio
async def test_a_kept_action_is_answered_as_the_policy_spells_it(make_client):
    """A kept Discrete action imported as ``1.0`` reads as action 1, and a retry answers
    ``1`` (an integer), as the step itself did, not the record's spelling."""
    _, client = make_client(("gtrxl",))
    obs = observations(9, 1)[0]
    assert (await step(client, "gtrxl", "k", obs, 0, step=0)).status_code == 200
    exported = (await client.get("/v1/models/gtrxl/sessions/k", headers=EXPORT)).content
    forged = forge_answer(exported, [0, 1.0, -1.1, None, None, None])
    assert (await client.put("/v1/models/gtrxl/sessions/k2", content=forged, headers=OCTET)).status_code == 200
    retry = await step(client, "gtrxl", "k2", obs, 1, step=0, outputs=["raw_action"])
    assert retry.status_code == 200, retry.text
    assert type(retry.json()["action"]) is int and retry.json()["action"] == 1 and retry.json()["raw_action"] == 1
