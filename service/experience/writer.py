"""The experience writer: a bounded queue and one thread that turns transitions into files.

The request path only appends to the queue (``offer``, a lock and a deque append per
batch); when the queue holds ``queue_rows`` rows the batch's rows are dropped and counted,
so a slow or failing disk never slows or fails a request. The thread keeps per model

- the transitions not yet written (the columns form: one row per transition),
- each episode's open segment (the episodes form: one row per segment), and
- the delayed rewards reported for logged steps,
- a shadow candidate's scores of logged steps (``rlserve.service.shadow``),

and writes them (``rlserve.service.experience.files``, atomically) when ``flush_s`` passed
since the last write (what waits: transitions, ended segments, rewards, scores; an episode
still going on keeps its open segment), when ``roll_s`` passed since the oldest row waiting
arrived or the oldest open segment opened, when ``roll_bytes`` wait or open segments hold
that much, and on ``flush``/``close`` (drain and shutdown). A time or size roll and a flush
also cut the open segments: the rest of an episode is a later segment of it, with the same
``eps_id`` (``t_started`` says where it starts). A write that fails drops what it held,
counts the rows and logs why.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from rlserve.service.experience import files
from rlserve.service.experience.records import ModelLog, RewardEvent, ShadowScore, Transition, row_bytes

log = logging.getLogger("rlserve.experience")

POLL_S = 0.05  # how often the thread takes what was queued (the request path never wakes it)
# A write of more transitions than this (a roll of long episodes) goes out as files of about
# this many, the thread sleeping PACE times the CPU each took between them (at most
# MAX_PAUSE_S): built at once, a minute of rows took the core from requests for a third of a
# second (measured, docs/benchmarks-history.md). ``flush`` and ``close`` do not pause.
PART_ROWS = 16_384
PACE = 2.0
MAX_PAUSE_S = 0.5
WARN_EVERY_S = 10.0  # at most one warning about dropped rows this often


@dataclass
class _Flush:
    done: threading.Event = field(default_factory=threading.Event)


@dataclass
class _Buffer:
    """One model's rows waiting to be written."""

    rows: list[Transition] = field(default_factory=list)
    open: dict[str, list[Transition]] = field(default_factory=dict)
    finished: list[list[Transition]] = field(default_factory=list)
    rewards: list[RewardEvent] = field(default_factory=list)
    shadow: list[ShadowScore] = field(default_factory=list)
    nbytes: int = 0  # what ``rows`` cost (``row_bytes`` each): written at every write
    since: float | None = None  # monotonic time the oldest row, reward or score waiting arrived
    # The open segments outlive writes until their episode ends or a roll cuts them: how many
    # transitions they hold, and when each was opened (``open`` keeps the order they opened in).
    open_rows: int = 0
    opened: dict[str, float] = field(default_factory=dict)

    def extend(self, transitions: list[Transition], size: int, now: float) -> None:
        """Take a batch's transitions (``size``: what one costs, ``row_bytes``)."""
        self.rows.extend(transitions)
        self.nbytes += size * len(transitions)
        if self.since is None:
            self.since = now
        open_, finished, opened = self.open, self.finished, self.opened
        held = self.open_rows + len(transitions)
        for transition in transitions:
            step = transition.step
            eps_id = step.eps_id
            segment = open_.get(eps_id)
            if segment is not None and segment[-1].step.t != step.t - 1:
                # The episode went on elsewhere meanwhile (another replica): the part held
                # here is one segment, this step starts the next.
                finished.append(open_.pop(eps_id))
                held -= len(segment)
                segment = None
            if segment is None:
                open_[eps_id] = segment = [transition]
                opened[eps_id] = now
            else:
                segment.append(transition)
            if transition.end:
                finished.append(open_.pop(eps_id))
                del opened[eps_id]
                held -= len(segment)
        self.open_rows = held

    def oldest_open(self) -> float | None:
        """When the oldest open segment was opened (None: none is open)."""
        return self.opened[next(iter(self.open))] if self.open else None

    def empty(self) -> bool:
        return not (self.open or self.waiting())

    def waiting(self) -> bool:
        """Whether anything but open segments waits: what a write at ``flush_s`` takes. The
        transitions of episodes that never end (continuing tasks, clients that never send
        ``terminated``) go out then too, not only at a roll (a minute of rows at once, which
        stalled requests on a busy core: measured, docs/benchmarks-history.md)."""
        return bool(self.rows or self.finished or self.rewards or self.shadow)


