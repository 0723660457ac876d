"""The experience writer: atomic files, rolls, a bounded queue, and a disk that fails."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
from gymnasium import spaces as gs

from rlserve.service.experience import files, reader
from rlserve.service.experience import writer as writer_module
from rlserve.service.experience.records import (
    TERMINATED,
    ModelLog,
    RewardEvent,
    ShadowScore,
    Transition,
    row_bytes,
)
from rlserve.service.experience.trail import Trail
from rlserve.service.experience.writer import ExperienceWriter


def _model(root: Path) -> ModelLog:
    return ModelLog("cartpole", gs.Box(-np.inf, np.inf, (4,), np.float32), gs.Discrete(2), root / "cartpole")


def _obs(eps_id: str, count: int) -> np.ndarray:
    return np.random.default_rng(sum(map(ord, eps_id))).normal(size=(count, 4)).astype(np.float32)


def _episode(eps_id: str, length: int, *, start: int = 0, ends: bool = True) -> list[Transition]:
    obs = [row.tobytes() for row in _obs(eps_id, start + length + 1)]  # packed, as the recorder keeps them
    out = []
    for t in range(start, start + length):
        step = Trail(eps_id, t, f"{eps_id}/{t}", obs[t], int(t % 2), None, -0.25 * (t % 3), None, True, "1", 10.0 + t)
        out.append(Transition(step, obs[t + 1], 1.0 + t, TERMINATED if ends and t == start + length - 1 else 0))
    return out


def _wait(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def _files(root: Path, form: str) -> list[Path]:
    return sorted((root / "cartpole" / form).glob("*.parquet"))


def test_an_ended_episode_is_written_in_both_forms_and_reads_back(tmp_path):
    writer = ExperienceWriter(tmp_path, flush_s=0.0)
    model = _model(tmp_path)
    episode = _episode("a", 7)
    try:
        assert writer.offer(model, episode[:4]) and writer.offer(model, episode[4:])
        _wait(lambda: _files(tmp_path, "episodes"))  # an ended episode does not wait for a roll
    finally:
        writer.close()
    table = reader.transitions(tmp_path, "cartpole")
    assert table.column("t").to_pylist() == list(range(7))
    obs = _obs("a", 8)
    assert np.array_equal(np.array(table.column("obs").to_pylist(), np.float32), obs[:-1])
    assert np.array_equal(np.array(table.column("new_obs").to_pylist(), np.float32), obs[1:])
    assert table.column("terminateds").to_pylist() == [False] * 6 + [True]
    [joined] = reader.episodes(tmp_path, "cartpole")
    assert joined.whole and len(joined) == 7 and joined.segments == 1
    assert joined.rewards == [1.0 + t for t in range(7)]
    assert not list((tmp_path / files.INCOMING).iterdir())  # no temporary file left behind


def test_an_episode_still_going_on_has_its_transitions_written_at_flush_s_not_at_a_roll(tmp_path):
    """Continuing tasks never end an episode: their transitions still reach the columns form
    within ``flush_s`` (the open segment waits for the episode's end or a roll), and a
    shadow's scores, which end no episode, too."""
    writer = ExperienceWriter(tmp_path, flush_s=0.05, roll_s=3600.0)
    model = _model(tmp_path)
    episode = _episode("endless", 6, ends=False)
    try:
        writer.offer(model, episode[:3])
        _wait(lambda: _files(tmp_path, "columns"))
        assert not _files(tmp_path, "episodes")  # the segment is open: no episodes row yet
        written = reader.transitions(tmp_path, "cartpole").column("t").to_pylist()
        assert written == [0, 1, 2]
        writer.offer(model, episode[3:])
        _wait(lambda: len(_files(tmp_path, "columns")) == 2)
        assert not _files(tmp_path, "episodes")
        dist_inputs = np.zeros(2, np.float32).tobytes()
        writer.offer_shadow(model, [ShadowScore("endless/0", "cartpole@2", -0.5, 1, dist_inputs, 1.0)])
        _wait(lambda: _files(tmp_path, "shadow"))
    finally:
        writer.close()  # shutdown cuts the open segment
    assert reader.transitions(tmp_path, "cartpole").column("t").to_pylist() == list(range(6))
    [joined] = reader.episodes(tmp_path, "cartpole")
    assert joined.segments == 1 and len(joined) == 6 and not joined.whole


def test_an_open_segment_is_cut_at_roll_s_however_often_other_rows_are_written(tmp_path):
    """An episode restarted without its end (or one that never ends) keeps an open segment:
    files written every ``flush_s`` for other episodes do not restart its clock, so a time
    roll still writes it within ``roll_s`` and the writer stops holding it."""
    writer = ExperienceWriter(tmp_path, flush_s=0.0, roll_s=0.4)
    model = _model(tmp_path)
    try:
        writer.offer(model, _episode("dangling", 3, ends=False))
        deadline = time.monotonic() + 10.0
        k = 0
        while not _files(tmp_path, "episodes") or "dangling" not in _episode_ids(tmp_path):
            assert time.monotonic() < deadline, "the open segment was never cut"
            writer.offer(model, _episode(f"short-{k}", 2))  # ends: a file every turn of the thread
            k += 1
            time.sleep(0.05)
        assert k >= 6  # several files were written before the roll
    finally:
        writer.close()


def test_open_segments_count_toward_roll_bytes_across_writes(tmp_path):
    """The rows of an episode still going on are written at every ``flush_s``, but its open
    segment holds them until a roll: ``roll_bytes`` bounds what it holds too."""
    model = _model(tmp_path)
    writer = ExperienceWriter(tmp_path, roll_bytes=5 * row_bytes(model), roll_s=3600.0, flush_s=0.0)
    episode = _episode("held", 7, ends=False)
    try:
        writer.offer(model, episode[:3])
        _wait(lambda: _files(tmp_path, "columns"))
        assert not _files(tmp_path, "episodes")
        writer.offer(model, episode[3:5])  # 2 rows wait, 5 are held: the size is reached
        _wait(lambda: _files(tmp_path, "episodes"))
        segments = pq.ParquetDataset(tmp_path / "cartpole" / "episodes").read()
        assert segments.column("length").to_pylist() == [5]
        writer.offer(model, episode[5:])
    finally:
        writer.close()
    assert reader.transitions(tmp_path, "cartpole").column("t").to_pylist() == list(range(7))


def _episode_ids(root: Path) -> list[str]:
    return pq.ParquetDataset(root / "cartpole" / "episodes").read().column("eps_id").to_pylist()


def test_a_time_roll_cuts_open_episodes_into_segments_that_join(tmp_path):
    writer = ExperienceWriter(tmp_path, roll_s=0.05, flush_s=60.0)
    model = _model(tmp_path)
    episode = _episode("long", 9)
    try:
        writer.offer(model, episode[:5])
        _wait(lambda: _files(tmp_path, "episodes"))  # the roll wrote the open part as a segment
        writer.offer(model, episode[5:])
    finally:
        writer.close()  # shutdown writes the rest
    segments = pq.ParquetDataset(tmp_path / "cartpole" / "episodes").read()
    assert sorted(segments.column("t_started").to_pylist()) == [0, 5]
    [joined] = reader.episodes(tmp_path, "cartpole")
    assert joined.whole and joined.segments == 2 and len(joined) == 9
    assert np.array_equal(np.asarray(joined.observations), _obs("long", 10))


def test_a_size_roll_cuts_an_open_episode_without_waiting_for_time_or_its_end(tmp_path):
    """``roll_bytes`` waiting write the rows and the open part of an episode as a segment,
    with no time roll, flush or ended episode to wait for; fewer bytes wait."""
    model = _model(tmp_path)
    writer = ExperienceWriter(tmp_path, roll_bytes=5 * row_bytes(model), roll_s=3600.0, flush_s=3600.0)
    episode = _episode("big", 9)
    try:
        writer.offer(model, episode[:3])  # under the size: they wait
        _wait(lambda: writer.queued_rows() == 0)
        time.sleep(0.2)  # a few of the thread's turns: nothing is due
        assert not _files(tmp_path, "columns")
        writer.offer(model, episode[3:5])  # 5 rows: the size is reached
        _wait(lambda: _files(tmp_path, "episodes"))
        assert pq.read_table(_files(tmp_path, "columns")[0]).num_rows == 5
        writer.offer(model, episode[5:])  # the rest, ended: written at shutdown (flush_s is an hour)
    finally:
        writer.close()
    segments = pq.ParquetDataset(tmp_path / "cartpole" / "episodes").read()
    assert sorted(segments.column("t_started").to_pylist()) == [0, 5]
    [joined] = reader.episodes(tmp_path, "cartpole")
    assert joined.whole and joined.segments == 2 and len(joined) == 9


def test_steps_written_elsewhere_split_a_segment_and_the_reader_rejoins_them(tmp_path):
    """One replica serves steps 0-2 and 6-8, another 3-5: each writes what it closed."""
    here, there = ExperienceWriter(tmp_path), ExperienceWriter(tmp_path)
    model = _model(tmp_path)
    episode = _episode("moved", 9)
    try:
        here.offer(model, episode[:3])
        there.offer(model, episode[3:6])
        here.offer(model, episode[6:])
    finally:
        here.close()
        there.close()
    [joined] = reader.episodes(tmp_path, "cartpole")
    assert joined.whole and joined.segments == 3 and [a.item() for a in joined.actions] == [t % 2 for t in range(9)]


def test_a_full_queue_drops_and_counts_rows_without_blocking(tmp_path):
    release = threading.Event()

    def slow_write(table, path, incoming):
        release.wait(10)
        files.write_table(table, path, incoming)

    writer = ExperienceWriter(tmp_path, queue_rows=10, flush_s=0.0, write=slow_write)
    model = _model(tmp_path)
    try:
        assert writer.offer(model, _episode("first", 2))
        _wait(lambda: writer.queued_rows() == 0)  # the thread took it and is stuck writing
        assert writer.offer(model, _episode("b", 6))
        assert not writer.offer(model, _episode("c", 6))  # 12 > 10 rows queued: dropped
        # ... at once: the stuck write has not finished (an offer that waited for room would
        # have returned only after it wrote "first").
        assert writer.dropped == {"queue_full": 6} and not _files(tmp_path, "episodes")
    finally:
        release.set()
        writer.close()
    assert {e.eps_id for e in reader.episodes(tmp_path, "cartpole")} == {"first", "b"}


def test_a_failing_disk_drops_the_rows_it_refused_and_later_writes_succeed(tmp_path):
    broken = {"on": True}

    def flaky(table, path, incoming):
        if broken["on"]:
            raise OSError(28, "No space left on device")
        files.write_table(table, path, incoming)

    writer = ExperienceWriter(tmp_path, flush_s=0.0, write=flaky)
    model = _model(tmp_path)
    try:
        writer.offer(model, _episode("lost", 4))
        _wait(lambda: writer.dropped.get("write_failed", 0) == 5)  # 4 transitions + 1 segment
        broken["on"] = False
        writer.offer(model, _episode("kept", 3))
    finally:
        writer.close()
    assert [e.eps_id for e in reader.episodes(tmp_path, "cartpole")] == ["kept"]


def test_rows_offered_after_close_are_dropped(tmp_path):
    writer = ExperienceWriter(tmp_path)
    writer.close()
    assert not writer.offer(_model(tmp_path), _episode("late", 2))
    assert writer.dropped == {"queue_full": 2}


def test_delayed_rewards_are_applied_by_the_reader(tmp_path):
    writer = ExperienceWriter(tmp_path)
    model = _model(tmp_path)
    try:
        writer.offer(model, _episode("r", 3))
        writer.offer_rewards(model, [RewardEvent("r/1", 5.0, "add", 1.0), RewardEvent("r/2", -1.0, "replace", 2.0),
                                     RewardEvent("unknown", 9.0, "add", 3.0)])
    finally:
        writer.close()
    table = reader.transitions(tmp_path, "cartpole")
    assert table.column("rewards").to_pylist() == [1.0, 2.0 + 5.0, -1.0]
    [episode] = reader.episodes(tmp_path, "cartpole")
    assert episode.rewards == [1.0, 7.0, -1.0]


def test_the_writer_thread_imports_nothing_after_start(tmp_path):
    """pyarrow imports pandas and pyarrow.compute at the first table it builds; that must
    happen when the log starts (before gc.freeze), not in the writer thread under load."""
    code = f"""
import sys
from pathlib import Path
from rlserve.service.experience.log import ExperienceLog
from test_experience_writer import _episode, _model
log = ExperienceLog(Path({str(tmp_path)!r}))
before = set(sys.modules)
log.writer.offer(_model(Path({str(tmp_path)!r})), _episode("a", 5))
log.close()
print(sorted(set(sys.modules) - before))
"""
    # python -c puts its working directory on sys.path: this folder, for this module's helpers.
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).parent)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
    assert _files(tmp_path, "columns") and _files(tmp_path, "episodes")


