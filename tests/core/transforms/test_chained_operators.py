"""Chained stateful operators in append mode (a deduplication before a windowed aggregation, a
windowed aggregation feeding another one on its window), Spark's refusal of them in the other
modes, and ``multipleWatermarkPolicy`` with two watermarked inputs of a union."""

from __future__ import annotations

import datetime as dt
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import headrace as hr
from headrace.errors import UnsupportedError
from headrace.testing import memory_stream

TS = pa.timestamp("us", tz="UTC")
SCHEMA = pa.schema([("ts", TS), ("id", pa.int64())])
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def stream(name: str | None = None) -> tuple[Any, Any]:
    name = name or uuid.uuid4().hex
    return memory_stream(name, SCHEMA), hr.read_stream.format("memory").option("name", name).schema(
        SCHEMA
    ).load()


def rows(*pairs: tuple[int, int]) -> list[dict[str, Any]]:
    return [{"ts": T0 + dt.timedelta(seconds=s), "id": i} for s, i in pairs]


def drive(frame: Any, feeds: list[list[tuple[Any, list[dict[str, Any]]]]], chk: Path, mode: str = "append",
          **options: Any) -> tuple[dict[int, pa.Table], list[dict[str, Any]]]:  # fmt: skip
    out: dict[int, pa.Table] = {}
    writer = frame.write_stream.foreach_batch(lambda t, b: out.__setitem__(b, t)).output_mode(mode)
    writer = writer.option("checkpointLocation", str(chk))
    for k, v in options.items():
        writer = writer.option(k, v)
    q = writer.start()
    try:
        for feed in feeds:
            for s, data in feed:
                s.add(data)
            q.process_all_available(60)
    finally:
        q.stop()
    assert q.exception() is None, q.exception()
    return out, q.recent_progress


def windows(out: dict[int, pa.Table]) -> list[tuple[int, ...]]:
    got = []
    for b in sorted(out):
        for r in out[b].to_pylist():
            w = r["window"]
            got.append((int((w["start"] - T0).total_seconds()), *(v for k, v in r.items() if k != "window")))
    return got


def test_deduplication_then_windowed_count(tmp_path: Path) -> None:
    s, f = stream()
    frame = (f.with_watermark("ts", "5 seconds").drop_duplicates("id", "ts")
             .group_by(hr.window("ts", "10 seconds")).agg("count(*) AS n"))  # fmt: skip
    out, progress = drive(frame, [[(s, rows((1, 1), (1, 1), (2, 2)))], [(s, rows((12, 3), (2, 2)))],
                                  [(s, rows((40, 4)))]], tmp_path / "chk")  # fmt: skip
    assert windows(out) == [(0, 2), (10, 1)]  # the duplicate (1, 1) and the repeated (2, 2) counted once
    # Spark's order: the last operator of the plan first
    assert [op["operatorName"] for op in progress[-1]["stateOperators"]] == ["stateStoreSave", "dedupe"]


def test_a_windowed_aggregation_feeds_another_on_its_window(tmp_path: Path) -> None:
    s, f = stream()
    frame = (f.with_watermark("ts", "5 seconds").group_by(hr.window("ts", "10 seconds")).agg("count(*) AS n")
             .group_by(hr.window("window", "30 seconds")).agg("sum(n) AS total", "count(*) AS windows"))  # fmt: skip
    feeds = [[(s, rows((1, 1), (2, 2), (12, 3)))], [(s, rows((25, 4), (33, 5)))], [(s, rows((61, 6)))],
             [(s, rows((95, 7)))], [(s, rows((200, 8)))]]  # fmt: skip
    out, _ = drive(frame, feeds, tmp_path / "chk")
    assert sorted(windows(out)) == [(0, 4, 3), (30, 1, 1), (60, 1, 1), (90, 1, 1)]


@pytest.mark.parametrize("mode", ["update", "complete"])
def test_chained_aggregations_outside_append_mode_are_refused(mode: str, tmp_path: Path) -> None:
    _, f = stream()
    frame = (f.with_watermark("ts", "5 seconds").group_by(hr.window("ts", "10 seconds")).agg("count(*) AS n")
             .group_by(hr.window("window", "30 seconds")).agg("sum(n) AS total"))  # fmt: skip
    writer = frame.write_stream.foreach_batch(lambda t, b: None).output_mode(mode)
    with pytest.raises(UnsupportedError, match="possible 'correctness' issue due to global watermark"):
        writer.option("checkpointLocation", str(tmp_path / "chk")).start()


