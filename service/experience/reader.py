"""Reading a log folder back: transitions, episodes joined from their segments, rewards,
shadow scores.

A log holds per model ``columns/`` (one row per transition), ``episodes/`` (one row per
episode segment), ``rewards/`` (delayed rewards) and ``shadow/`` (a shadow candidate's
scores of logged steps, by event id) written by any number of replicas.
A transition is identified by (``eps_id``, ``t``); an episode's segments by ``eps_id`` and
``t_started``. Readers here sort by those, so the files' order and which replica wrote
what never matter, and apply the delayed rewards (``rlserve.service.experience.rewards``).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack  # type: ignore[import-untyped]  # ships no type information
import numpy as np
import pyarrow as pa
import pyarrow.compute  # noqa: F401  (pa.compute)
import pyarrow.parquet as pq

FORMS = ("columns", "episodes", "rewards", "shadow")
SHADOW_COLUMNS = ("candidate", "logp", "actions", "dist_inputs", "time")


def models(root: Path) -> list[str]:
    """The model folders of a log (their names as written, see ``log.folder_name``)."""
    return sorted(p.name for p in Path(root).iterdir() if p.is_dir() and not p.name.startswith("."))


def read_form(root: Path, model: str, form: str) -> pa.Table | None:
    """Every file of one form of one model as one table (None: no file yet)."""
    files = sorted((Path(root) / model / form).glob("*.parquet"))
    if not files:
        return None
    return pa.concat_tables([pq.read_table(f) for f in files], promote_options="default")


def transitions(root: Path, model: str) -> pa.Table | None:
    """The model's transitions in (``eps_id``, ``t``) order, delayed rewards applied."""
    table = read_form(root, model, "columns")
    if table is None:
        return None
    table = table.sort_by([("eps_id", "ascending"), ("t", "ascending")])
    events = read_form(root, model, "rewards")
    if events is not None and len(events):
        event_ids = [info["event_id"] for info in table.column("infos").to_pylist()]
        rewards = apply_rewards(event_ids, table.column("rewards").to_numpy(), events)
        table = table.set_column(table.schema.get_field_index("rewards"), "rewards", pa.array(rewards, pa.float64()))
    return table


def shadow_scores(root: Path, model: str) -> pa.Table | None:
    """The shadow candidates' scores of ``model``'s logged steps (``shadow/``), one row per
    (step, candidate): ``event_id``, ``candidate``, ``logp``, ``actions``, ``dist_inputs``,
    ``time`` (docs/experience.md)."""
    return read_form(root, model, "shadow")


def transitions_with_shadow(root: Path, model: str, candidate: str | None = None) -> pa.Table | None:
    """``transitions`` with the shadow's columns joined by event id as ``shadow_candidate``,
    ``shadow_logp``, ``shadow_actions``, ``shadow_dist_inputs``, ``shadow_time``: null on
    steps the shadow did not score (dropped, skipped, or no shadow then). ``candidate``
    (``"<model>@<version>"``) picks one candidate's scores where several shadowed the model;
    else a step scored twice keeps its latest score."""
    table = transitions(root, model)
    if table is None:
        return None
    scores = shadow_scores(root, model)
    if scores is not None and candidate is not None:
        scores = scores.filter(pa.compute.equal(scores.column("candidate"), candidate))
    if scores is None or not len(scores):
        scores = None
    where: dict[str, int] = {}
    if scores is not None:
        for index, event_id in enumerate(scores.column("event_id").to_pylist()):
            where[event_id] = index  # the later file wins
    event_ids = [info["event_id"] for info in table.column("infos").to_pylist()]
    picks = [where.get(event_id) for event_id in event_ids]
    for name in SHADOW_COLUMNS:
        if scores is None:
            column = pa.nulls(len(table), pa.null())
        else:
            column = scores.column(name).take(pa.array(picks, pa.int64()))
        table = table.append_column(f"shadow_{name}", column)
    return table


def apply_rewards(event_ids: list[str], rewards: np.ndarray, events: pa.Table) -> np.ndarray:
    """``rewards`` (one per event id) with the delayed ones applied: in time order, a
    ``replace`` sets the reward, an ``add`` adds to it."""
    out = np.array(rewards, dtype=np.float64)
    where = {event_id: i for i, event_id in enumerate(event_ids)}
    for event in events.sort_by([("time", "ascending")]).to_pylist():
        index = where.get(event["event_id"])
        if index is None:
            continue
        out[index] = event["reward"] if event["mode"] == "replace" else out[index] + event["reward"]
    return out


