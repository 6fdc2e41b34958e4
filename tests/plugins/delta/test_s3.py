"""The delta source and sink on s3:// (moto server), storage options passed through."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

import headrace as hr


def test_s3_source_and_sink(s3: Any, tmp_path: Path) -> None:
    bucket = s3.create_bucket(f"delta-{uuid.uuid4().hex[:8]}")
    storage = s3.delta_storage_options()
    src, out = f"s3://{bucket}/src", f"s3://{bucket}/out"
    for i in range(3):
        write_deltalake(src, pa.table({"v": pa.array([i], pa.int64()), "p": [str(i % 2)]}), mode="append",
                        partition_by=["p"], storage_options=storage)  # fmt: skip
    opts = {f"storage.{k}": v for k, v in storage.items()}
    chk = str(tmp_path / "chk")

    def run() -> hr.StreamingQuery:
        q = (hr.read_stream.format("delta").options(opts).option("maxFilesPerTrigger", 2).load(src)
             .write_stream.format("delta").options(opts).option("checkpointLocation", chk)
             .trigger(available_now=True).start(out))  # fmt: skip
        q.await_termination(60)
        return q

    q = run()
    assert "testing" not in repr(q.last_progress)  # no credentials in progress reports
    write_deltalake(src, pa.table({"v": pa.array([3], pa.int64()), "p": ["1"]}), mode="append", storage_options=storage)
    run()
    got = DeltaTable(out, storage_options=storage).to_pyarrow_table()
    assert sorted(got.to_pylist(), key=lambda r: r["v"]) == [{"v": i, "p": str(i % 2)} for i in range(4)]


def test_s3_vacuumed_file_is_data_loss(s3: Any, tmp_path: Path) -> None:
    bucket = s3.create_bucket(f"delta-{uuid.uuid4().hex[:8]}")
    storage = s3.delta_storage_options()
    src = f"s3://{bucket}/src"
    write_deltalake(src, pa.table({"v": pa.array([1], pa.int64())}), storage_options=storage)
    write_deltalake(src, pa.table({"v": pa.array([2], pa.int64())}), mode="overwrite", storage_options=storage)
    DeltaTable(src, storage_options=storage).vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    opts = {f"storage.{k}": v for k, v in storage.items()}
    q = (hr.read_stream.format("delta").options(opts).option("startingVersion", 0).option("skipChangeCommits", True)
         .load(src).write_stream.format("memory").query_name(f"s3loss{uuid.uuid4().hex[:6]}")
         .trigger(available_now=True).start())  # fmt: skip
    try:
        q.await_termination(60)
        raise AssertionError("the stream should have failed")
    except hr.StreamingQueryException as e:
        assert "DELTA_FILE_NOT_FOUND_DETAILED" in str(e)
        assert "testing" not in str(e)