def test_deduplication_without_event_time_after_an_aggregation_in_update_mode_runs(tmp_path: Path) -> None:
    # Spark counts a deduplication as stateful for this check only with the event time among its keys
    s, f = stream()
    frame = f.group_by("id").agg("count(*) AS n").drop_duplicates("id")
    out, _ = drive(frame, [[(s, rows((1, 1), (2, 1)))]], tmp_path / "chk", mode="update")
    assert out


# ------------------------------------------------------------------------------------ watermark policy


@pytest.mark.parametrize(("policy", "watermark_s", "late"), [("min", 10, 0), ("max", 100, 1)])
def test_multiple_watermark_policy_of_a_union(
    policy: str, watermark_s: int, late: int, tmp_path: Path
) -> None:
    a, fa = stream()
    b, fb = stream()
    frame = (fa.with_watermark("ts", "0 seconds").union(fb.with_watermark("ts", "0 seconds"))
             .group_by(hr.window("ts", "10 seconds")).agg("count(*) AS n"))  # fmt: skip
    # a is at 100 s, b at 10 s; then b brings a row at 50 s: late for the max policy only
    out, progress = drive(frame, [[(a, rows((100, 1))), (b, rows((10, 2)))], [(b, rows((50, 3)))]], tmp_path / "chk",
                          multipleWatermarkPolicy=policy)  # fmt: skip
    marks = [p["eventTime"]["watermark"] for p in progress]
    assert f"2026-01-01T00:{watermark_s // 60:02d}:{watermark_s % 60:02d}.000Z" in marks
    dropped = sum(op["numRowsDroppedByWatermark"] for p in progress for op in p["stateOperators"])
    assert dropped == late
    assert 50 not in [w[0] for w in windows(out)]  # min: not closed yet; max: dropped as late


def test_the_spark_name_of_the_policy_is_read_too(tmp_path: Path) -> None:
    a, fa = stream()
    b, fb = stream()
    frame = (
        fa.with_watermark("ts", "0 seconds")
        .union(fb.with_watermark("ts", "0 seconds"))
        .drop_duplicates("id", "ts")
    )
    _, progress = drive(frame, [[(a, rows((100, 1))), (b, rows((10, 2)))], [(a, rows((101, 3)))]], tmp_path / "chk",
                        **{"spark.sql.streaming.multipleWatermarkPolicy": "max"})  # fmt: skip
    assert progress[-1]["eventTime"]["watermark"] >= "2026-01-01T00:01:40.000Z"


def test_a_union_of_two_watermarked_streams_waits_for_both_with_min(tmp_path: Path) -> None:
    a, fa = stream()
    _, fb = stream()
    frame = (
        fa.with_watermark("ts", "0 seconds")
        .union(fb.with_watermark("ts", "0 seconds"))
        .drop_duplicates("id", "ts")
    )
    _, progress = drive(frame, [[(a, rows((100, 1)))], [(a, rows((200, 2)))]], tmp_path / "chk")
    assert {p["eventTime"]["watermark"] for p in progress} == {"1970-01-01T00:00:00.000Z"}


def test_after_a_restart_the_inputs_maxima_are_kept(tmp_path: Path) -> None:
    # a difference from Spark (docs/transforms.md): Spark forgets each input's watermark when
    # the query restarts (an input without new rows counts as 0 again, holding the min policy's
    # watermark), headrace continues from the maxima its last commit recorded
    a, fa = stream()
    b, fb = stream()
    frame = (
        fa.with_watermark("ts", "0 seconds")
        .union(fb.with_watermark("ts", "0 seconds"))
        .drop_duplicates("id", "ts")
    )
    drive(frame, [[(a, rows((100, 1))), (b, rows((50, 2)))]], tmp_path / "chk")
    _, progress = drive(frame, [[(a, rows((200, 3)))], [(a, rows((300, 4)))]], tmp_path / "chk")
    # b's recorded 50 s still counts: the watermark is min(a, b) = 50 s, not held back at 0
    assert progress[-1]["eventTime"]["watermark"] == "2026-01-01T00:00:50.000Z"
