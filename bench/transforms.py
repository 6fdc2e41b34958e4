"""Stream transforms: headrace's plan vs DuckDB running the same SQL on the same batches.

1. Stateless ``select_expr`` + ``where`` + ``with_column`` (one fused DuckDB query per batch),
   memory stream -> plan -> noop through the engine, vs a loop calling DuckDB on each batch
   with the equivalent single query (goal: ratio >= 0.8).
2. Stream-static join (``stream.join(static, on="k")``) of each batch with a static table,
   through the engine, vs DuckDB joining each batch with the same table (goal >= 0.8); and the
   same with small batches (100 rows: real-time chunks), where headrace probes a prebuilt key
   index instead of letting DuckDB scan the static side per batch.
3. The stateless query on 100-row chunks (real-time mode): headrace keeps ``batch`` registered
   in its DuckDB cursor and swaps the table, instead of registering each chunk.

Both sides get the same pyarrow tables, already in memory; rows/s are medians of interleaved
rounds. Then ``bench/transforms_stateful.py``'s ``main()`` (aggregations, state) if present.

    .venv/bin/python bench/transforms.py [--batches 20] [--rows 100000] [--static 100000] [--full]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import TypeVar

import duckdb
import numpy as np
import pyarrow as pa

import headrace as hr
from headrace.testing import memory_stream

_Frame = TypeVar("_Frame", hr.StreamFrame, hr.StaticFrame)


def make_batches(batches: int, rows: int, keys: int, seed: int = 0) -> list[pa.Table]:
    rng = np.random.default_rng(seed)
    out = []
    users = np.array([f"user-{i}" for i in range(1000)], dtype=object)
    for b in range(batches):
        ids = np.arange(b * rows, (b + 1) * rows, dtype=np.int64)
        out.append(pa.table({
            "id": ids,
            "k": rng.integers(0, keys, rows),
            "user": pa.array(users[rng.integers(0, 1000, rows)], pa.string()),
            "amount": rng.random(rows) * 100,
            "ts": pa.array(ids * 1000, pa.timestamp("ms", tz="UTC")),
        }).combine_chunks())  # fmt: skip
    return out


def make_static(n: int) -> pa.Table:
    rng = np.random.default_rng(1)
    return pa.table({"k": np.arange(n, dtype=np.int64), "name": pa.array([f"name-{i}" for i in range(n)]),
                     "weight": rng.random(n)})  # fmt: skip


def through_engine(tables: list[pa.Table], plan: object) -> float:
    """rows/s of memory stream -> plan -> noop, everything in one available-now run."""
    name = f"bench-{uuid.uuid4().hex[:8]}"
    stream = memory_stream(name, tables[0].schema)
    for t in tables:
        stream.add(t)
    frame = plan(hr.read_stream.format("memory").option("name", name).load())  # type: ignore[operator]
    rows = sum(t.num_rows for t in tables)
    t0 = time.perf_counter()
    q = frame.write_stream.format("noop").trigger(available_now=True).start()
    q.await_termination()
    elapsed = time.perf_counter() - t0
    assert q.last_progress is not None and q.last_progress["numInputRows"] == rows
    return rows / elapsed


def duckdb_loop(tables: list[pa.Table], query: str, static: pa.Table | None = None) -> float:
    """rows/s of DuckDB running ``query`` on each table (registered as ``batch``)."""
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    rows = sum(t.num_rows for t in tables)
    t0 = time.perf_counter()
    if static is not None:
        con.register("static", static)
    for t in tables:
        con.register("batch", t)
        con.sql(query).to_arrow_table()
        con.unregister("batch")
    return rows / (time.perf_counter() - t0)


STATELESS_QUERY = ("SELECT id, upper(user) AS user, amount * 1.1 AS amount, ts, amount * 1.1 > 55 AS big FROM batch "
                   "WHERE amount * 1.1 > 11 AND upper(user) <> 'USER-7'")  # fmt: skip


def stateless_plan(s: _Frame) -> _Frame:
    return (s.select_expr("id", "upper(user) AS user", "amount * 1.1 AS amount", "ts")
            .where("amount > 11 AND user <> 'USER-7'").with_column("big", "amount > 55"))  # fmt: skip


JOIN_QUERY = ("SELECT batch.k, batch.id, batch.user, batch.amount, batch.ts, static.name, static.weight "
              "FROM batch JOIN static ON batch.k = static.k")  # fmt: skip


def small_joins(tables: list[pa.Table], static: pa.Table) -> tuple[float, float]:
    """ms per 100-row chunk: headrace's join operator (index path) vs DuckDB per chunk."""
    from headrace.transforms.join import StreamStaticJoinOperator
    from headrace.transforms.operator import BatchInfo, OperatorContext

    op = StreamStaticJoinOperator(static, on="k")
    op.open(OperatorContext(index=0))
    info = BatchInfo(0, real_time=True)
    op.process(tables[0], info)  # builds the index once (part of opening, in practice)
    t0 = time.perf_counter()
    for t in tables:
        op.process(t, info)
    ours = (time.perf_counter() - t0) / len(tables) * 1000
    con = duckdb.connect()
    con.register("static", static)
    t0 = time.perf_counter()
    for t in tables:
        con.register("batch", t)
        con.sql(JOIN_QUERY).to_arrow_table()
    base = (time.perf_counter() - t0) / len(tables) * 1000
    op.close()
    return ours, base


