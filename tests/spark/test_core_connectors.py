"""The core's connectors through Spark: rate-micro-batch -> files, triggers, restarts, errors."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

import headrace.spark
from tests.spark._connectors import RECORD_SPEC, calls, committed
from tests.spark._util import (
    commit_markers,
    files_rows,
    run_available_now,
    total_input_rows,
    values,
    wait_for,
)

pytestmark = pytest.mark.spark

RATE = "headrace.rate-micro-batch"


def rate_opts(tmp: Path, total: int, per_batch: int = 10, partitions: int = 2) -> dict[str, Any]:
    """rate-micro-batch keeps no state of its own: no headraceStatePath, as on Databricks."""
    return {"rowsPerBatch": per_batch, "numPartitions": partitions, "totalRows": total}


def test_register_exposes_every_installed_connector(spark: Any) -> None:
    from headrace.plugins import registry

    names = headrace.spark.register(spark)
    for connector in registry().names():
        assert f"headrace.{connector}" in names
    assert headrace.spark.register(spark, "files") == ["headrace.files"]


def test_available_now_then_restart_no_loss_no_duplicates(spark: Any, tmp_path: Path) -> None:
    out, chk = str(tmp_path / "out"), str(tmp_path / "chk")
    q = run_available_now(spark, RATE, rate_opts(tmp_path, 30), "headrace.files", {"path": out}, chk)
    assert q.exception() is None
    # maxRows (rowsPerBatch) reached Spark as the default read limit: 3 batches of 10 rows
    assert commit_markers(out) == [0, 1, 2]
    assert values(files_rows(out)) == list(range(30))
    assert total_input_rows(q) == 30
    first_id = q.id

    # restart from Spark's checkpoint with more rows available: it continues at row 30
    q2 = run_available_now(spark, RATE, rate_opts(tmp_path, 50), "headrace.files", {"path": out}, chk)
    assert q2.id == first_id
    assert values(files_rows(out)) == list(range(50))
    assert commit_markers(out) == list(range(5))
    assert total_input_rows(q2) == 20


def test_processing_time_trigger(spark: Any, tmp_path: Path) -> None:
    out, chk = str(tmp_path / "out"), str(tmp_path / "chk")
    df = spark.readStream.format(RATE).options(**{k: str(v) for k, v in rate_opts(tmp_path, 40).items()}).load()
    q = (df.writeStream.format("headrace.files").option("path", out)
         .option("checkpointLocation", chk).trigger(processingTime="200 milliseconds").start())  # fmt: skip
    try:
        wait_for(lambda: files_rows(out).num_rows >= 40 or q.exception() is not None, 90, "40 rows in the files sink")
        assert q.exception() is None
        assert q.isActive  # processingTime keeps running once the source has nothing new
    finally:
        q.stop()
    assert values(files_rows(out)) == list(range(40))
    assert commit_markers(out) == [0, 1, 2, 3]


def test_replay_after_failed_sink_commit(spark: Any, tmp_path: Path) -> None:
    """The sink's commit fails in batch 0 (after moving its files into place); Spark fails the
    query without writing commits/0. The restart replays batch 0 with the same id and the
    same rows, and the files sink's deterministic names keep every row exactly once."""
    out, chk = tmp_path / "out", str(tmp_path / "chk")
    out.mkdir()
    (out / "_commits").write_text("not a folder: the commit of batch 0 fails")
    df = spark.readStream.format(RATE).options(**{k: str(v) for k, v in rate_opts(tmp_path, 30).items()}).load()
    q = (df.writeStream.format("headrace.files").option("path", str(out)).option("checkpointLocation", chk)
         .trigger(availableNow=True).start())  # fmt: skip
    with pytest.raises(Exception, match="_commits"):
        q.awaitTermination(90)
    assert os.path.exists(os.path.join(chk, "offsets", "0"))
    assert not os.path.exists(os.path.join(chk, "commits", "0"))
    (out / "_commits").unlink()

    run_available_now(spark, RATE, rate_opts(tmp_path, 30), "headrace.files", {"path": str(out)}, chk)
    assert values(files_rows(str(out))) == list(range(30))
    assert commit_markers(str(out)) == [0, 1, 2]


def test_sink_gets_spark_query_id_and_batch_ids(spark: Any, tmp_path: Path) -> None:
    headrace.spark.register(spark, RECORD_SPEC)
    out, chk = str(tmp_path / "out"), str(tmp_path / "chk")
    q = run_available_now(spark, RATE, rate_opts(tmp_path, 20, partitions=3), "headrace.test-record", {"path": out}, chk)
    q2 = run_available_now(spark, RATE, rate_opts(tmp_path, 30, partitions=3), "headrace.test-record", {"path": out}, chk)
    log = calls(out)
    assert [c["batchId"] for c in log] == [0, 1, 2]
    assert {c["queryId"] for c in log} == {q.id} == {q2.id}
    assert all(c["rows"] == 10 for c in log)
    assert {c["statePath"] for c in log} == {os.path.join(chk, "sinks", "0")}
    assert values(committed(out)) == list(range(30))


def test_source_option_errors_surface_through_spark(spark: Any, tmp_path: Path) -> None:
    from pyspark.errors import AnalysisException

    with pytest.raises(AnalysisException) as e:
        spark.readStream.format(RATE).option("rowsPerBatch", "ten").option("numPartitons", "2").load()
    msg = str(e.value)
    assert "invalid options for source 'rate-micro-batch' (2 problems)" in msg
    assert "rowsPerBatch: 'ten' is not an integer" in msg
    assert "numpartitons: unknown option (did you mean 'numPartitions'?)" in msg  # Spark lower-cases names
    assert "headraceStatePath" not in msg  # a source without state needs none

    with pytest.raises(AnalysisException, match="headraceStatePath: is required under Spark for the rate source"):
        spark.readStream.format("headrace.rate").option("rowsPerSecond", "5").load()  # keeps its start time

    with pytest.raises(AnalysisException, match="cannot be read from"):
        spark.readStream.format("headrace.files").option("headraceStatePath", str(tmp_path)).load()


def test_sink_option_errors_surface_through_spark(spark: Any, tmp_path: Path) -> None:
    from pyspark.errors import StreamingQueryException

    df = spark.readStream.format(RATE).options(**{k: str(v) for k, v in rate_opts(tmp_path, 10).items()}).load()
    q = (df.writeStream.format("headrace.files").option("format", "csv").option("checkpointLocation", str(tmp_path / "c"))
         .trigger(availableNow=True).start())  # fmt: skip
    with pytest.raises(StreamingQueryException) as e:
        q.awaitTermination(60)
    msg = str(e.value)
    assert "invalid options for sink 'files' (2 problems)" in msg
    assert "format: 'csv' is not one of 'parquet', 'arrow'" in msg
    assert "path: is required" in msg
