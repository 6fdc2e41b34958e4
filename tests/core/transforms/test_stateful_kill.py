"""rate-micro-batch -> with_watermark -> windowed count -> Delta, SIGKILLed at every engine crash
point and at random moments, for both state stores: every window the final watermark has
passed is in the table exactly once, with the right count. The same for deduplication and for
session windows."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import headrace as hr
from headrace.testing import CRASH_POINTS, run_until_done

deltalake = pytest.importorskip("deltalake")

PER_BATCH = 50
BATCHES = 40
START_MS = 1_700_000_000_000  # a multiple of the window length
ADVANCE_MS = 1_000  # each batch's rows are one second later
WINDOW_S = 5
DELAY_S = 2


def windowed_count(stream: Any) -> Any:
    """The pipeline's plan (loaded by the subprocess runner)."""
    return (stream.with_watermark("timestamp", f"{DELAY_S} seconds")
            .with_column("k", "value % 3")
            .group_by(hr.window("timestamp", f"{WINDOW_S} seconds"), "k")
            .count())  # fmt: skip


def deduplicated(stream: Any) -> Any:
    return (stream.with_watermark("timestamp", f"{DELAY_S} seconds")
            .with_column("k", "value % 7")
            .drop_duplicates("k", "timestamp"))  # fmt: skip


def sessions(stream: Any) -> Any:
    # every fifth batch has no rows: a 2 s gap that closes the sessions (gap 1.5 s)
    return (stream.with_watermark("timestamp", f"{DELAY_S} seconds")
            .where(f"(value // {PER_BATCH}) % 5 != 4")
            .with_column("k", "value % 3")
            .group_by(hr.session_window("timestamp", "1500 milliseconds"), "k")
            .agg("count(*) AS n", "min(value) AS first"))  # fmt: skip


def expected() -> dict[tuple[int, int], int]:
    """(window start second, k) -> count, for the windows the final watermark closes."""
    final_wm_s = (BATCHES - 1) * ADVANCE_MS // 1000 - DELAY_S
    out: Counter[tuple[int, int]] = Counter()
    for i in range(PER_BATCH * BATCHES):
        sec = (i // PER_BATCH) * ADVANCE_MS // 1000
        start = sec - sec % WINDOW_S
        if start + WINDOW_S <= final_wm_s:
            out[(start, i % 3)] += 1
    return dict(out)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["memory", "rocksdb"])