def small_sql(tables: list[pa.Table]) -> tuple[float, float]:
    """ms per 100-row chunk of the stateless query: headrace's fused SQL step (as run per chunk
    in real-time mode) vs DuckDB registering each chunk and running the same query."""
    from headrace.engine.plan import PlanRunner
    from headrace.transforms.operator import BatchInfo

    runner = PlanRunner(stateless_plan(hr.StaticFrame.from_arrow(tables[0]))._steps, tables[0].schema)
    runner.begin(BatchInfo(0, real_time=True))
    runner.apply_prefix(tables[0])
    t0 = time.perf_counter()
    for t in tables:
        runner.apply_prefix(t)
    ours = (time.perf_counter() - t0) / len(tables) * 1000
    con = duckdb.connect()
    t0 = time.perf_counter()
    for t in tables:
        con.register("batch", t)
        con.sql(STATELESS_QUERY).to_arrow_table()
        con.unregister("batch")
    return ours, (time.perf_counter() - t0) / len(tables) * 1000


def median_pair(rounds: int, ours: object, base: object) -> tuple[float, float]:
    o, b = [], []
    for _ in range(rounds):  # interleaved, to share the machine's noise
        b.append(base())  # type: ignore[operator]
        o.append(ours())  # type: ignore[operator]
    return statistics.median(o), statistics.median(b)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--static", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--full", action="store_true", help="100 batches of 100k rows, 1M-row static side")
    args = ap.parse_args(argv)
    if args.full:
        args.batches, args.rows, args.static, args.rounds = 100, 100_000, 1_000_000, 5
    tables = make_batches(args.batches, args.rows, keys=int(args.static * 1.2))
    static = make_static(args.static)
    # check both sides compute the same thing before timing them
    con = duckdb.connect()
    con.register("batch", tables[0])
    want = con.sql(STATELESS_QUERY).to_arrow_table()
    got = stateless_plan(hr.StaticFrame.from_arrow(tables[0])).to_arrow()
    assert got.num_rows == want.num_rows and got.column_names == want.column_names, (got.schema, want.schema)
    through_engine(tables[:2], stateless_plan)  # warm-up (imports, DuckDB)

    print(f"headrace transforms vs DuckDB on the same batches: {args.batches} batches x {args.rows:,} rows, "
          f"static side {args.static:,} rows (median of {args.rounds} interleaved rounds)")  # fmt: skip
    o, b = median_pair(args.rounds, lambda: through_engine(tables, stateless_plan),
                       lambda: duckdb_loop(tables, STATELESS_QUERY))  # fmt: skip
    print(f"  select_expr/where/with_column  headrace {o / 1e6:6.2f} M rows/s   DuckDB {b / 1e6:6.2f} M rows/s   "
          f"ratio {o / b:.2f} (goal >= 0.8)")  # fmt: skip

    def join_plan(s: hr.StreamFrame) -> hr.StreamFrame:
        return s.join(static, on="k")

    o, b = median_pair(args.rounds, lambda: through_engine(tables, join_plan),
                       lambda: duckdb_loop(tables, JOIN_QUERY, static))  # fmt: skip
    print(f"  stream-static join             headrace {o / 1e6:6.2f} M rows/s   DuckDB {b / 1e6:6.2f} M rows/s   "
          f"ratio {o / b:.2f} (goal >= 0.8)")  # fmt: skip
    small = make_batches(300, 100, keys=int(args.static * 1.2), seed=2)
    ours, base = small_sql(small)
    print(f"  select/where of 100-row chunks headrace {ours:6.3f} ms/chunk     DuckDB {base:6.3f} ms/chunk     "
          f"speed-up {base / ours:.1f}x")  # fmt: skip
    ours, base = small_joins(small, static)
    print(f"  join of 100-row chunks         headrace {ours:6.3f} ms/chunk     DuckDB {base:6.3f} ms/chunk     "
          f"speed-up {base / ours:.1f}x")  # fmt: skip
    stateful = Path(__file__).with_name("transforms_stateful.py")
    if stateful.exists():
        spec = importlib.util.spec_from_file_location("bench_transforms_stateful", stateful)
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod
        spec.loader.exec_module(mod)
        print()
        argv0 = sys.argv
        sys.argv = [str(stateful)]  # its own defaults (small sizes)
        try:
            mod.main()
        finally:
            sys.argv = argv0


if __name__ == "__main__":
    main()
