"""The delta sink: modes, options, exactly-once app transactions, the merge helper."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

import headrace as hr
import headrace_delta
from headrace.plugins import registry
from headrace.protocols import SinkContext
from tests.plugins.delta.helpers import append, read_values, run_stream


def make_sink(path: str, *, mode: str = "append", query_id: str = "q1", state: str | None = None, **options: Any):  # type: ignore[no-untyped-def]
    spec = registry().get("delta")
    opts = spec.sink_options.parse({"path": path, **options}, connector="delta", role="sink")
    return spec.load_sink()(opts, SinkContext(query_id=query_id, output_mode=mode, state_path=state))


def put(sink: Any, batch_id: int, table: pa.Table) -> None:
    sink.commit(batch_id, [sink.write(batch_id, iter(table.to_batches()))])


def tbl(values: list[int], **cols: Any) -> pa.Table:
    return pa.table({"v": pa.array(values, pa.int64()), **{k: v if isinstance(v, list) else [v] * len(values) for k, v in cols.items()}})


def test_append_stream_into_a_fresh_table_with_checkpoint_inside(tmp_path: Path) -> None:
    out = str(tmp_path / "out")
    q = (
        hr.read_stream.format("rate-micro-batch").option("rowsPerBatch", 50).option("totalRows", 200).load()
        .write_stream.format("delta").option("checkpointLocation", os.path.join(out, "_checkpoints", "demo"))
        .trigger(available_now=True).start(out)
    )  # fmt: skip
    q.await_termination(60)
    assert read_values(out, "value") == list(range(200))
    dt = DeltaTable(out)
    txns = [json.loads(line) for name in sorted(os.listdir(os.path.join(out, "_delta_log"))) if name.endswith(".json")
            for line in Path(out, "_delta_log", name).read_text().splitlines() if '"txn"' in line]  # fmt: skip
    assert [t["txn"]["appId"] for t in txns] == [q.id] * 4
    assert [t["txn"]["version"] for t in txns] == [0, 1, 2, 3]
    dt.vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    assert os.path.isdir(os.path.join(out, "_checkpoints", "demo", "offsets"))


def test_replayed_batch_is_skipped(tmp_path: Path) -> None:
    out = str(tmp_path / "out")
    put(make_sink(out), 0, tbl([1, 2]))
    put(make_sink(out), 0, tbl([1, 2]))  # replay after a crash
    put(make_sink(out), 1, tbl([3]))
    put(make_sink(out, query_id="new-checkpoint"), 0, tbl([4]))  # a new checkpoint is a new app id
    assert read_values(out) == [1, 2, 3, 4]


def test_txn_app_id_and_version(tmp_path: Path) -> None:
    out = str(tmp_path / "out")
    put(make_sink(out, txnAppId="job", txnVersion=5), 0, tbl([1]))
    put(make_sink(out, txnAppId="job", txnVersion=5), 1, tbl([2]))  # same txn: skipped
    put(make_sink(out, txnAppId="job", txnVersion=6), 2, tbl([3]))
    put(make_sink(out, txnAppId="job", txnVersion=4), 3, tbl([4]))  # older: already covered
    assert read_values(out) == [1, 3]
    assert DeltaTable(out).transaction_version("job") == 6
    with pytest.raises(hr.OptionsError, match="txnAppId / txnVersion: go together"):
        make_sink(out, txnAppId="job")


def test_complete_mode_replaces_the_table(tmp_path: Path) -> None:
    out = str(tmp_path / "out")
    put(make_sink(out, mode="complete"), 0, tbl([1, 2]))
    put(make_sink(out, mode="complete"), 1, tbl([3]))
    put(make_sink(out, mode="complete"), 1, tbl([3]))
    assert read_values(out) == [3]


def test_partition_by(tmp_path: Path) -> None:
    out = str(tmp_path / "out")
    put(make_sink(out, partitionBy="p"), 0, tbl([1, 2], p=["a", "b"]))
    assert DeltaTable(out).metadata().partition_columns == ["p"]
    assert sorted(os.listdir(out)) == ["_delta_log", "p=a", "p=b"]


def test_merge_schema_and_its_absence(tmp_path: Path) -> None:
    out = str(tmp_path / "out")
    put(make_sink(out), 0, tbl([1]))
    with pytest.raises(hr.HeadraceError, match="batch 1 to Delta table"):
        put(make_sink(out), 1, tbl([2], extra="x"))
    put(make_sink(out, mergeSchema=True), 1, tbl([2], extra="x"))
    got = sorted(DeltaTable(out).to_pyarrow_table().to_pylist(), key=lambda r: r["v"])
    assert got == [{"v": 1, "extra": None}, {"v": 2, "extra": "x"}]


def test_overwrite_schema_needs_complete_mode(tmp_path: Path) -> None:
    out = str(tmp_path / "out")
    put(make_sink(out, mode="complete"), 0, tbl([1]))
    put(make_sink(out, mode="complete", overwriteSchema=True), 1, pa.table({"w": ["new"]}))
    assert DeltaTable(out).to_pyarrow_table().to_pylist() == [{"w": "new"}]
    with pytest.raises(hr.UnsupportedError, match="overwriteSchema=true .* 'complete'"):
        make_sink(out, overwriteSchema=True)


def test_user_metadata(tmp_path: Path) -> None:
    out = str(tmp_path / "out")
    put(make_sink(out, userMetadata="nightly load"), 0, tbl([1]))
    assert DeltaTable(out).history(1)[0]["userMetadata"] == "nightly load"


def _parquet_files(root: str) -> set[str]:
    return {str(p.relative_to(root)) for p in Path(root).rglob("*.parquet")}


def test_aborted_batch_leaves_nothing_written(tmp_path: Path) -> None:
    out = str(tmp_path / "out")
    state = str(tmp_path / "state")
    sink = make_sink(out, state=state)
    put(sink, 0, tbl([1]))
    committed = _parquet_files(out)
    msg = sink.write(1, iter(tbl([2]).to_batches()))
    assert _parquet_files(out) > committed  # written into the table's folder, not committed
    assert read_values(out) == [1]
    sink.abort(1, [msg])
    assert _parquet_files(out) == committed
    assert read_values(out) == [1]


def test_aborted_complete_batch_leaves_nothing_staged(tmp_path: Path) -> None:
    out = str(tmp_path / "out")
    state = str(tmp_path / "state")
    sink = make_sink(out, state=state, mode="complete")
    put(sink, 0, tbl([1]))
    msg = sink.write(1, iter(tbl([2]).to_batches()))
    assert os.listdir(os.path.join(state, "staging"))
    sink.abort(1, [msg])
    assert os.listdir(os.path.join(state, "staging")) == []
    assert read_values(out) == [1]


def test_merge_helper_upserts_idempotently(tmp_path: Path) -> None:
    out = str(tmp_path / "out")
    assert headrace_delta.merge(out, tbl([1, 2], name=["a", "b"]), keys=["v"], batch_id=0, app_id="up")
    batch = tbl([2, 3, 3], name=["B", "c", "C"])  # duplicate key 3: the last row wins
    assert headrace_delta.merge(out, batch, keys=["v"], batch_id=1, app_id="up")
    assert not headrace_delta.merge(out, tbl([2], name=["stale"]), keys=["v"], batch_id=1, app_id="up")
    got = sorted(DeltaTable(out).to_pyarrow_table().to_pylist(), key=lambda r: r["v"])
    assert got == [{"v": 1, "name": "a"}, {"v": 2, "name": "B"}, {"v": 3, "name": "C"}]
    with pytest.raises(hr.HeadraceError, match="merge keys"):
        headrace_delta.merge(out, batch, keys=["nope"], batch_id=2, app_id="up")


def test_merge_from_foreach_batch(tmp_path: Path) -> None:
    src = str(tmp_path / "src")
    out = str(tmp_path / "out")
    append(src, [1, 2], name=["a", "b"])
    append(src, [2], name=["B"])

    def upsert(table: pa.Table, batch_id: int) -> None:
        headrace_delta.merge(out, table, keys=["v"], batch_id=batch_id, app_id="users")

    q = (hr.read_stream.format("delta").option("maxFilesPerTrigger", 1).load(src).write_stream.foreach_batch(upsert)
         .option("checkpointLocation", str(tmp_path / "chk")).trigger(available_now=True).start())  # fmt: skip
    q.await_termination(60)
    assert sorted(DeltaTable(out).to_pyarrow_table().to_pylist(), key=lambda r: r["v"]) == [
        {"v": 1, "name": "a"}, {"v": 2, "name": "B"}
    ]  # fmt: skip


def test_delta_to_delta(tmp_path: Path) -> None:
    src, out = str(tmp_path / "src"), str(tmp_path / "out")
    for i in range(3):
        append(src, [i], p=str(i % 2), partition_by=["p"])
    q = (hr.read_stream.format("delta").option("maxFilesPerTrigger", 1).load(src).write_stream.format("delta")
         .option("checkpointLocation", str(tmp_path / "chk")).partition_by("p").trigger(available_now=True).start(out))  # fmt: skip
    q.await_termination(60)
    assert read_values(out) == [0, 1, 2]
    assert DeltaTable(out).metadata().partition_columns == ["p"]
    assert rows_of(run_stream(out)) == [0, 1, 2]


def rows_of(batches: list[tuple[int, pa.Table]]) -> list[int]:
    return sorted(v for _, t in batches if t.num_rows for v in t.column("v").to_pylist())


def test_checkpoint_reset_with_a_rate_source_loses_nothing(tmp_path: Path) -> None:
    """Reset to an earlier batch, rate -> delta: the rolled-back batches replay
    their recorded ranges, the sink skips them (reported as skipped, not output), no row lost."""
    from headrace.cli import main
    from headrace.testing import wait_for

    chk, table = str(tmp_path / "chk"), str(tmp_path / "t")

    def start(**trigger: Any) -> hr.StreamingQuery:
        return (hr.read_stream.format("rate").option("rowsPerSecond", 2000).load()
                .write_stream.format("delta").option("checkpointLocation", chk).option("checkpointFsync", False)
                .trigger(**trigger).start(table))  # fmt: skip

    q = start(processing_time="50 milliseconds")
    wait_for(lambda: len([p for p in q.recent_progress if p["numInputRows"]]) >= 4, timeout=60, what="4 batches")
    q.stop()
    assert q.exception() is None and q.last_progress is not None
    last = q.last_progress["batchId"]
    assert main(["checkpoint", "reset", chk, "--to-batch", "1"]) == 0
    again = start(available_now=True)
    again.await_termination(60)
    values = read_values(table, "value")
    assert again.last_progress is not None
    assert values == list(range(again.last_progress["sources"][0]["endOffset"]["rows"]))
    for p in again.recent_progress:
        if p["batchId"] <= last:
            assert p["sink"]["numOutputRows"] == 0 and p["sink"]["metrics"]["numRowsSkipped"] == p["numInputRows"]
        else:
            assert p["sink"]["numOutputRows"] == p["numInputRows"] and p["sink"]["metrics"]["numRowsSkipped"] == 0