def test_windowed_count_to_delta_exactly_once_across_kills(tmp_path: Path, backend: str) -> None:
    out = str(tmp_path / "out")
    spec = {
        "source": {"format": "rate-micro-batch",
                   "options": {"rowsPerBatch": PER_BATCH, "totalRows": PER_BATCH * BATCHES, "numPartitions": 2,
                               "startTimestamp": START_MS, "advanceMillisPerBatch": ADVANCE_MS}},
        "frame": f"{__name__}:windowed_count",
        "sink": {"format": "delta", "options": {"path": out, "stateStore": backend}},
        "checkpoint": str(tmp_path / "chk"),
        "name": "windowed-kill",
        "output_mode": "append",
        "trigger": {"available_now": True},
    }  # fmt: skip
    # each run resumes and dies at the next crash point, a few batches further on each time
    crashes = ["before_offsets:0", *(f"{p}:{3 * i + 2}" for i, p in enumerate(CRASH_POINTS))]
    results = run_until_done(spec, crashes=crashes, random_kills=2, kill_window=(1.0, 2.5), seed=13, timeout=180)
    killed = sum(r.killed for r in results[: len(crashes)])
    assert killed == len(crashes), [r.stderr[-800:] for r in results if not r.killed]
    rows = deltalake.DeltaTable(out).to_pyarrow_table().to_pylist()
    got = Counter((int(r["window"]["start"].timestamp()) - START_MS // 1000, r["k"]) for r in rows)
    dup = [k for k, n in got.items() if n > 1]
    assert not dup, f"windows written more than once: {dup[:5]}"
    counts = {(int(r["window"]["start"].timestamp()) - START_MS // 1000, r["k"]): r["count"] for r in rows}
    assert counts == expected()
    # state files: changelogs of recent batches, not the whole history
    state = tmp_path / "chk" / "state"
    assert state.is_dir() and any(state.rglob("changelog"))


def _spec(tmp_path: Path, frame: str, backend: str) -> dict[str, Any]:
    return {
        "source": {"format": "rate-micro-batch",
                   "options": {"rowsPerBatch": PER_BATCH, "totalRows": PER_BATCH * BATCHES, "numPartitions": 2,
                               "startTimestamp": START_MS, "advanceMillisPerBatch": ADVANCE_MS}},
        "frame": f"{__name__}:{frame}",
        "sink": {"format": "delta", "options": {"path": str(tmp_path / "out"), "stateStore": backend}},
        "checkpoint": str(tmp_path / "chk"),
        "name": f"{frame}-kill",
        "output_mode": "append",
        "trigger": {"available_now": True},
    }  # fmt: skip


# the points where the operator has written state version n but the batch is not committed
# (the replay must start again from n - 1), plus one mid-batch; the windowed test covers all
STATE_POINTS = ("mid_write", "before_sink_commit", "after_sink_commit")


def _kill_and_finish(spec: dict[str, Any]) -> list[dict[str, Any]]:
    crashes = [f"{p}:{3 * i + 2}" for i, p in enumerate(STATE_POINTS)]
    results = run_until_done(spec, crashes=crashes, random_kills=1, kill_window=(1.0, 2.5), seed=5, timeout=180)
    killed = sum(r.killed for r in results[: len(crashes)])
    assert killed == len(crashes), [r.stderr[-800:] for r in results if not r.killed]
    return list(deltalake.DeltaTable(spec["sink"]["options"]["path"]).to_pyarrow_table().to_pylist())


# RocksDB: the deduplication's keys are held in memory (never written to the database between
# checkpoints and the close), so a kill finds the database at an older clean version or dirty
@pytest.mark.slow
@pytest.mark.parametrize("backend", ["memory", "rocksdb"])
def test_drop_duplicates_to_delta_exactly_once_across_kills(tmp_path: Path, backend: str) -> None:
    rows = _kill_and_finish(_spec(tmp_path, "deduplicated", backend))
    got = Counter((int(r["timestamp"].timestamp()) - START_MS // 1000, r["k"]) for r in rows)
    assert not [k for k, n in got.items() if n > 1], "a key was emitted twice"
    want: dict[tuple[int, int], int] = {}
    for i in range(PER_BATCH * BATCHES):
        want.setdefault(((i // PER_BATCH) * ADVANCE_MS // 1000, i % 7), i)  # the first row of each key
    assert {(int(r["timestamp"].timestamp()) - START_MS // 1000, r["k"]): r["value"] for r in rows} == want


@pytest.mark.slow
def test_session_windows_to_delta_exactly_once_across_kills(tmp_path: Path) -> None:
    rows = _kill_and_finish(_spec(tmp_path, "sessions", "rocksdb"))
    got = Counter((int(r["session_window"]["start"].timestamp()) - START_MS // 1000, r["k"]) for r in rows)
    assert not [k for k, n in got.items() if n > 1], "a session was emitted twice"
    final_wm_s = (BATCHES - 1) * ADVANCE_MS // 1000 - DELAY_S  # the watermark sees rows before the where
    want: dict[tuple[int, int], tuple[int, int]] = {}
    for i in range(PER_BATCH * BATCHES):
        b = i // PER_BATCH
        if b % 5 == 4:
            continue
        start = b - b % 5
        if start + 3 + 1.5 <= final_wm_s:  # the session [start, start + 3 + 1.5 s) is closed
            n, first = want.get((start, i % 3), (0, i))
            want[(start, i % 3)] = (n + 1, min(first, i))
    assert {(int(r["session_window"]["start"].timestamp()) - START_MS // 1000, r["k"]): (r["n"], r["first"])
            for r in rows} == want  # fmt: skip


def windowed_count_no_watermark(stream: Any) -> Any:
    return (stream.with_column("k", "value % 3")
            .group_by(hr.window("timestamp", f"{WINDOW_S} seconds"), "k")
            .count())  # fmt: skip


@pytest.mark.slow
def test_complete_mode_to_delta_across_kills(tmp_path: Path) -> None:
    """Complete mode overwrites the table each batch: after the kills it holds the whole
    result over all input, once."""
    spec = _spec(tmp_path, "windowed_count_no_watermark", "memory")
    spec["output_mode"] = "complete"
    rows = _kill_and_finish(spec)
    got = Counter((int(r["window"]["start"].timestamp()) - START_MS // 1000, r["k"]) for r in rows)
    assert not [k for k, n in got.items() if n > 1]
    want: Counter[tuple[int, int]] = Counter()
    for i in range(PER_BATCH * BATCHES):
        sec = (i // PER_BATCH) * ADVANCE_MS // 1000
        want[(sec - sec % WINDOW_S, i % 3)] += 1
    assert {(int(r["window"]["start"].timestamp()) - START_MS // 1000, r["k"]): r["count"] for r in rows} == dict(want)
