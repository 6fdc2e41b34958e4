"""The delta source on tables written with deltalake: snapshot, appends, changes, limits, data loss."""

from __future__ import annotations

import datetime as dt
import json
import os
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

import headrace as hr
from headrace.errors import DataLossError, SchemaChangedError, UnsupportedError
from headrace.plugins import registry
from headrace.protocols import ReadLimit, SourceContext
from tests.plugins.delta.helpers import append, data_files, delete_with_deletion_vector, rows, run_stream


def make_source(path: str, **options: object):  # type: ignore[no-untyped-def]
    spec = registry().get("delta")
    opts = spec.source_options.parse({"path": path, **options}, connector="delta", role="source")
    return spec.load_source()(opts, SourceContext(query_id="q"))


def cause(e: BaseException) -> BaseException:
    return e.__cause__ if isinstance(e, hr.StreamingQueryException) and e.__cause__ else e


@pytest.fixture
def table(tmp_path: Path) -> str:
    return str(tmp_path / "t")


def test_snapshot_then_only_new_commits(table: str, tmp_path: Path) -> None:
    append(table, [1, 2])
    append(table, [3])
    chk = str(tmp_path / "chk")
    first = run_stream(table, chk)
    assert sorted(rows(first)) == [1, 2, 3]
    append(table, [4, 5])
    append(table, [6])
    second = run_stream(table, chk)
    assert sorted(rows(second)) == [4, 5, 6]
    assert run_stream(table, chk) == []


