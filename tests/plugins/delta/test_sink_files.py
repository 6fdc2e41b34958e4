"""The delta sink's direct append path: Parquet data files written into the table's folder during
the batch, committed as add actions with the batch's app transaction."""

from __future__ import annotations

import datetime as dt
import decimal
import json
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable, WriterProperties, write_deltalake

from headrace.testing import run_pipeline
from headrace_delta.sink import StagedBatch, WrittenFiles
from tests.plugins.delta.test_sink import make_sink, put, tbl


def _on_disk(root: str) -> set[str]:
    return {str(p.relative_to(root)) for p in Path(root).rglob("*.parquet")}


def _referenced(root: str) -> set[str]:
    """The data files the log adds (these tests remove none)."""
    return {unquote(a["path"]) for a in _adds(root)}


def _adds(root: str) -> list[dict[str, Any]]:
    out = []
    for f in sorted(Path(root, "_delta_log").glob("*.json")):
        out += [a["add"] for a in map(json.loads, f.read_text().splitlines()) if "add" in a]
    return out


def _stats(root: str) -> list[dict[str, Any]]:
    return [json.loads(a["stats"]) for a in _adds(root)]


def _typed() -> pa.Table:
    return pa.table({
        "i": pa.array([1, None, 3], pa.int64()),
        "i32": pa.array([7, 2, 5], pa.int32()),
        "s": ["a" * 40, "b", None],
        "u": ["€é", "z", "a"],
        "f": [1.5, float("nan"), -2.0],
        "ts": pa.array([dt.datetime(2024, 1, 1, 12, 0, 0, 123000), None, dt.datetime(2023, 5, 5)], pa.timestamp("us", tz="UTC")),
        "ntz": pa.array([dt.datetime(2024, 1, 1, 12, 0, 0, 123000), None, dt.datetime(2023, 5, 5)], pa.timestamp("us")),
        "d": pa.array([dt.date(2024, 1, 1), None, dt.date(2020, 2, 2)]),
        "dec": pa.array([decimal.Decimal("1.25"), None, decimal.Decimal("-4.50")], pa.decimal128(5, 2)),
        "b": [True, False, None],
        "bin": [b"x", None, b"y"],
        "st": pa.array([{"x": 1, "y": "q"}, None, {"x": 5, "y": None}]),
        "l": pa.array([[1, 2], None, []]),
    })  # fmt: skip


def test_stats_are_the_ones_delta_rs_writes(tmp_path: Path) -> None:
    ours, theirs = str(tmp_path / "ours"), str(tmp_path / "theirs")
    sink = make_sink(ours)
    msg = sink.write(0, iter(_typed().to_batches()))
    assert isinstance(msg, WrittenFiles)
    sink.commit(0, [msg])
    write_deltalake(theirs, _typed())
    assert _stats(ours) == _stats(theirs)
    mine, delta_rs = DeltaTable(ours).to_pyarrow_table(), DeltaTable(theirs).to_pyarrow_table()
    assert mine.schema == delta_rs.schema
    assert repr(mine.to_pylist()) == repr(delta_rs.to_pylist())  # (NaN is not equal to itself)
    assert DeltaTable(ours).protocol() == DeltaTable(theirs).protocol()  # timestampNtz on both


def test_a_timestamp_maximum_is_rounded_up_to_the_millisecond(tmp_path: Path) -> None:
    out = str(tmp_path / "out")
    ts = pa.array([dt.datetime(2024, 1, 1, 12, 0, 0, 123456)], pa.timestamp("us", tz="UTC"))
    put(make_sink(out), 0, pa.table({"ts": ts}))
    (stats,) = _stats(out)
    assert stats["minValues"]["ts"] == "2024-01-01T12:00:00.123Z"
    assert stats["maxValues"]["ts"] == "2024-01-01T12:00:00.124Z"  # never below a value in the file


def test_file_skipping_uses_the_stats(tmp_path: Path) -> None:
    out = str(tmp_path / "out")
    sink = make_sink(out)
    for b in range(3):
        put(sink, b, tbl(list(range(b * 100, b * 100 + 100))))
    ds = DeltaTable(out).to_pyarrow_dataset()
    hits = list(ds.get_fragments(filter=pc.field("v") >= 250))
    assert len(hits) == 1
    assert sorted(DeltaTable(out).to_pyarrow_table(filters=[("v", ">=", 250)]).column("v").to_pylist()) == list(range(250, 300))


def test_partitioned_files_with_awkward_values(tmp_path: Path) -> None:
    out = str(tmp_path / "out")
    sink = make_sink(out, partitionBy="p")
    values = ["x y/é%", None, "a=b", "plain", "x y/é%"]
    put(sink, 0, tbl([1, 2, 3, 4, 5], p=values))
    got = sorted(DeltaTable(out).to_pyarrow_table().to_pylist(), key=lambda r: r["v"])
    assert got == [{"v": v, "p": p} for v, p in zip([1, 2, 3, 4, 5], values, strict=True)]
    assert DeltaTable(out).metadata().partition_columns == ["p"]
    skipped = DeltaTable(out).to_pyarrow_table(filters=[("p", "=", "a=b")])
    assert skipped.column("v").to_pylist() == [3]
    assert _on_disk(out) == _referenced(out)


