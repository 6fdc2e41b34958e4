"""Two watermarks per batch, as Spark since 3.4: late input is dropped by the previous batch's
watermark, windows are emitted and state evicted by this batch's; both are recorded in
``offsets/<n>``, and an entry written without the late-events watermark takes it from the
previous entry. (The same input runs against PySpark in tests/conformance/test_two_watermarks.py.)"""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path
from typing import Any, cast

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import headrace as hr
from headrace.checkpoint import Checkpoint
from headrace.errors import CheckpointError

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
T0_MS = int(T0.timestamp() * 1000)
SCHEMA = pa.schema([("ts", pa.timestamp("us", tz="UTC")), ("k", pa.string())])
# seconds after T0 per batch (delay 5 s: watermark 0, 96, 115, 125 for batches 0..3)
BATCHES = [
    [(100, "a"), (101, "b")],
    [(85, "a"), (86, "a"), (97, "b"), (120, "a")],  # 85, 86: behind 96 but not behind 0: kept
    [(88, "a"), (88, "a"), (88, "a"), (91, "b"), (95, "a"), (96, "b"), (130, "b")],  # 88 x3: late, one group
    [(100, "a"), (120, "a"), (126, "a"), (126, "a")],  # 100: late by 115
]


def write_batches(folder: Path, batches: list[list[tuple[int, str]]]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for i, rows in enumerate(batches):
        t = pa.table({"ts": [T0 + dt.timedelta(seconds=s) for s, _ in rows], "k": [k for _, k in rows]}, schema=SCHEMA)
        pq.write_table(t, folder / f"batch-{i:05d}.parquet")


def run(folder: Path, chk: Path, build: Any, mode: str, backend: str) -> tuple[dict[int, list[Any]], list[Any]]:
    out: dict[int, list[Any]] = {}

    def collect(table: pa.Table, batch_id: int) -> None:
        out[batch_id] = sorted(map(_row, table.to_pylist()))

    frame = (hr.read_stream.format("cloudFiles").option("cloudFiles.format", "parquet").option("maxFilesPerTrigger", 1)
             .schema("ts TIMESTAMP, k STRING").load(str(folder)).with_watermark("ts", "5 seconds"))  # fmt: skip
    q = (build(frame).write_stream.foreach_batch(collect).output_mode(mode).option("stateStore", backend)
         .option("checkpointLocation", str(chk)).trigger(available_now=True).start())  # fmt: skip
    assert q.await_termination(120)
    assert q.exception() is None, q.exception()
    return out, list(q.recent_progress)


def _row(r: dict[str, Any]) -> tuple[Any, ...]:
    w = r.get("window") or r.get("session_window")
    head = (int((w["start"] - T0).total_seconds()),) if w else (int((r["ts"] - T0).total_seconds()),)
    return (*head, r["k"], *(v for c, v in r.items() if c not in ("window", "session_window", "ts", "k")))


def tumbling(frame: Any) -> Any:
    return frame.group_by(hr.window("ts", "10 seconds"), "k").agg("count(*) AS n")


def dropped(progress: list[Any]) -> list[int]:
    return [p["stateOperators"][0]["numRowsDroppedByWatermark"] for p in progress]


BACKENDS = ["memory", pytest.param("rocksdb", marks=pytest.mark.skipif(
    __import__("importlib").util.find_spec("rocksdict") is None, reason="rocksdict not installed"))]  # fmt: skip


@pytest.mark.parametrize("backend", BACKENDS)
def test_windowed_append_drops_by_the_previous_watermark_and_counts_late_groups(tmp_path: Path, backend: str) -> None:
    write_batches(tmp_path / "in", BATCHES)
    out, progress = run(tmp_path / "in", tmp_path / "chk", tumbling, "append", backend)
    assert out == {
        0: [],
        1: [(80, "a", 2)],  # 85 and 86 arrived after the watermark (96) passed their window: still counted
        2: [(90, "a", 1), (90, "b", 3), (100, "a", 1), (100, "b", 1)],
        3: [],
    }
    assert dropped(progress) == [0, 0, 1, 1]  # three late rows of one window and key: one group
    metas = [Checkpoint(str(tmp_path / "chk")).read_offsets(i).metadata for i in range(4)]
    assert [m["batchWatermarkMs"] for m in metas] == [0, T0_MS + 96_000, T0_MS + 115_000, T0_MS + 125_000]
    assert [m["batchWatermarkForLateEventsMs"] for m in metas] == [0, 0, T0_MS + 96_000, T0_MS + 115_000]


@pytest.mark.parametrize("backend", BACKENDS)
def test_windowed_update_keeps_rows_between_the_watermarks(tmp_path: Path, backend: str) -> None:
    write_batches(tmp_path / "in", BATCHES[:2])
    out, progress = run(tmp_path / "in", tmp_path / "chk", tumbling, "update", backend)
    assert out[1] == [(80, "a", 2), (90, "b", 1), (120, "a", 1)]
    assert out[2] == []  # a batch without data: the watermark (115) evicts what is older
    assert dropped(progress) == [0, 0, 0]


def test_session_complete_drops_late_rows_and_runs_no_batch_without_data(tmp_path: Path) -> None:
    write_batches(tmp_path / "in", BATCHES)
    out, progress = run(tmp_path / "in", tmp_path / "chk",
                        lambda f: f.group_by(hr.session_window("ts", "4 seconds"), "k").agg("count(*) AS n"),
                        "complete", "memory")  # fmt: skip
    assert sorted(out) == [0, 1, 2, 3]  # no batch without data after the last one
    # batch 2's 88 x3 (sessions [88, 92) end before 96: one key and time, counted once) and 91 are dropped
    assert dropped(progress) == [0, 0, 2, 1]
    assert (88, "a", 3) not in out[2] and all(r[0] != 88 for r in out[3])


def test_dedup_event_time_drops_by_the_previous_watermark(tmp_path: Path) -> None:
    write_batches(tmp_path / "in", BATCHES)
    out, progress = run(tmp_path / "in", tmp_path / "chk", lambda f: f.drop_duplicates("k", "ts"), "append", "memory")
    assert out[1] == [(85, "a"), (86, "a"), (97, "b"), (120, "a")]
    assert out[2] == [(130, "b")]  # 88 x3, 91, 95, 96: at or behind 96 (batch 1's watermark), late
    assert out[3] == [(126, "a")]  # 100: late (behind 115); 120: seen in batch 1 and still in state
    assert dropped(progress) == [0, 0, 6, 1]


def _rewrite_without_late(chk: Path, batch_id: int) -> None:
    path = chk / "offsets" / str(batch_id)
    doc = json.loads(path.read_text())
    del doc["metadata"]["batchWatermarkForLateEventsMs"]
    path.write_text(json.dumps(doc))
    os.remove(chk / "commits" / str(batch_id))


def test_an_entry_without_the_late_watermark_replays_with_the_previous_entrys(tmp_path: Path) -> None:
    write_batches(tmp_path / "in", BATCHES[:3])
    first, _ = run(tmp_path / "in", tmp_path / "chk", tumbling, "append", "memory")
    # batch 2 as the previous code wrote it (no late-events field) and never committed
    _rewrite_without_late(tmp_path / "chk", 2)
    replayed, progress = run(tmp_path / "in", tmp_path / "chk", tumbling, "append", "memory")
    assert replayed[2] == first[2]  # late by batch 1's watermark (96), as when it first ran
    assert dropped(progress)[0] == 1


def test_a_bad_late_watermark_is_refused_naming_the_entry(tmp_path: Path) -> None:
    write_batches(tmp_path / "in", BATCHES[:2])
    run(tmp_path / "in", tmp_path / "chk", tumbling, "append", "memory")
    path = tmp_path / "chk" / "offsets" / "1"
    doc = json.loads(path.read_text())
    doc["metadata"]["batchWatermarkForLateEventsMs"] = doc["metadata"]["batchWatermarkMs"] + 1
    path.write_text(json.dumps(doc))
    with pytest.raises(CheckpointError, match=r"offsets.1.*batchWatermarkForLateEventsMs.*at most"):
        Checkpoint(str(tmp_path / "chk")).read_offsets(1)


@pytest.mark.parametrize("within", [False, True], ids=["drop_duplicates", "within_watermark"])
def test_dedup_never_drops_a_null_event_time_as_late(tmp_path: Path, within: bool) -> None:
    folder = tmp_path / "in"
    folder.mkdir()
    for i, rows in enumerate(cast(list[list[tuple[int | None, str]]],
                                  [[(100, "a"), (None, "n")], [(None, "n"), (200, "b")], [(None, "n")]])):
        ts = [None if s is None else T0 + dt.timedelta(seconds=s) for s, _ in rows]
        pq.write_table(pa.table({"ts": ts, "k": [k for _, k in rows]}, schema=SCHEMA), folder / f"b-{i}.parquet")
    out: dict[int, list[Any]] = {}
    frame = (hr.read_stream.format("cloudFiles").option("cloudFiles.format", "parquet").option("maxFilesPerTrigger", 1)
             .schema("ts TIMESTAMP, k STRING").load(str(folder)).with_watermark("ts", "5 seconds"))  # fmt: skip
    frame = frame.drop_duplicates_within_watermark("k") if within else frame.drop_duplicates("k", "ts")
    q = (frame.write_stream.foreach_batch(lambda t, b: out.__setitem__(b, t.column("k").to_pylist()))
         .option("checkpointLocation", str(tmp_path / "chk")).trigger(available_now=True).start())  # fmt: skip
    assert q.await_termination(120) and q.exception() is None, q.exception()
    # a NULL-time row is never late (Spark's predicate is NULL); drop_duplicates keeps its key for
    # ever; within the watermark it expires as of the epoch (as Spark does): batch 1's watermark
    # evicts it after batch 1 dropped its duplicate, so batch 2's is new again
    expected = ["a", "b", "n", "n"] if within else ["a", "b", "n"]
    assert sorted(k for ks in out.values() for k in ks) == expected
    assert [p["stateOperators"][0]["numRowsDroppedByWatermark"] for p in q.recent_progress] == [0] * len(out)
