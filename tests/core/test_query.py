"""The micro-batch engine: triggers, replay, failure, stop, parallel reads, real-time."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

import headrace as hr
from headrace.checkpoint import Checkpoint
from headrace.errors import HeadraceError, OptionsError, StreamingQueryException, UnsupportedError
from headrace.plugins import ConnectorSpec, hookimpl, registry
from headrace.protocols import CommitMessage, Sink
from headrace.testing import memory_stream


class RecordingSink(Sink):
    """Remembers every call, per query name (class-level, for inspection by tests)."""

    calls: dict[str, list[tuple[str, int, int]]] = {}
    idempotent_commit = True

    def write(self, batch_id: int, data: Iterator[pa.RecordBatch]) -> CommitMessage | None:
        rows = sum(b.num_rows for b in data)
        self.calls.setdefault(self.context.query_name, []).append(("write", batch_id, rows))
        return None

    def commit(self, batch_id: int, messages: Sequence[CommitMessage | None]) -> None:
        self.calls.setdefault(self.context.query_name, []).append(("commit", batch_id, 0))

    def abort(self, batch_id: int, messages: Sequence[CommitMessage | None]) -> None:
        self.calls.setdefault(self.context.query_name, []).append(("abort", batch_id, 0))


_mod = ModuleType("recording_plugin")
_mod.headrace_connectors = hookimpl(lambda: [ConnectorSpec(name="recording", sink=f"{__name__}:RecordingSink")])  # type: ignore[attr-defined]
registry().register_module(_mod, "tests")


def rate(total: int, per_batch: int, **opts: Any) -> hr.StreamFrame:
    return hr.read_stream.format("rate-micro-batch").options(rowsPerBatch=per_batch, totalRows=total, **opts).load()


def values(name: str) -> list[int]:
    return hr.memory_table(name).column("value").to_pylist()


def test_available_now_reads_everything_in_rate_limited_batches(tmp_path: Path) -> None:
    q = rate(1000, 300).write_stream.format("memory").query_name("avail").option(
        "checkpointLocation", str(tmp_path)).trigger(available_now=True).start()  # fmt: skip
    assert q.await_termination(30)
    assert values("avail") == list(range(1000))
    assert [p["numInputRows"] for p in q.recent_progress] == [300, 300, 300, 100]
    assert [p["batchId"] for p in q.recent_progress] == [0, 1, 2, 3]


def test_once_reads_everything_in_one_batch(tmp_path: Path) -> None:
    q = rate(1000, 300).write_stream.format("memory").query_name("once").trigger(once=True).start()
    q.await_termination(30)
    assert [p["numInputRows"] for p in q.recent_progress] == [1000]


def test_restart_continues_after_the_last_committed_batch(tmp_path: Path) -> None:
    def run(total: int) -> StreamingQueryException | None:
        q = rate(total, 100).write_stream.format("files").option("checkpointLocation", str(tmp_path / "chk")).trigger(
            available_now=True).start(str(tmp_path / "out"))  # fmt: skip
        q.await_termination(30)
        return q.exception()

    run(250)
    run(600)
    from headrace.connectors.files import read_files

    assert sorted(read_files(str(tmp_path / "out")).column("value").to_pylist()) == list(range(600))
    assert Checkpoint(str(tmp_path / "chk")).batch_ids()[-1] == 6


def test_an_uncommitted_batch_is_replayed_with_the_same_id_and_range(tmp_path: Path) -> None:
    chk = tmp_path / "chk"
    q = rate(500, 100).write_stream.format("recording").query_name("replay").option(
        "checkpointLocation", str(chk)).trigger(available_now=True).start()  # fmt: skip
    q.await_termination(30)
    (chk / "commits" / "4").unlink()  # as if the process died between sink commit and commits/4
    RecordingSink.calls["replay"].clear()
    q = rate(500, 100).write_stream.format("recording").query_name("replay").option(
        "checkpointLocation", str(chk)).trigger(available_now=True).start()  # fmt: skip
    q.await_termination(30)
    assert RecordingSink.calls["replay"] == [("write", 4, 100), ("commit", 4, 0)]
    assert Checkpoint(str(chk)).committed_ids()[-1] == 4


def test_a_failing_batch_fails_the_query_and_leaves_the_checkpoint_consistent(tmp_path: Path) -> None:
    chk = str(tmp_path / "chk")

    def explode(t: pa.Table) -> pa.Table:
        if pc.max(t.column("value")).as_py() >= 250:
            raise ValueError("bad row")
        return t

    q = rate(400, 100).map_batches(explode).write_stream.format("recording").query_name("fail").option(
        "checkpointLocation", chk).trigger(available_now=True).start()  # fmt: skip
    with pytest.raises(StreamingQueryException, match="failed in batch 2: ValueError: bad row") as e:
        q.await_termination(30)
    assert isinstance(e.value.cause, ValueError)
    assert isinstance(q.exception(), StreamingQueryException)
    assert ("abort", 2, 0) in RecordingSink.calls["fail"]
    cp = Checkpoint(chk)
    assert cp.batch_ids()[-1] == 2 and cp.committed_ids()[-1] == 1
    # fixed code: the failed batch is replayed, then the rest
    RecordingSink.calls["fail"].clear()
    q = rate(400, 100).write_stream.format("recording").query_name("fail").option(
        "checkpointLocation", chk).trigger(available_now=True).start()  # fmt: skip
    q.await_termination(30)
    assert [c[:2] for c in RecordingSink.calls["fail"] if c[0] == "commit"] == [("commit", 2), ("commit", 3)]


def test_parallel_partitions_keep_order(tmp_path: Path) -> None:
    q = rate(200_000, 100_000, numPartitions=4).write_stream.format("memory").query_name("par").trigger(
        available_now=True).start()  # fmt: skip
    q.await_termination(30)
    assert values("par") == list(range(200_000))


def test_map_batches_transforms_every_batch() -> None:
    frame = rate(100, 50, numPartitions=2).map_batches(
        lambda t: t.append_column("double", pc.multiply(t.column("value"), 2))).filter(
        lambda t: pc.equal(pc.bit_wise_and(t.column("value"), 1), 0))  # fmt: skip
    q = frame.write_stream.format("memory").query_name("mapped").trigger(available_now=True).start()
    q.await_termination(30)
    t = hr.memory_table("mapped")
    assert t.column("double").to_pylist() == [2 * v for v in range(0, 100, 2)]
    assert q.recent_progress[0]["numInputRows"] == 50
    assert q.recent_progress[0]["sink"]["numOutputRows"] == 25


def test_a_transform_returning_the_wrong_type_is_a_clear_error() -> None:
    q = rate(10, 10).map_batches(lambda t: "oops").write_stream.format("noop").trigger(once=True).start()
    with pytest.raises(StreamingQueryException, match="returned str; it must return a pyarrow.Table"):
        q.await_termination(30)


def test_default_trigger_picks_up_new_data_and_stops_cleanly() -> None:
    stream = memory_stream("live", pa.schema([("x", pa.int64())]))
    q = hr.read_stream.format("memory").option("name", "live").load().write_stream.format("memory").query_name(
        "live-out").start()  # fmt: skip
    try:
        stream.add([{"x": 1}, {"x": 2}])
        q.process_all_available(10)
        stream.add([{"x": 3}])
        q.process_all_available(10)
        assert hr.memory_table("live-out").column("x").to_pylist() == [1, 2, 3]
        assert q.is_active and q.status["message"] == "Waiting for data to arrive"
    finally:
        q.stop()
    assert not q.is_active and q.status["message"] == "Stopped"
    assert q.await_termination(1)


def test_processing_time_spaces_batches() -> None:
    stream = memory_stream("timed", pa.schema([("x", pa.int64())]))
    q = hr.read_stream.format("memory").option("name", "timed").load().write_stream.format("noop").trigger(
        processing_time="300 milliseconds").start()  # fmt: skip
    try:
        deadline = time.monotonic() + 10
        while len(q.recent_progress) < 3 and time.monotonic() < deadline:
            stream.add([{"x": 1}])
            time.sleep(0.05)
    finally:
        q.stop()
    stamps = [p["timestamp"] for p in q.recent_progress]
    assert len(stamps) >= 3
    import datetime as dt

    times = [dt.datetime.fromisoformat(s.replace("Z", "+00:00")) for s in stamps]
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(times)]
    assert all(g >= 0.29 for g in gaps), gaps


def test_union_reads_both_sources_and_checkpoints_each(tmp_path: Path) -> None:
    a = memory_stream("ua", pa.schema([("x", pa.int64())]))
    b = memory_stream("ub", pa.schema([("x", pa.int64())]))
    a.add([{"x": 1}])
    b.add([{"x": 2}])
    frame = hr.read_stream.format("memory").option("name", "ua").load().union(
        hr.read_stream.format("memory").option("name", "ub").load())  # fmt: skip
    q = frame.write_stream.format("memory").query_name("union").option("checkpointLocation", str(tmp_path)).trigger(
        available_now=True).start()  # fmt: skip
    q.await_termination(10)
    assert sorted(hr.memory_table("union").column("x").to_pylist()) == [1, 2]
    entry, _ = Checkpoint(str(tmp_path)).latest()
    assert entry is not None and entry.ends == [{"index": 1}, {"index": 1}]
    assert [s["description"] for s in q.last_progress["sources"]] == ["memory", "memory"]  # type: ignore[index]


def test_progress_has_sparks_shape() -> None:
    q = rate(100, 50).write_stream.format("noop").query_name("shape").trigger(available_now=True).start()
    q.await_termination(10)
    p = q.recent_progress[0]
    assert set(p) >= {"id", "runId", "name", "timestamp", "batchId", "numInputRows", "inputRowsPerSecond",
                      "processedRowsPerSecond", "durationMs", "sources", "sink"}  # fmt: skip
    assert set(p["durationMs"]) >= {"latestOffset", "walCommit", "addBatch", "commitOffsets", "triggerExecution"}
    src = p["sources"][0]
    assert src["startOffset"] == {"rows": 0} and src["endOffset"] == {"rows": 50}
    assert src["metrics"] == {"numRowsOutstanding": 50}
    assert p["sink"]["numOutputRows"] == 50
    assert "batch 0: 50 rows" in hr.QueryProgress.build(
        id="i", run_id="r", name="n", batch_id=0, started=time.time(), durations={"triggerExecution": 0.01},
        previous_trigger=None, sources=[("s", {}, {}, {}, 50, {"numFilesOutstanding": 3})], sink=("k", 50, {}),
    ).line()  # fmt: skip


def test_sink_options_are_validated_before_any_io(tmp_path: Path) -> None:
    chk = tmp_path / "never"
    with pytest.raises(OptionsError) as e:
        rate(10, 10).write_stream.format("files").option("formatt", "parquet").trigger(once=True).start()
    assert "formatt: unknown option (did you mean 'format'?)" in str(e.value)
    assert "checkpointLocation: is required for sink 'files'" in str(e.value)
    assert "path: is required" in str(e.value)
    assert not chk.exists()


def test_source_options_are_validated_at_load() -> None:
    with pytest.raises(OptionsError, match="rowsPerBatch: 0 is less than the minimum 1"):
        hr.read_stream.format("rate-micro-batch").option("rowsPerBatch", 0).load()


def test_unsupported_output_mode_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UnsupportedError, match="does not support output mode 'complete'; it supports: append"):
        rate(10, 10).write_stream.format("files").output_mode("complete").option(
            "checkpointLocation", str(tmp_path)).start(str(tmp_path / "out"))  # fmt: skip


def test_trigger_needs_exactly_one_kind() -> None:
    w = rate(10, 10).write_stream
    with pytest.raises(HeadraceError, match="exactly one of"):
        w.trigger(once=True, available_now=True)
    with pytest.raises(HeadraceError, match="not a duration"):
        w.trigger(processing_time="soon")


def test_delivery_guarantee_follows_the_pair(tmp_path: Path) -> None:
    exactly = rate(10, 10).write_stream.format("files").option("checkpointLocation", str(tmp_path / "a"))._build(
        str(tmp_path / "o"))  # fmt: skip
    assert exactly.delivery_guarantee == "exactly-once"
    at_least = rate(10, 10).write_stream.foreach_batch(lambda t, i: None)._build(None)
    assert at_least.delivery_guarantee == "at-least-once"


def test_foreach_batch_gets_whole_batches_with_ids() -> None:
    seen: list[tuple[int, int]] = []
    q = rate(250, 100).write_stream.foreach_batch(lambda t, i: seen.append((i, t.num_rows))).trigger(
        available_now=True).start()  # fmt: skip
    q.await_termination(10)
    assert seen == [(0, 100), (1, 100), (2, 50)]


def test_real_time_trigger_streams_records_and_reports_latency(tmp_path: Path) -> None:
    chk = tmp_path / "rt"
    q = hr.read_stream.format("rate").option("rowsPerSecond", 200).load().write_stream.format("memory").query_name(
        "rt").option("checkpointLocation", str(chk)).trigger(real_time="1 second").start()  # fmt: skip
    deadline = time.monotonic() + 15
    while len(q.recent_progress) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    q.stop()
    assert q.exception() is None
    progress = q.recent_progress
    assert len(progress) >= 2
    lat = progress[-1]["latencies"]
    assert set(lat) == {"processingLatencyMs", "sourceQueuingLatencyMs", "e2eLatencyMs"}
    assert set(lat["e2eLatencyMs"]) >= {"P50", "P90", "P95", "P99"}
    assert 0 <= lat["e2eLatencyMs"]["P50"] < 500
    got = values("rt")
    assert got == list(range(len(got))) and len(got) >= 150
    entry, committed = Checkpoint(str(chk)).latest()
    assert committed and entry is not None and entry.real_time and entry.ends[0] == {"rows": len(got)}


def test_real_time_needs_a_capable_pair() -> None:
    with pytest.raises(UnsupportedError, match="source 'rate-micro-batch' does not support it"):
        rate(10, 10).write_stream.format("memory").query_name("x").trigger(real_time="1 second").start()