def test_a_log_has_arrows_code_allocate_with_the_c_library_unless_told_otherwise(tmp_path: Path) -> None:
    """``files.load_parquet`` picks Arrow's process-wide allocator before pyarrow's first import
    (mimalloc re-faulted every file's pages): the Parquet writer's own buffers then come from
    the C library's allocator, not mimalloc; a value the user set is kept."""
    program = (
        "import sys, pathlib, io\n"
        "from rlserve.service.experience.log import ExperienceLog\n"
        "log = ExperienceLog(pathlib.Path(sys.argv[1]))\n"
        "import pyarrow as pa, pyarrow.parquet as pq\n"
        "mimalloc = pa.mimalloc_memory_pool(); before = mimalloc.num_allocations()\n"
        "pq.write_table(pa.table({'x': pa.array(range(10000))}), io.BytesIO())\n"
        "print(pa.default_memory_pool().backend_name, mimalloc.num_allocations() - before)\n"
        "log.writer.close()\n")
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    chosen = subprocess.run([sys.executable, "-c", program, str(tmp_path / "a")], env=env, capture_output=True,
                            text=True, timeout=120, check=True).stdout.split()
    assert chosen == ["system", "0"]
    kept = subprocess.run([sys.executable, "-c", program, str(tmp_path / "b")],
                          env={**env, "ARROW_DEFAULT_MEMORY_POOL": "mimalloc"}, capture_output=True, text=True,
                          timeout=120, check=True).stdout.split()
    assert kept[0] == "mimalloc" and int(kept[1]) > 0


def test_a_large_write_goes_out_in_parts_and_loses_nothing(tmp_path, monkeypatch):
    """A write of more than ``PART_ROWS`` transitions (a roll of long episodes) is several
    files of about that many rows each, paced; every row and segment is in one of them."""
    monkeypatch.setattr(writer_module, "PART_ROWS", 4)
    writer = ExperienceWriter(tmp_path, roll_s=0.2, flush_s=3600.0)
    model = _model(tmp_path)
    try:
        for name in ("p", "q", "r"):
            writer.offer(model, _episode(name, 5, ends=False))
        _wait(lambda: len(_files(tmp_path, "episodes")) >= 3)  # the roll: 15 rows, 3 open segments
    finally:
        writer.close()
    columns = [pq.read_table(path).num_rows for path in _files(tmp_path, "columns")]
    assert columns == [4, 4, 4, 3]
    assert [pq.read_table(path).num_rows for path in _files(tmp_path, "episodes")] == [1, 1, 1]
    assert sorted(reader.transitions(tmp_path, "cartpole").column("eps_id").to_pylist()) == \
        sorted(["p"] * 5 + ["q"] * 5 + ["r"] * 5)
