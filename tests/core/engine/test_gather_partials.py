"""An aggregation's partial stage in a micro-batch runs over the record batches gathered on
the consumer (headrace.engine.plan: COALESCE_ROWS), not once per record batch; the output is
the same whatever the gathering (checked against DuckDB over all input)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pytest

import headrace as hr
from headrace.engine import plan
from headrace.transforms import agg_partial

ROWS, PER_BATCH, PARTITIONS, KEYS = 40_000, 10_000, 4, 97


def run_query(tmp_path: Path, name: str, monkeypatch: pytest.MonkeyPatch) -> tuple[list[int], pa.Table]:
    """rate-micro-batch (4 partitions: 4 record batches a micro-batch) -> key -> count and sum;
    returns the rows each partial call saw, and the output."""
    seen: list[int] = []
    real = agg_partial.PartialAggregation.partial

    def spy(self: Any, table: pa.Table) -> pa.Table:
        seen.append(table.num_rows)
        return real(self, table)

    monkeypatch.setattr(agg_partial.PartialAggregation, "partial", spy)
    q = (hr.read_stream.format("rate-micro-batch")
         .options(rowsPerBatch=PER_BATCH, totalRows=ROWS, numPartitions=PARTITIONS, startTimestamp=0).load()
         .with_column("k", f"value % {KEYS}")
         .group_by("k").agg("count(*) AS n", "sum(value) AS s")
         .write_stream.format("memory").query_name(name).output_mode("complete")
         .option("checkpointLocation", str(tmp_path / name)).trigger(available_now=True).start())  # fmt: skip
    q.await_termination()
    return seen, hr.memory_table(name)


def expected() -> list[tuple[int, int, int]]:
    con = duckdb.connect()
    return sorted(con.sql(f"SELECT value % {KEYS} AS k, count(*), sum(value)::BIGINT FROM range({ROWS}) t(value) "
                          "GROUP BY ALL").fetchall())  # fmt: skip


def last_result(out: pa.Table) -> list[tuple[int, int, int]]:
    final = out.slice(out.num_rows - KEYS)  # complete mode: the last batch's rows are the whole result
    return sorted(zip(*(final.column(c).to_pylist() for c in ("k", "n", "s")), strict=True))


def test_one_partial_per_micro_batch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen, out = run_query(tmp_path, "gather_one", monkeypatch)
    data = [n for n in seen if n]
    assert data == [PER_BATCH] * (ROWS // PER_BATCH)  # 4 record batches of 2,500 rows gathered each time
    assert last_result(out) == expected()


def test_gatherings_are_bounded_and_give_the_same_result(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plan, "COALESCE_ROWS", 5_000)
    seen, out = run_query(tmp_path, "gather_bounded", monkeypatch)
    data = [n for n in seen if n]
    assert data == [5_000] * (2 * ROWS // PER_BATCH)  # two record batches, then the bound is reached
    assert last_result(out) == expected()
