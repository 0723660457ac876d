"""The shadow's columns of a log, as the evaluation reads them.

A shadow (a candidate run on live traffic, off the answer's path) writes
``<log>/<model>/shadow/*.parquet``: per logged step ``event_id`` (the step's
``infos.event_id``), ``candidate`` (``"<model>@<version>"``), ``logp`` (the candidate's logp
of the action actually taken), ``actions``, ``dist_inputs`` and ``time``.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow.compute as pc

from rlserve.service.experience.reader import read_form

FORM = "shadow"


def shadow_logps(root: Path, model: str, candidate: str) -> dict[str, float]:
    """``event_id -> logp`` of ``candidate``'s shadow rows for ``model`` (empty: none).
    An event written twice (a replica that wrote it again) keeps its first row."""
    table = read_form(root, model, FORM)
    if table is None or not len(table):
        return {}
    table = table.filter(pc.equal(table.column("candidate"), candidate)).select(["event_id", "logp"])
    found: dict[str, float] = {}
    for event_id, logp in zip(table.column("event_id").to_pylist(), table.column("logp").to_pylist(), strict=True):
        found.setdefault(event_id, float("nan") if logp is None else float(logp))
    return found


def shadow_candidates(root: Path, model: str) -> list[str]:
    """The candidates that shadowed ``model`` in this log."""
    table = read_form(root, model, FORM)
    return [] if table is None else sorted(set(table.column("candidate").to_pylist()))