class ExperienceWriter:
    """The log's one writer thread; ``offer`` and ``offer_rewards`` never block."""

    def __init__(self, root: Path, *, queue_rows: int = 65_536, roll_bytes: int = 64 << 20, roll_s: float = 60.0,
                 flush_s: float = 1.0, metrics: Any = None, source: str | None = None,
                 write: Callable[[Any, Path, Path], None] = files.write_table,
                 clock: Callable[[], float] = time.monotonic):
        self.root = Path(root)
        self.queue_rows = queue_rows
        self.roll_bytes = roll_bytes
        self.roll_s = roll_s
        self.flush_s = flush_s
        self.metrics = metrics
        self.source = source or f"{socket.gethostname()}-{os.getpid()}-{os.urandom(2).hex()}"
        self._write_table = write
        self._clock = clock
        self._queue: deque[Any] = deque()
        self._lock = threading.Lock()  # producers: the event loop and batcher threads
        self._count_lock = threading.Lock()
        self._offered = 0  # rows queued, counted by producers (under the lock)
        self._taken = 0  # rows taken, counted by the thread
        self._buffers: dict[ModelLog, _Buffer] = {}
        self._row_bytes: dict[ModelLog, int] = {}  # per model, ``row_bytes``
        self._last_write = clock()
        self._seq = 0
        self._closed = False
        self._stop = threading.Event()
        self._wake = threading.Event()  # flush and close only: producers never wake the thread
        self.dropped: dict[str, int] = {}
        self.written: dict[str, int] = {}
        self.unfinished = 0
        self._warned = -WARN_EVERY_S
        self._thread = threading.Thread(target=self._run, name="experience-writer", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ producers

    def offer(self, model: ModelLog, transitions: list[Transition]) -> bool:
        """Queue a batch's closed transitions; False (dropped, counted) when the queue is full."""
        return self._put(model, transitions, len(transitions))

    def offer_rewards(self, model: ModelLog, events: list[RewardEvent]) -> bool:
        return self._put(model, events, len(events))

    def offer_shadow(self, model: ModelLog, scores: list[ShadowScore]) -> bool:
        """Queue a shadow candidate's scores (the candidate's process, with a writer of its own); False when dropped."""
        return self._put(model, scores, len(scores))

    def note_unfinished(self, count: int) -> None:
        """Episodes restarted before their last step was closed: that step is not logged."""
        self.unfinished += count
        if self.metrics is not None:
            self.metrics.experience_unfinished(count)

    def _put(self, model: ModelLog, items: list[Any], count: int) -> bool:
        with self._lock:
            if not self._closed and self._offered - self._taken + count <= self.queue_rows:
                self._offered += count
                self._queue.append((model, items, count))
                return True
        self._drop("queue_full", count)
        return False

    def queued_rows(self) -> int:
        return self._offered - self._taken

    # ------------------------------------------------------------------ control

    def flush(self, timeout: float | None = 30.0) -> bool:
        """Write everything queued and waiting now (open segments cut); True when done in time."""
        marker = _Flush()
        self._queue.append(marker)
        self._wake.set()
        return marker.done.wait(timeout)

    def close(self, timeout: float | None = 30.0) -> None:
        """Refuse new rows, write what is left, stop the thread (drain and shutdown)."""
        with self._lock:
            self._closed = True
        self.flush(timeout)
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout)

    # ------------------------------------------------------------------ the thread

    def _run(self) -> None:
        while not self._stop.is_set():
            # Every POLL_S, whatever arrived meanwhile at once: a loop that took each batch
            # as it came would wake for every batch and contend with the event loop for
            # the interpreter lock (measured: 5x the writer's own work). ``flush`` wakes it.
            self._wake.wait(POLL_S)
            self._wake.clear()
            try:
                self._drain_queue()
                self._write_due(force=False)
            except Exception:  # the thread must outlive any bug: requests never depend on it
                log.exception("experience writer: unexpected error")

    def _drain_queue(self) -> None:
        """Take everything queued."""
        while self._queue:
            item = self._queue.popleft()
            if isinstance(item, _Flush):
                self._write_due(force=True)
                item.done.set()
                continue
            model, items, count = item
            self._taken += count
            buffer = self._buffers.setdefault(model, _Buffer())
            now = self._clock()
            if items and isinstance(items[0], RewardEvent | ShadowScore):
                (buffer.rewards if isinstance(items[0], RewardEvent) else buffer.shadow).extend(items)
                buffer.since = now if buffer.since is None else buffer.since
                continue
            size = self._row_bytes.get(model)
            if size is None:
                size = self._row_bytes[model] = row_bytes(model)
            buffer.extend(items, size, now)

    def _write_due(self, force: bool) -> None:
        now = self._clock()
        for model, buffer in list(self._buffers.items()):
            if buffer.empty():
                continue
            # A roll bounds both what waits for the next write and what open segments hold
            # across writes (else an episode that never ends, or one restarted without its
            # end, would be held for good).
            size = self._row_bytes.get(model, 0)
            oldest = buffer.oldest_open()
            rolled = force or max(buffer.nbytes, buffer.open_rows * size) >= self.roll_bytes or any(
                t is not None and now - t >= self.roll_s for t in (buffer.since, oldest))
            if rolled or (buffer.waiting() and now - self._last_write >= self.flush_s):
                self._write(model, buffer, cut=rolled, pace=not force)

    def _write(self, model: ModelLog, buffer: _Buffer, cut: bool, pace: bool = False) -> None:
        from rlserve.service.experience import tables  # pyarrow: only a server that logs needs it

        if cut:
            buffer.finished.extend(buffer.open.values())
            buffer.open.clear()
            buffer.opened.clear()
            buffer.open_rows = 0
        rows, segments, rewards, shadow = buffer.rows, buffer.finished, buffer.rewards, buffer.shadow
        buffer.rows, buffer.finished, buffer.rewards, buffer.shadow = [], [], [], []
        buffer.nbytes = 0
        buffer.since = None
        self._last_write = self._clock()
        row_parts, segment_parts = _split(rows), _split(segments, len)
        jobs: deque[tuple[str, Callable[[], Any], int]] = deque()
        jobs.extend(("columns", partial(tables.columns_table, model, part), len(part)) for part in row_parts)
        jobs.extend(("episodes", partial(tables.episodes_table, model, part), len(part)) for part in segment_parts)
        if rewards:
            jobs.append(("rewards", partial(tables.rewards_table, rewards), len(rewards)))
        if shadow:
            jobs.append(("shadow", partial(tables.shadow_table, model, shadow), len(shadow)))
        paced = pace and max(len(row_parts), len(segment_parts)) > 1
        del rows, segments, row_parts, segment_parts  # each part's rows are freed once it is written
        while jobs:
            form, build, count = jobs.popleft()
            cpu = time.thread_time()
            self._emit(model, form, build, count)
            del build
            if paced and jobs:
                time.sleep(min(MAX_PAUSE_S, PACE * (time.thread_time() - cpu)))

    def _emit(self, model: ModelLog, form: str, build: Callable[[], Any], count: int) -> None:
        self._seq += 1
        name = f"{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{self.source}-{self._seq:06d}.parquet"
        try:
            self._write_table(build(), model.directory / form / name, self.root / files.INCOMING)
        except Exception as exc:  # a full or failing disk: drop these rows, keep serving
            self._drop("write_failed", count, f"{form} of {model.name}: {type(exc).__name__}: {exc}")
            return
        self.written[form] = self.written.get(form, 0) + count
        if self.metrics is not None:
            self.metrics.experience_written(form, count)

    def _drop(self, reason: str, count: int, why: str = "") -> None:
        with self._count_lock:  # the event loop, batcher threads and this thread all drop
            self.dropped[reason] = self.dropped.get(reason, 0) + count
        if self.metrics is not None:
            self.metrics.experience_dropped(reason, count)
        now = time.monotonic()
        if now - self._warned >= WARN_EVERY_S:
            self._warned = now
            log.warning("experience log: dropped %d rows (%s%s); %s so far", count, reason,
                        f": {why}" if why else "", self.dropped)


def _split(items: list[Any], rows: Callable[[Any], int] | None = None) -> list[list[Any]]:
    """``items`` in parts of about ``PART_ROWS`` rows (``rows``: an item's; None: one each), in order."""
    if rows is None:
        return [items[i:i + PART_ROWS] for i in range(0, len(items), PART_ROWS)]
    parts: list[list[Any]] = []
    part: list[Any] = []
    held = 0
    for item in items:
        part.append(item)
        held += rows(item)
        if held >= PART_ROWS:
            parts.append(part)
            part, held = [], 0
    if part:
        parts.append(part)
    return parts