def decode_item(item: bytes) -> dict[str, Any]:
    """An episodes-form ``item`` as its state, arrays as numpy; never unpickles (an
    array of Python objects is refused, not loaded)."""
    return msgpack.unpackb(item, object_hook=_decode_array, strict_map_key=False)


def _decode_array(value: dict[Any, Any]) -> Any:
    if b"nd" not in value:
        return value
    if value.get(b"kind", b"") not in (b"",):
        raise ValueError(f"an array of kind {value[b'kind']!r} would need pickle to read; refused")
    dtype = np.dtype(value[b"type"])
    if value[b"nd"] is True:
        return np.frombuffer(value[b"data"], dtype=dtype).reshape(value[b"shape"])
    return np.frombuffer(value[b"data"], dtype=dtype)[0]


@dataclass
class Episode:
    """An episode, or the part of it whose steps are all logged, joined from its segments
    (``t_started`` > 0: its start is not in the log)."""

    eps_id: str
    t_started: int
    observations: list[Any] = field(default_factory=list)  # T+1
    actions: list[Any] = field(default_factory=list)  # T
    rewards: list[float] = field(default_factory=list)
    action_logp: list[float] = field(default_factory=list)
    event_ids: list[str] = field(default_factory=list)  # T
    versions: list[str] = field(default_factory=list)  # T: the version that served each step
    explore: list[bool] = field(default_factory=list)  # T: false where the step was the mode (no behaviour logp)
    is_terminated: bool = False
    is_truncated: bool = False
    segments: int = 0
    agent_id: str | None = None  # a policy set's agent (None: a single agent)
    module_id: str | None = None  # the set's policy that acted for it

    def __len__(self) -> int:
        return len(self.actions)

    @property
    def done(self) -> bool:
        return self.is_terminated or self.is_truncated

    @property
    def whole(self) -> bool:
        """Every step from the first observation to the last is here."""
        return self.t_started == 0 and self.done

    @property
    def episode_return(self) -> float:
        return float(np.sum(self.rewards)) if self.rewards else 0.0


def episodes(root: Path, model: str) -> list[Episode]:
    """The model's episodes, each joined from its segments in ``t_started`` order; an
    episode with steps missing between segments (a replica that died before writing them)
    comes as one ``Episode`` per unbroken run of steps."""
    table = read_form(root, model, "episodes")
    if table is None:
        return []
    parts: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for item in table.column("item").to_pylist():
        state = decode_item(item)
        parts[state["id_"]].append(state)
    joined = [run for eps_id, states in parts.items()
              for run in _join(eps_id, sorted(states, key=lambda s: s["t_started"]))]
    events = read_form(root, model, "rewards")
    if events is not None and len(events):
        for episode in joined:
            episode.rewards = apply_rewards(episode.event_ids, np.asarray(episode.rewards), events).tolist()
    return sorted(joined, key=lambda e: (e.eps_id, e.t_started))


def _join(eps_id: str, states: list[dict[str, Any]]) -> list[Episode]:
    runs: list[Episode] = []
    t = -1
    for state in states:
        if state["t_started"] < t:  # steps already joined (written twice): keep the first copy
            continue
        if state["t_started"] != t:  # the first segment, or steps missing before this one
            runs.append(Episode(eps_id, t_started=state["t_started"], agent_id=state["agent_id"],
                                module_id=state["module_id"]))
        episode = runs[-1]
        if episode.observations:
            episode.observations.pop()  # this segment's first observation is the last one's final
        episode.observations.extend(list(state["observations"]["data"]))
        episode.actions.extend(list(state["actions"]["data"]))
        episode.rewards.extend(float(r) for r in state["rewards"]["data"])
        episode.action_logp.extend(float(x) for x in state["extra_model_outputs"]["action_logp"]["data"])
        episode.event_ids.extend(state["custom_data"]["event_ids"])
        episode.versions.extend(state["custom_data"]["versions"])
        episode.explore.extend(bool(x) for x in state["custom_data"]["explore"])
        episode.is_terminated, episode.is_truncated = state["is_terminated"], state["is_truncated"]
        episode.segments += 1
        t = state["t"]
    return runs
