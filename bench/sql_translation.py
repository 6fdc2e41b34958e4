"""The cost of Spark SQL's translation to DuckDB, against one 100k-row select/where batch.

Spark SQL (the default dialect) is parsed and translated by sqlglot when a step is defined, and
again once per input schema when the query starts; no batch pays for it. This measures:

1. the translation of a typical select/where pair (``to_duckdb`` with the schema, uncached):
   the one-time cost, paid at definition and start;
2. one 100k-row batch through the same two steps (``select_expr`` + ``where``, fused into one
   DuckDB query), with Spark SQL and with DuckDB's dialect (the same query written for DuckDB);
3. the translation's share of a batch (goal: below 1%), were it paid per batch; and the
   cached lookup a started step does per batch (none: the query is kept on the step).

    .venv/bin/python bench/sql_translation.py [--rows 100000] [--rounds 20]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import pyarrow as pa

SPARK_SELECT = [
    "id", "amount", "user", "CAST(amount AS BIGINT) AS whole", "length(user) AS n", "upper(user) AS u",
    "CASE WHEN amount > 50 THEN 'high' ELSE 'low' END AS band", "unix_timestamp(ts) AS secs",
]  # fmt: skip
SPARK_WHERE = "amount > 10 AND user IS NOT NULL"
DUCKDB_SELECT = [
    "id", "amount", "user", "CAST(trunc(amount) AS BIGINT) AS whole", "CAST(length(user) AS INT) AS n", "upper(user) AS u",
    "CASE WHEN amount > 50 THEN 'high' ELSE 'low' END AS band", "CAST(floor(epoch(ts)) AS BIGINT) AS secs",
]  # fmt: skip


def make_batch(rows: int) -> pa.Table:
    rng = np.random.default_rng(0)
    users = np.array([f"user-{i}" for i in range(1000)], dtype=object)
    ids = np.arange(rows, dtype=np.int64)
    return pa.table({
        "id": ids,
        "user": pa.array(users[rng.integers(0, 1000, rows)], pa.string()),
        "amount": rng.random(rows) * 100,
        "ts": pa.array(ids * 1000, pa.timestamp("us", tz="UTC")),
    })  # fmt: skip


def translation_ms(schema: pa.Schema, rounds: int) -> float:
    """Median ms to parse and translate the select and the where, caches cleared each round."""
    from headrace.transforms import spark_sql
    from headrace.transforms.stateless import select_expr_query, where_query

    times = []
    for _ in range(rounds):
        spark_sql._PARSED.clear()
        spark_sql._OUT.clear()
        t0 = time.perf_counter()
        for query in (select_expr_query(SPARK_SELECT), where_query(SPARK_WHERE)):
            spark_sql.to_duckdb(query, what="bench")
            spark_sql.to_duckdb(query, what="bench", schema=schema)
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def batch_ms(batch: pa.Table, dialect: str, rounds: int, calls: list[int] | None = None) -> float:
    """Median ms of one batch through select_expr + where (fused), steps defined once; with
    ``calls``, the number of translations (``to_duckdb`` calls, cached or not) the timed
    batches made is appended to it."""
    import headrace as hr  # noqa: F401
    from headrace.engine.plan import PlanRunner
    from headrace.transforms.operator import BatchInfo
    from headrace.transforms.spark_sql import sql_dialect
    from headrace.transforms.static import StaticFrame

    select, where = (SPARK_SELECT, SPARK_WHERE) if dialect == "spark" else (DUCKDB_SELECT, SPARK_WHERE)
    with sql_dialect(dialect):
        frame = StaticFrame.from_arrow(batch).select_expr(*select).where(where)
    runner = PlanRunner(frame._steps, batch.schema)
    runner.begin(BatchInfo(0))
    runner.apply_prefix(batch)  # warm: DuckDB's first query, the plan's caches
    from headrace.transforms import spark_sql

    counted = [0]
    original = spark_sql.to_duckdb

    def counting(*a: object, **kw: object) -> str:
        counted[0] += 1
        return original(*a, **kw)  # type: ignore[arg-type]

    spark_sql.to_duckdb = counting
    times = []
    try:
        for i in range(rounds):
            runner.begin(BatchInfo(i + 1))
            t0 = time.perf_counter()
            out = runner.apply_prefix(batch)
            times.append((time.perf_counter() - t0) * 1000)
            assert out is not None and out.num_rows > 0
    finally:
        spark_sql.to_duckdb = original
    if calls is not None:
        calls.append(counted[0])
    return statistics.median(times)


def per_batch_lookup_us(schema: pa.Schema, rounds: int = 10_000) -> float:
    """Median-of-rounds microseconds of what a started step does per batch for its query: the
    cached ``query_for(schema)`` of a Spark SQL step."""
    from headrace.transforms.stateless import SqlOperator, select_expr_query

    op = SqlOperator(select_expr_query(SPARK_SELECT), what="bench")
    op.query_for(schema)
    t0 = time.perf_counter()
    for _ in range(rounds):
        op.query_for(schema)
    return (time.perf_counter() - t0) / rounds * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=20)
    args = ap.parse_args()
    batch = make_batch(args.rows)
    import os

    load = os.getloadavg()[0]
    translate = translation_ms(batch.schema, args.rounds)
    calls: list[int] = []
    spark = batch_ms(batch, "spark", args.rounds, calls)
    duck = batch_ms(batch, "duckdb", args.rounds)
    lookup_us = per_batch_lookup_us(batch.schema)
    print(
        f"translation (select + where, at definition and once per schema): {translate:.2f} ms, once per query"
    )
    print(f"{args.rows}-row batch, Spark SQL: {spark:.2f} ms; the same query in DuckDB's dialect: {duck:.2f} ms "
          f"(ratio {duck / spark:.2f})")  # fmt: skip
    share = 100 * translate / spark
    per_batch = 100 * (lookup_us / 1000) / spark
    print(f"translations during {args.rounds} Spark SQL batches: {calls[0]}; per batch a step looks its query up "
          f"({lookup_us:.2f} us): {per_batch:.4f}% of the batch (goal below 1%: {'met' if per_batch < 1 else 'NOT met'})")
    print(f"translation as a share of one batch, were it paid per batch: {share:.1f}% (it is paid once per query); "
          f"load average {load:.1f} on {os.cpu_count()} cores")  # fmt: skip


if __name__ == "__main__":
    main()
