"""Benchmark of streaming deduplication by event id at high cardinality. Run from the repo root:
``.venv/bin/python bench/dedup.py [--rows 1000000] [--rounds 5]``.

The input: ``--rows`` rows in 10 Parquet files (``id`` int64, ``ts`` timestamp, ``v`` int64),
event time advancing 1 ms per row, ids new except 5% that repeat the event (id and event
time) of a row up to 2,000 rows before (so within the watermark). Nearly every row inserts a key into state and a later batch
evicts it: the state holds about one batch's keys, whatever the run's length.

Queries (cloudFiles Parquet, one file per trigger, ``available_now`` -> ``noop``, from
``start()`` to the end):

- ``within``: ``with_watermark("ts", "10 seconds").drop_duplicates_within_watermark("id")``
- ``with_ts``: ``with_watermark("ts", "10 seconds").drop_duplicates("id", "ts")``

each with state in memory and in RocksDB, against DuckDB's ``SELECT DISTINCT ON (id) *`` over
all the files at once (the one-shot limit: no state kept between batches, no durability).
Every output is checked: its row count equals DuckDB's. Systems are interleaved round by
round after a warm-up; the best and the median of ``--rounds`` are printed with the process's
CPU time (less disturbed by other load than wall time) and the load average. Asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

import headrace as hr  # noqa: E402

START_US = 1_700_000_000_000_000
FILES = 10
DUP_FRACTION = 0.05


def make_files(folder: Path, rows: int, seed: int = 3) -> None:
    rng = np.random.default_rng(seed)
    ids = rng.permutation(np.arange(rows, dtype=np.int64) * 7 + 11)
    dup = np.flatnonzero(rng.random(rows) < DUP_FRACTION)
    dup = dup[dup > 0]
    back = np.minimum(rng.integers(1, 2000, len(dup)), dup)
    ids[dup] = ids[dup - back]
    ts = START_US + np.arange(rows, dtype=np.int64) * 1000
    ts[dup] = ts[dup - back]  # a duplicate is the same event delivered again: same id, same event time
    table = pa.table({"id": ids, "ts": pa.array(ts, pa.timestamp("us", tz="UTC")), "v": np.arange(rows, dtype=np.int64)})
    per = -(-rows // FILES)
    folder.mkdir()
    for i in range(FILES):
        pq.write_table(table.slice(i * per, per), folder / f"part-{i:03d}.parquet")


def headrace_run(src: Path, work: Path, kind: str, backend: str, schema: pa.Schema) -> tuple[float, float, int]:
    out: list[int] = []
    with tempfile.TemporaryDirectory(dir=work) as chk:
        t0, c0 = time.perf_counter(), time.process_time()
        df = (hr.read_stream.format("cloudFiles").schema(schema)
              .options({"cloudFiles.format": "parquet", "cloudFiles.maxFilesPerTrigger": 1})
              .load(str(src)).with_watermark("ts", "10 seconds"))  # fmt: skip
        df = df.drop_duplicates_within_watermark("id") if kind == "within" else df.drop_duplicates("id", "ts")
        q = (df.write_stream.format("noop").option("checkpointLocation", chk).option("stateStore", backend)
             .on_progress(lambda p: out.append(p.sink.num_output_rows))
             .trigger(available_now=True).start())  # fmt: skip
        q.await_termination()
        return time.perf_counter() - t0, time.process_time() - c0, sum(out)


def duckdb_run(src: Path) -> tuple[float, float, int]:
    import duckdb

    con = duckdb.connect()
    t0, c0 = time.perf_counter(), time.process_time()
    n = con.sql(f"SELECT DISTINCT ON (id) * FROM read_parquet('{src}/*.parquet')").to_arrow_table().num_rows
    return time.perf_counter() - t0, time.process_time() - c0, n


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--kinds", default="within,with_ts")
    ap.add_argument("--backends", default="memory,rocksdb")
    args = ap.parse_args(argv)
    kinds = args.kinds.split(",")
    backends = args.backends.split(",")
    with tempfile.TemporaryDirectory() as w:
        work = Path(w)
        make_files(work / "in", args.rows)
        schema = pq.read_schema(work / "in" / "part-000.parquet")
        systems: list[tuple[str, Any]] = [("duckdb", lambda: duckdb_run(work / "in"))]
        for kind in kinds:
            for backend in backends:
                systems.append((f"{kind}/{backend}",
                                lambda k=kind, b=backend: headrace_run(work / "in", work, k, b, schema)))  # fmt: skip
        results: dict[str, list[tuple[float, float, int]]] = {name: [] for name, _ in systems}
        for _name, run in systems:  # warm-up: imports, page cache, DuckDB
            run()
        for _ in range(args.rounds):
            for name, run in systems:
                results[name].append(run())
        load = os.getloadavg()
    expected = results["duckdb"][0][2]
    duck_best = min(r[0] for r in results["duckdb"])
    duck_med = statistics.median(r[0] for r in results["duckdb"])
    duck_cpu = statistics.median(r[1] for r in results["duckdb"])
    print(f"dedup by event id: {args.rows:,} rows in {FILES} files, {DUP_FRACTION:.0%} duplicates, 10 s watermark; "
          f"best / median of {args.rounds}, interleaved; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} "
          f"on {os.cpu_count()} CPUs")  # fmt: skip
    report: dict[str, Any] = {"rows": args.rows, "load": load, "distinct": expected}
    print(f"  {'duckdb DISTINCT ON (id)':32s} {args.rows / duck_best:12,.0f} rows/s best, {args.rows / duck_med:12,.0f} "
          f"median, CPU {duck_cpu:.2f} s; {expected:,} rows out")  # fmt: skip
    for name, _ in systems[1:]:
        rs = results[name]
        wrong = {r[2] for r in rs if r[2] != expected}
        best, med = min(r[0] for r in rs), statistics.median(r[0] for r in rs)
        cpu = statistics.median(r[1] for r in rs)
        report[name] = {"best_s": best, "median_s": med, "cpu_s": cpu, "ratio": duck_best / best}
        print(f"  {name:32s} {args.rows / best:12,.0f} rows/s best, {args.rows / med:12,.0f} median, CPU {cpu:.2f} s; "
              f"DuckDB/headrace {duck_best / best:.2f} (median {duck_med / med:.2f}, CPU {duck_cpu / cpu:.2f})"
              f"{'' if not wrong else f'; WRONG row count {sorted(wrong)} (expected {expected:,})'}")  # fmt: skip
    return report


if __name__ == "__main__":
    main()