def test_continuous_stream_picks_up_appends(table: str, tmp_path: Path) -> None:
    append(table, [1])
    got: list[int] = []
    q = (
        hr.read_stream.format("delta").load(table).write_stream
        .foreach_batch(lambda t, _b: got.extend(t.column("v").to_pylist()))
        .option("checkpointLocation", str(tmp_path / "chk")).trigger(processing_time="50 milliseconds").start()
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        append(table, [2])
        append(table, [3])
        while sorted(got) != [1, 2, 3] and time.monotonic() < deadline:
            time.sleep(0.02)
        assert sorted(got) == [1, 2, 3]
    finally:
        q.stop()


def test_partition_values_come_from_the_log(table: str) -> None:
    day = dt.date(2024, 5, 1)
    append(table, [1, 2], p=7, d=pa.array([day, day]), s="a b/c", partition_by=["p", "d", "s"])
    append(table, [3], p=8, d=pa.array([None], pa.date32()), s="x", partition_by=["p", "d", "s"])
    got = pa.concat_tables([t for _, t in run_stream(table)])
    assert got.schema.field("p").type == pa.int64()
    assert got.schema.field("d").type == pa.date32()
    assert sorted(got.to_pylist(), key=lambda r: r["v"]) == [
        {"v": 1, "p": 7, "d": day, "s": "a b/c"},
        {"v": 2, "p": 7, "d": day, "s": "a b/c"},
        {"v": 3, "p": 8, "d": None, "s": "x"},
    ]


@pytest.mark.parametrize(
    ("option", "expected"),
    [({"startingVersion": 1}, [3, 4]), ({"startingVersion": "latest"}, [5]), ({"startingVersion": 0}, [1, 2, 3, 4])],
    ids=["version-1", "latest", "version-0"],
)
def test_starting_version_skips_the_snapshot(table: str, tmp_path: Path, option: dict, expected: list[int]) -> None:
    append(table, [1, 2])
    append(table, [3])
    append(table, [4])
    chk = str(tmp_path / "chk")
    src = make_source(table, **option)
    start = src.initial_offset()
    assert start["isStartingVersion"] is False
    write_deltalake(table, pa.table({"v": pa.array([5], pa.int64())}), mode="append")
    batches = run_stream(table, chk, **option)
    want = [*expected, 5] if option["startingVersion"] != "latest" else []
    # 'latest' resolved when this second query started: version 3 already existed
    assert sorted(rows(batches)) == sorted(want)


def test_starting_options_apply_only_to_a_new_checkpoint(table: str, tmp_path: Path) -> None:
    append(table, [1])
    chk = str(tmp_path / "chk")
    assert rows(run_stream(table, chk)) == [1]
    append(table, [2])
    assert rows(run_stream(table, chk, startingVersion=0)) == [2]


def test_starting_timestamp(table: str) -> None:
    append(table, [1])
    time.sleep(0.05)
    mid = dt.datetime.now(dt.UTC)
    time.sleep(0.05)
    append(table, [2])
    append(table, [3])
    assert sorted(rows(run_stream(table, startingTimestamp=mid.isoformat()))) == [2, 3]
    assert sorted(rows(run_stream(table, startingTimestamp="2000-01-01"))) == [1, 2, 3]
    assert rows(run_stream(table, startingTimestamp="2999-01-01")) == []


def test_starting_version_errors(table: str) -> None:
    for i in range(3):
        append(table, [i])
    with pytest.raises(hr.HeadraceError, match="startingVersion 9 is after the latest version 2"):
        make_source(table, startingVersion=9).initial_offset()
    DeltaTable(table).create_checkpoint()
    os.remove(os.path.join(table, "_delta_log", f"{0:020d}.json"))
    with pytest.raises(DataLossError, match="startingVersion 0 .* no longer in the transaction log .*earliest available: 1"):
        make_source(table, startingVersion=0).initial_offset()
    with pytest.raises(hr.OptionsError, match="startingVersion / startingTimestamp"):
        make_source(table, startingVersion=1, startingTimestamp="2024-01-01")


def _delete(t: str) -> None:
    DeltaTable(t).delete("v = 1")


def _update(t: str) -> None:
    DeltaTable(t).update({"v": "v + 100"}, predicate="v = 1")


def _merge(t: str) -> None:
    src = pa.table({"v": pa.array([1, 9], pa.int64())})
    (DeltaTable(t).merge(src, "t.v = s.v", source_alias="s", target_alias="t")
     .when_matched_delete().when_not_matched_insert_all().execute())  # fmt: skip


def _overwrite(t: str) -> None:
    write_deltalake(t, pa.table({"v": pa.array([7], pa.int64())}), mode="overwrite")


CHANGES = {"DELETE": _delete, "UPDATE": _update, "MERGE": _merge, "WRITE": _overwrite}


@pytest.mark.parametrize("operation", list(CHANGES), ids=[o.lower() for o in CHANGES])
def test_change_commits_fail_the_stream_naming_version_and_options(table: str, tmp_path: Path, operation: str) -> None:
    append(table, [1, 2])
    chk = str(tmp_path / "chk")
    run_stream(table, chk)
    CHANGES[operation](table)
    with pytest.raises(hr.StreamingQueryException) as e:
        run_stream(table, chk)
    msg = str(cause(e.value))
    assert isinstance(cause(e.value), UnsupportedError)
    assert "version 1" in msg and operation in msg
    for opt in ("skipChangeCommits", "ignoreDeletes", "ignoreChanges"):
        assert opt in msg


@pytest.mark.parametrize("operation", list(CHANGES), ids=[o.lower() for o in CHANGES])
def test_skip_change_commits_streams_only_appends(table: str, tmp_path: Path, operation: str) -> None:
    append(table, [1, 2])
    chk = str(tmp_path / "chk")
    run_stream(table, chk, skipChangeCommits=True)
    CHANGES[operation](table)
    append(table, [50])
    assert rows(run_stream(table, chk, skipChangeCommits=True)) == [50]


def test_ignore_deletes_skips_delete_only_commits_but_not_rewrites(table: str, tmp_path: Path) -> None:
    append(table, [1], partition_by=["p"], p="a")
    append(table, [2], partition_by=["p"], p="b")
    chk = str(tmp_path / "chk")
    run_stream(table, chk, ignoreDeletes=True)
    DeltaTable(table).delete("p = 'a'")  # removes a whole partition
    append(table, [3], p="b")
    assert rows(run_stream(table, chk, ignoreDeletes=True)) == [3]
    _update(table.replace("/t", "/t"))  # v=1 is gone: a no-op update adds nothing
    DeltaTable(table).update({"v": "v + 100"}, predicate="v = 2")
    with pytest.raises(hr.StreamingQueryException, match="UPDATE"):
        run_stream(table, chk, ignoreDeletes=True)


def test_ignore_changes_re_emits_rewritten_files(table: str, tmp_path: Path) -> None:
    append(table, [1, 2])  # one file holding both rows
    chk = str(tmp_path / "chk")
    run_stream(table, chk, ignoreChanges=True)
    _update(table)
    DeltaTable(table).delete("v = 2")
    # the update rewrote the file (101, 2); the delete rewrote it again as (101) -- both re-emitted
    assert sorted(rows(run_stream(table, chk, ignoreChanges=True))) == [2, 101, 101]


def test_optimize_never_re_emits(table: str, tmp_path: Path) -> None:
    for i in range(4):
        append(table, [i])
    chk = str(tmp_path / "chk")
    assert sorted(rows(run_stream(table, chk))) == [0, 1, 2, 3]
    DeltaTable(table).optimize.compact()
    append(table, [9])
    assert rows(run_stream(table, chk)) == [9]


@pytest.mark.parametrize(
    ("options", "sizes"),
    [
        ({"maxFilesPerTrigger": 2}, [2, 2, 1]),
        ({"maxFilesPerTrigger": 1000}, [5]),
        ({"maxBytesPerTrigger": 1}, [1, 1, 1, 1, 1]),  # soft: at least one file per batch
        ({"maxBytesPerTrigger": "1m", "maxFilesPerTrigger": 3}, [3, 2]),
    ],
    ids=["files-2", "files-default", "bytes-1", "bytes-and-files"],
)
def test_rate_limits(table: str, options: dict, sizes: list[int]) -> None:
    for i in range(5):
        append(table, [i])
    batches = run_stream(table, **options)
    assert [t.num_rows for _, t in batches] == sizes
    assert rows(batches) == [0, 1, 2, 3, 4]


def test_rate_limits_apply_within_a_version_and_to_later_commits(table: str, tmp_path: Path) -> None:
    write_deltalake(table, pa.table({"v": pa.array(range(6), pa.int64()), "p": list("aabbcc")}), partition_by=["p"])
    chk = str(tmp_path / "chk")
    assert [t.num_rows for _, t in run_stream(table, chk, maxFilesPerTrigger=2)] == [4, 2]
    write_deltalake(table, pa.table({"v": pa.array(range(6, 12), pa.int64()), "p": list("aabbcc")}), mode="append")
    batches = run_stream(table, chk, maxFilesPerTrigger=2)
    assert [t.num_rows for _, t in batches] == [4, 2]
    assert sorted(rows(batches)) == list(range(6, 12))


def test_with_event_time_order_processes_the_snapshot_oldest_first(table: str) -> None:
    def ts(h: int) -> dt.datetime:
        return dt.datetime(2024, 1, 1, h, tzinfo=dt.UTC)

    # written newest first; the middle file overlaps the others
    append(table, [30, 31], ts=pa.array([ts(20), ts(21)], pa.timestamp("us", tz="UTC")))
    append(table, [20, 21], ts=pa.array([ts(5), ts(22)], pa.timestamp("us", tz="UTC")))
    append(table, [10, 11], ts=pa.array([ts(1), ts(2)], pa.timestamp("us", tz="UTC")))
    append(table, [40], ts=pa.array([None], pa.timestamp("us", tz="UTC")))
    batches = run_stream(table, withEventTimeOrder=True, eventTimeColumn="ts", maxFilesPerTrigger=1)
    per_batch = [sorted(t.column("v").to_pylist()) for _, t in batches if t.num_rows]
    # ranges [-inf, 05:00), [05:00, 20:00), [20:00, +inf) + nulls; the overlapping file is split
    assert per_batch == [[10, 11], [20], [21, 30, 31, 40]]


def test_event_time_order_then_appends(table: str, tmp_path: Path) -> None:
    append(table, [2], ts=pa.array([dt.datetime(2024, 1, 2, tzinfo=dt.UTC)], pa.timestamp("us", tz="UTC")))
    append(table, [1], ts=pa.array([dt.datetime(2024, 1, 1, tzinfo=dt.UTC)], pa.timestamp("us", tz="UTC")))
    chk = str(tmp_path / "chk")
    opts: dict[str, Any] = {"withEventTimeOrder": True, "eventTimeColumn": "ts", "maxFilesPerTrigger": 1}
    assert rows(run_stream(table, chk, **opts)) == [1, 2]
    append(table, [3], ts=pa.array([dt.datetime(2023, 1, 1, tzinfo=dt.UTC)], pa.timestamp("us", tz="UTC")))
    assert rows(run_stream(table, chk, **opts)) == [3]


def test_event_time_order_cannot_change_during_the_snapshot(table: str, tmp_path: Path) -> None:
    for i in range(3):
        append(table, [i], ts=pa.array([dt.datetime(2024, 1, 1 + i, tzinfo=dt.UTC)], pa.timestamp("us", tz="UTC")))
    chk = str(tmp_path / "chk")
    run_stream(table, chk, trigger={"once": True}, withEventTimeOrder=True, eventTimeColumn="ts", maxFilesPerTrigger=1)
    src = make_source(table, withEventTimeOrder=True, eventTimeColumn="ts", maxFilesPerTrigger=1)
    mid = src.latest_offset(src.initial_offset(), ReadLimit(max_files=1))
    assert mid["isStartingVersion"] and mid["eventTimeStart"] is not None
    plain = make_source(table, maxFilesPerTrigger=1)
    with pytest.raises(UnsupportedError, match="withEventTimeOrder cannot be turned off"):
        plain.latest_offset(mid, ReadLimit(max_files=1))


def test_vacuumed_files_fail_with_data_loss_or_are_skipped(table: str, tmp_path: Path) -> None:
    append(table, [1])
    append(table, [2])
    _overwrite(table)
    DeltaTable(table).vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    with pytest.raises(hr.StreamingQueryException) as e:
        run_stream(table, str(tmp_path / "a"), startingVersion=0, skipChangeCommits=True)
    assert isinstance(cause(e.value), DataLossError)
    assert "DELTA_FILE_NOT_FOUND_DETAILED" in str(e.value) and "failOnDataLoss" in str(e.value)
    append(table, [8])
    got = run_stream(table, str(tmp_path / "b"), startingVersion=0, skipChangeCommits=True, failOnDataLoss=False)
    assert rows(got) == [8]


def test_missing_log_entries_fail_or_skip(table: str, tmp_path: Path) -> None:
    append(table, [1])
    chk = str(tmp_path / "chk")
    run_stream(table, chk)
    chk2 = str(tmp_path / "chk2")
    run_stream(table, chk2)
    for i in range(2, 5):
        append(table, [i])
    DeltaTable(table).create_checkpoint()
    for v in (1, 2):  # log cleanup removed entries the streams still need
        os.remove(os.path.join(table, "_delta_log", f"{v:020d}.json"))
    with pytest.raises(hr.StreamingQueryException) as e:
        run_stream(table, chk)
    assert isinstance(cause(e.value), DataLossError) and "version 1" in str(e.value)
    assert rows(run_stream(table, chk2, failOnDataLoss=False)) == [4]


def test_schema_change_fails_the_stream_and_restart_uses_the_new_schema(table: str, tmp_path: Path) -> None:
    append(table, [1])
    chk = str(tmp_path / "chk")
    got: list[pa.Table] = []
    q = (
        hr.read_stream.format("delta").load(table).write_stream
        .foreach_batch(lambda t, _b: got.append(t))
        .option("checkpointLocation", chk).trigger(processing_time="20 milliseconds").start()
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        while not got and time.monotonic() < deadline:
            time.sleep(0.02)
        append(table, [2])
        append(table, [3], extra="x", schema_mode="merge")
        with pytest.raises(hr.StreamingQueryException) as e:
            q.await_termination(20)
    finally:
        q.stop()
    assert isinstance(cause(e.value), SchemaChangedError)
    assert "version 2" in str(e.value) and "extra" in str(e.value)
    assert sorted(v for t in got for v in t.column("v").to_pylist()) == [1, 2]
    after = run_stream(table, chk)
    assert [t.to_pylist() for _, t in after] == [[{"v": 3, "extra": "x"}]]


def test_column_mapping_is_honoured(table: str) -> None:
    DeltaTable.create(table, pa.schema([("a", pa.int64()), ("p", pa.int32())]), partition_by=["p"],
                      configuration={"delta.columnMapping.mode": "name"})  # fmt: skip
    write_deltalake(table, pa.table({"a": pa.array([1, 2], pa.int64()), "p": pa.array([1, 2], pa.int32())}), mode="append")
    src_rows = sorted(pa.concat_tables([t for _, t in run_stream(table)]).to_pylist(), key=lambda r: r["a"])
    assert src_rows == [{"a": 1, "p": 1}, {"a": 2, "p": 2}]
    chk_rows = run_stream(table, startingVersion=1)
    assert sorted(rows(chk_rows, "a")) == [1, 2]


def test_unsupported_reader_feature_fails_clearly(table: str) -> None:
    append(table, [1])
    log = os.path.join(table, "_delta_log", f"{1:020d}.json")
    with open(log, "w") as f:
        f.write(json.dumps({"commitInfo": {"timestamp": 1, "operation": "UPGRADE"}}) + "\n")
        f.write(json.dumps({"protocol": {"minReaderVersion": 3, "minWriterVersion": 7,
                                         "readerFeatures": ["someFutureFeature"], "writerFeatures": []}}) + "\n")  # fmt: skip
    with pytest.raises(Exception, match="someFutureFeature") as e:
        src = make_source(table)  # delta-rs may already refuse to load it
        src.latest_offset(src.initial_offset(), ReadLimit.all_available())
    assert "headrace-delta cannot honour" in str(e.value) or "not yet supported" in str(e.value) or "someFutureFeature" in str(e.value)


def test_change_data_feed(table: str, tmp_path: Path) -> None:
    append(table, [1, 2, 3], configuration={"delta.enableChangeDataFeed": "true"})
    chk = str(tmp_path / "chk")
    first = pa.concat_tables([t for _, t in run_stream(table, chk, readChangeFeed=True)])
    assert first.schema.names == ["v", "_change_type", "_commit_version", "_commit_timestamp"]
    assert first.schema.field("_commit_timestamp").type == pa.timestamp("us", tz="UTC")
    assert sorted((r["v"], r["_change_type"], r["_commit_version"]) for r in first.to_pylist()) == [
        (1, "insert", 0), (2, "insert", 0), (3, "insert", 0)
    ]  # fmt: skip
    _update(table)
    DeltaTable(table).delete("v = 2")
    append(table, [4])
    later = pa.concat_tables([t for _, t in run_stream(table, chk, readChangeFeed=True)])
    assert sorted((r["v"], r["_change_type"], r["_commit_version"]) for r in later.to_pylist()) == sorted([
        (1, "update_preimage", 1), (101, "update_postimage", 1), (2, "delete", 2), (4, "insert", 3)
    ])  # fmt: skip
    assert all(r["_commit_timestamp"] is not None for r in later.to_pylist())


def test_backlog_metrics(table: str) -> None:
    for i in range(4):
        append(table, [i])
    src = make_source(table, startingVersion=0)
    start = src.initial_offset()
    end = src.latest_offset(start, ReadLimit(max_files=1))
    m = src.metrics(end)
    assert m["numFilesOutstanding"] == 3
    assert m["numBytesOutstanding"] > 0
    assert m["backlogEndOffset"]["reservoirVersion"] == 4
    append(table, [9])
    end2 = src.latest_offset(end, ReadLimit(max_files=1))
    assert src.metrics(end2)["numNewListedFiles"] == 1
    assert src.metrics(end2)["numFilesOutstanding"] == 3


def test_log_is_read_incrementally(table: str) -> None:
    for i in range(30):
        append(table, [i])
    src = make_source(table, startingVersion="latest")
    start = src.initial_offset()
    DeltaTable(table).create_checkpoint()
    for v in range(0, 29):  # the stream never needs the history before its start
        os.remove(os.path.join(table, "_delta_log", f"{v:020d}.json"))
    append(table, [100])
    end = src.latest_offset(start, ReadLimit.all_available())
    assert list(src._commits) == [30]
    assert [b.to_pylist() for p in src.partitions(start, end) for b in src.read(p)] == [[{"v": 100}]]


def test_checkpoint_inside_the_source_table_is_ignored(table: str) -> None:
    append(table, [1])
    chk = os.path.join(table, "_checkpoints", "q")
    assert rows(run_stream(table, chk)) == [1]
    append(table, [2])
    assert rows(run_stream(table, chk)) == [2]
    assert all("_checkpoints" not in f for f in data_files(table))


def test_missing_table_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(hr.HeadraceError, match="no Delta table at"):
        make_source(str(tmp_path / "nope"))


def test_deletion_vectors_are_honoured(table: str, tmp_path: Path) -> None:
    append(table, list(range(10)))
    chk = str(tmp_path / "chk")
    assert rows(run_stream(table, chk, ignoreChanges=True)) == list(range(10))
    version = delete_with_deletion_vector(table, [1, 3, 5])
    # a new stream's snapshot leaves the deleted rows out
    assert sorted(rows(run_stream(table))) == [0, 2, 4, 6, 7, 8, 9]
    # the running stream sees a change commit: ignoreChanges re-emits the file, minus deleted rows
    assert sorted(rows(run_stream(table, chk, ignoreChanges=True))) == [0, 2, 4, 6, 7, 8, 9]
    with pytest.raises(hr.StreamingQueryException, match=f"version {version} \\(DELETE\\)"):
        run_stream(table, startingVersion=version)