def test_a_replayed_batch_deletes_its_own_files(tmp_path: Path) -> None:
    out = str(tmp_path / "out")
    put(make_sink(out), 0, tbl([1, 2]))
    again = make_sink(out)  # a restart replays batch 0 after its Delta commit
    put(again, 0, tbl([1, 2]))
    assert again.metrics()["numRowsSkipped"] == 2
    assert sorted(DeltaTable(out).to_pyarrow_table().column("v").to_pylist()) == [1, 2]
    assert _on_disk(out) == _referenced(out)


def test_a_schema_change_goes_through_delta_rs(tmp_path: Path) -> None:
    out = str(tmp_path / "out")
    put(make_sink(out), 0, tbl([1]))
    sink = make_sink(out, mergeSchema=True)
    msg = sink.write(1, iter(tbl([2], extra="x").to_batches()))
    assert isinstance(msg, WrittenFiles)
    sink.commit(1, [msg])
    got = sorted(DeltaTable(out).to_pyarrow_table().to_pylist(), key=lambda r: r["v"])
    assert got == [{"v": 1, "extra": None}, {"v": 2, "extra": "x"}]
    assert _on_disk(out) == _referenced(out)  # the files read back were deleted
    put(sink, 2, tbl([3], extra="y"))  # the new schema: direct again
    assert DeltaTable(out).transaction_version("q1") == 2


def test_types_needing_conversion_are_staged(tmp_path: Path) -> None:
    out = str(tmp_path / "out")
    sink = make_sink(out, state=str(tmp_path / "state"))
    ns = pa.table({"t": pa.array([1_000_000_123], pa.timestamp("ns", tz="UTC"))})
    msg = sink.write(0, iter(ns.to_batches()))
    assert isinstance(msg, StagedBatch)
    sink.commit(0, [msg])
    assert DeltaTable(out).to_pyarrow_table().num_rows == 1


def test_a_failed_share_leaves_no_file(tmp_path: Path) -> None:
    out = str(tmp_path / "out")
    put(make_sink(out), 0, tbl([1]))
    before = _on_disk(out)

    def broken() -> Any:
        yield from tbl(list(range(10))).to_batches()
        raise RuntimeError("source failed")

    with pytest.raises(RuntimeError, match="source failed"):
        make_sink(out).write(1, broken())
    assert _on_disk(out) == before


@pytest.mark.slow
@pytest.mark.parametrize("point", ["mid_write", "before_sink_commit", "after_sink_commit"])
def test_a_crash_around_the_commit_leaves_one_copy_of_each_row(tmp_path: Path, point: str) -> None:
    src, out = str(tmp_path / "src"), str(tmp_path / "out")
    for c in range(3):
        write_deltalake(src, pa.table({"v": pa.array(range(c * 50, c * 50 + 50), pa.int64()), "p": [str(c % 2)] * 50}),
                        mode="append", writer_properties=WriterProperties(max_row_group_size=10))  # fmt: skip
    spec = {
        "source": {"format": "delta", "options": {"path": src, "maxFilesPerTrigger": 1}},
        "sink": {"format": "delta", "options": {"path": out, "partitionBy": "p"}},
        "checkpoint": str(tmp_path / "chk"),
        "name": "files-kill",
        "trigger": {"available_now": True},
    }
    r = run_pipeline(spec, crash=f"{point}:1")
    assert r.killed, r.stderr[-800:]
    run_pipeline(spec).check()
    got = DeltaTable(out).to_pyarrow_table().column("v").to_pylist()
    assert not [v for v, n in Counter(got).items() if n > 1]
    assert sorted(got) == list(range(150))
    referenced = _referenced(out)
    assert referenced <= _on_disk(out)
    if point == "before_sink_commit":  # the dead attempt's files: unreferenced, left for VACUUM
        assert len(_on_disk(out) - referenced) >= 1


def test_bounds_python_cannot_hold_leave_the_column_without_stats(tmp_path: Path) -> None:
    out = str(tmp_path / "out")
    after_9999 = 253_402_300_800_000_000 + 86_400_000_000 * 400  # microseconds: the year 10001
    t = pa.table({"ts": pa.array([after_9999, 0], pa.timestamp("us", tz="UTC")), "i": [1, 2]})
    put(make_sink(out), 0, t)
    (stats,) = _stats(out)
    assert stats == {"numRecords": 2, "minValues": {"i": 1}, "maxValues": {"i": 2}, "nullCount": {"i": 0}}
    assert DeltaTable(out).to_pyarrow_table().num_rows == 2
