"""The lakehouse plugins through Spark: cloudFiles and delta as sources, delta and lakebase as sinks.

Each test is skipped (saying what to install) when its plugin is not installed.
"""

from __future__ import annotations

import importlib.util
import json
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.spark._connectors import RECORD_SPEC, calls, committed
from tests.spark._util import run_available_now, values, wait_for

pytestmark = pytest.mark.spark


def need(module: str, dist: str) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{dist} is not installed; pip install -e plugins/{dist.removeprefix('headrace-')}")


def drop(folder: Path, name: str, lo: int, hi: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    t = pa.table({"id": pa.array(range(lo, hi), pa.int64()), "name": [f"n{i}" for i in range(lo, hi)]})
    pq.write_table(t, folder / name)


def delta_ids(path: str) -> list[int]:
    from deltalake import DeltaTable

    return sorted(DeltaTable(path).to_pyarrow_table().column("id").to_pylist())


def test_cloudfiles_to_delta_processing_time_then_restart_available_now(spark: Any, tmp_path: Path) -> None:
    need("headrace_cloudfiles", "headrace-cloudfiles")
    need("headrace_delta", "headrace-delta")
    src, table, chk = tmp_path / "in", str(tmp_path / "table"), str(tmp_path / "chk")
    drop(src, "a.parquet", 0, 10)
    drop(src, "b.parquet", 10, 20)
    # a Databricks option chain, only the format name changed: the file index defaults to a
    # folder under cloudFiles.schemaLocation (no headraceStatePath)
    opts = {"cloudFiles.format": "parquet", "cloudFiles.schemaLocation": str(tmp_path / "schema"),
            "cloudFiles.maxFilesPerTrigger": "1"}  # fmt: skip
    df = spark.readStream.format("headrace.cloudFiles").options(**opts).load(str(src))
    assert [f.name for f in df.schema.fields] == ["id", "name", "_rescued_data"]
    q = (df.writeStream.format("headrace.delta").option("checkpointLocation", chk)
         .trigger(processingTime="300 milliseconds").start(table))  # fmt: skip
    try:
        wait_for(lambda: ((tmp_path / "table" / "_delta_log").exists() and len(delta_ids(table)) >= 20)
                 or q.exception() is not None, 90, "20 rows in the delta table")  # fmt: skip
        drop(src, "c.parquet", 20, 30)  # a file arriving while the query runs
        wait_for(lambda: len(delta_ids(table)) >= 30 or q.exception() is not None, 90, "the new file's rows")
        assert q.exception() is None
    finally:
        q.stop()
    assert delta_ids(table) == list(range(30))
    drop(src, "d.parquet", 30, 40)
    drop(src, "e.parquet", 40, 50)

    q2 = run_available_now(spark, "headrace.cloudFiles", {**opts, "path": str(src)}, "headrace.delta",
                           {"path": table}, chk)  # fmt: skip
    assert q2.id == q.id
    assert delta_ids(table) == list(range(50))
    assert (tmp_path / "schema" / "_headrace_state" / "files.db").exists()
    # maxFilesPerTrigger=1 honoured: one 10-row file per batch. Two batches for d and e, plus one
    # more when stop() interrupted a planned batch of the first query: Spark replays it (its rows
    # reach Delta once, the replayed commit being skipped as already in the log, checked above)
    rows = [p["numInputRows"] for p in q2.recentProgress]
    assert set(rows) == {10} and len(rows) in (2, 3), rows
    # every batch is one Delta commit carrying the query id as its app transaction
    app_ids = set()
    for log_file in (tmp_path / "table" / "_delta_log").glob("*.json"):
        for line in log_file.read_text().splitlines():
            app_ids.update([json.loads(line)["txn"]["appId"]] if '"txn"' in line else [])
    assert app_ids == {q.id}


def test_delta_source_to_headrace_sink_restart(spark: Any, tmp_path: Path) -> None:
    need("headrace_delta", "headrace-delta")
    from deltalake import write_deltalake

    import headrace.spark

    headrace.spark.register(spark, RECORD_SPEC)
    table, out, chk = str(tmp_path / "table"), str(tmp_path / "out"), str(tmp_path / "chk")
    for lo in (0, 10, 20):
        write_deltalake(table, pa.table({"id": pa.array(range(lo, lo + 10), pa.int64())}), mode="append")
    opts = {"path": table, "maxFilesPerTrigger": "1"}  # the delta source keeps no state: no headraceStatePath
    q = run_available_now(spark, "headrace.delta", opts, "headrace.test-record", {"path": out}, chk)
    assert [p["numInputRows"] for p in q.recentProgress] == [10, 10, 10]
    write_deltalake(table, pa.table({"id": pa.array(range(30, 35), pa.int64())}), mode="append")
    run_available_now(spark, "headrace.delta", opts, "headrace.test-record", {"path": out}, chk)
    assert values(committed(out), "id") == list(range(35))
    assert [c["batchId"] for c in calls(out)] == [0, 1, 2, 3]


def test_rate_to_lakebase_exactly_once_across_restart(spark: Any, tmp_path: Path, postgres: Any) -> None:
    need("headrace_lakebase", "headrace-lakebase")
    import psycopg

    table = f"spark_{uuid.uuid4().hex[:10]}"
    chk = str(tmp_path / "chk")
    src = {"rowsPerBatch": 10, "numPartitions": 2, "headraceStatePath": f"{chk}/sources/0/headrace"}
    sink = {"url": postgres.dsn, "dbtable": f"public.{table}", "batchsize": 7}  # plain inserts: no key
    run_available_now(spark, "headrace.rate-micro-batch", {**src, "totalRows": 20}, "headrace.lakebase", sink, chk)
    run_available_now(spark, "headrace.rate-micro-batch", {**src, "totalRows": 45}, "headrace.lakebase", sink, chk)
    with psycopg.connect(postgres.dsn, autocommit=True) as conn:
        got = [r[0] for r in conn.execute(f"SELECT value FROM public.{table} ORDER BY value").fetchall()]
    assert got == list(range(45))
