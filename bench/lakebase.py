"""Benchmark of the lakebase sink: upserts of N rows (default 1,000,000; half of the keys exist
already) through headrace, against the same work done by hand with psycopg in the same run:

- ``copy+upsert``: a hand-written loop, per chunk of ``--batchsize`` rows one transaction of
  COPY (binary, ``write_row``) into a temporary staging table + ``INSERT ... SELECT ... ON
  CONFLICT DO UPDATE`` (what the sink does, minus its bookkeeping and vectorised encoding);
- ``executemany``: ``cursor.executemany(INSERT ... VALUES ... ON CONFLICT ...)`` per chunk,
  on the first ``--executemany-rows`` rows (it is much slower), reported as rows/s.

Run from the repository root: ``.venv/bin/python bench/lakebase.py [--rows N]``. It starts its
own PostgreSQL (tests/services). Measures and prints; asserts nothing.

It first prints the plugin's import cost (what a query start pays for it), from ``python -X importtime`` in fresh processes (``--import-runs``, medians),
split by who pays it: every query start loads the plugin module (``_plugin``: options, no
client library); a query with the sink loads ``headrace_lakebase.sink`` (psycopg needed for its
first connection); one with the change source ``headrace_lakebase.cdc_source``.
``--imports-only`` stops after that.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import psycopg  # noqa: E402
import pyarrow as pa  # noqa: E402

import headrace as hr  # noqa: E402
from headrace.testing import memory_stream  # noqa: E402
from tests.services import Postgres  # noqa: E402

DDL = "CREATE TABLE {t} (id bigint PRIMARY KEY, v bigint, ts timestamptz, s text)"


def make_data(n: int, seed: int = 7) -> pa.Table:
    """``n`` rows with keys 0..n-1 in random order; the table is pre-filled with keys < n/2."""
    rng = np.random.default_rng(seed)
    ids = rng.permutation(n).astype(np.int64)
    ts = pa.array(1_700_000_000_000_000 + ids * 1000).cast(pa.timestamp("us", tz="UTC"))
    s = pa.array([f"row-{i}" for i in ids.tolist()])
    return pa.table({"id": ids, "v": ids * 2, "ts": ts, "s": s})


def reset(conn: psycopg.Connection, table: str, prefill: pa.Table) -> None:
    conn.execute(f"DROP TABLE IF EXISTS {table}")
    conn.execute(DDL.format(t=table))
    with conn.cursor().copy(f"COPY {table} (id, v, ts, s) FROM STDIN") as cp:
        for row in zip(*(c.to_pylist() for c in prefill.columns), strict=True):
            cp.write_row(row)
    conn.execute(f"VACUUM ANALYZE {table}")


def run_headrace(dsn: str, table: str, data: pa.Table, batchsize: int | None) -> float:
    name = f"bench-{uuid.uuid4().hex[:8]}"
    stream = memory_stream(name)
    for b in data.to_batches(max_chunksize=65536):
        stream.add(b)
    with tempfile.TemporaryDirectory() as chk:
        t0 = time.perf_counter()
        q = (hr.read_stream.format("memory").option("name", name).load()
             .write_stream.format("lakebase").option("url", dsn).option("dbtable", table)
             .option("upsertkey", "id").options({"batchsize": batchsize} if batchsize else {})
             .option("checkpointLocation", chk).trigger(available_now=True).start())  # fmt: skip
        q.await_termination()
        return time.perf_counter() - t0


def run_copy_upsert(conn: psycopg.Connection, table: str, data: pa.Table, batchsize: int) -> float:
    t0 = time.perf_counter()
    conn.execute(f"CREATE TEMP TABLE stage ON COMMIT DELETE ROWS AS SELECT id, v, ts, s FROM {table} WITH NO DATA")
    for start in range(0, data.num_rows, batchsize):
        chunk = data.slice(start, batchsize)
        cols = [c.to_pylist() for c in chunk.columns]
        with conn.transaction(), conn.cursor() as cur:
            with cur.copy("COPY stage (id, v, ts, s) FROM STDIN (FORMAT BINARY)") as cp:
                cp.set_types(["int8", "int8", "timestamptz", "text"])
                for row in zip(*cols, strict=True):
                    cp.write_row(row)
            cur.execute(f"INSERT INTO {table} (id, v, ts, s) SELECT id, v, ts, s FROM stage "
                        "ON CONFLICT (id) DO UPDATE SET v = EXCLUDED.v, ts = EXCLUDED.ts, s = EXCLUDED.s")  # fmt: skip
    conn.execute("DROP TABLE stage")
    return time.perf_counter() - t0


def run_executemany(conn: psycopg.Connection, table: str, data: pa.Table, batchsize: int) -> float:
    t0 = time.perf_counter()
    sql = (f"INSERT INTO {table} (id, v, ts, s) VALUES (%s, %s, %s, %s) "
           "ON CONFLICT (id) DO UPDATE SET v = EXCLUDED.v, ts = EXCLUDED.ts, s = EXCLUDED.s")  # fmt: skip
    for start in range(0, data.num_rows, batchsize):
        chunk = data.slice(start, batchsize)
        rows = list(zip(*(c.to_pylist() for c in chunk.columns), strict=True))
        with conn.transaction(), conn.cursor() as cur:
            cur.executemany(sql, rows)
    return time.perf_counter() - t0


# What a query start has loaded before it discovers plugins: headrace's public API (``import
# headrace`` alone is lazy and loads almost nothing, so it would count headrace's own modules
# as the plugin's cost).
_QUERY_START = "import headrace; [getattr(headrace, n) for n in headrace.__all__]; import headrace.engine.setup"
_IMPORT_STEPS = [
    ("every query start: headrace_lakebase._plugin", _QUERY_START, "import headrace_lakebase._plugin"),
    ("lakebase sink: headrace_lakebase.sink", f"{_QUERY_START}; import headrace_lakebase._plugin",
     "import headrace_lakebase.sink"),
    ("change source: headrace_lakebase.cdc_source", f"{_QUERY_START}; import headrace_lakebase._plugin",
     "import headrace_lakebase.cdc_source"),
]  # fmt: skip


def _import_ms(before: str, what: str) -> dict[str, float]:
    """Milliseconds of ``what`` in a fresh interpreter that already ran ``before``, by owner
    (sum of each module's own time from ``-X importtime``)."""
    code = f"{before}; import sys; sys.stderr.write('--mark--\\n'); {what}"
    err = subprocess.run([sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT).stderr  # fmt: skip
    out = {"total": 0.0, "psycopg": 0.0, "plugin": 0.0, "pyarrow": 0.0, "other": 0.0}
    for line in err.split("--mark--", 1)[1].splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        own, _, name = line[len("import time:"):].split("|")
        ms, name = int(own) / 1000, name.strip()
        root = name.split(".")[0]
        key = {"psycopg": "psycopg", "psycopg_binary": "psycopg", "headrace_lakebase": "plugin",
               "pyarrow": "pyarrow"}.get(root, "other")  # fmt: skip
        out[key] += ms
        out["total"] += ms
    return out


def print_import_costs(runs: int) -> None:
    print(f"lakebase plugin import cost (ms, -X importtime, fresh process, median of {runs}):")
    for label, before, what in _IMPORT_STEPS:
        got = [_import_ms(before, what) for _ in range(runs)]
        med = {k: statistics.median(g[k] for g in got) for k in got[0]}
        print(f"  {label:46s} {med['total']:6.1f}  (plugin's own modules {med['plugin']:5.1f}, psycopg "
              f"{med['psycopg']:5.1f}, pyarrow {med['pyarrow']:5.1f}, other {med['other']:5.1f})")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--batchsize", type=int, default=10_000)
    ap.add_argument("--executemany-rows", type=int, default=100_000)
    ap.add_argument("--import-runs", type=int, default=5)
    ap.add_argument("--imports-only", action="store_true")
    args = ap.parse_args()
    print_import_costs(args.import_runs)
    if args.imports_only:
        return
    n = args.rows
    data = make_data(n)
    prefill = data.filter(pa.compute.less(data["id"], n // 2))
    with Postgres() as pg, psycopg.connect(pg.dsn, autocommit=True) as conn:
        results: dict[str, tuple[int, float]] = {}
        reset(conn, "bench_raw", prefill)
        results["copy+upsert (hand-written)"] = (n, run_copy_upsert(conn, "bench_raw", data, args.batchsize))
        reset(conn, "bench_hr", prefill)
        results["headrace lakebase"] = (n, run_headrace(pg.dsn, "bench_hr", data, args.batchsize))
        reset(conn, "bench_hr_default", prefill)  # the sink's default batchsize
        results["headrace, default batchsize"] = (n, run_headrace(pg.dsn, "bench_hr_default", data, None))
        reset(conn, "bench_hr_big", prefill)
        results["headrace, batchsize 100000"] = (n, run_headrace(pg.dsn, "bench_hr_big", data, 100_000))
        m = min(n, args.executemany_rows)
        reset(conn, "bench_many", prefill)
        results["executemany"] = (m, run_executemany(conn, "bench_many", data.slice(0, m), args.batchsize))
        for t in ("bench_raw", "bench_hr", "bench_hr_default", "bench_hr_big"):
            count, total = conn.execute(f"SELECT count(*), sum(v) FROM {t}").fetchone()  # type: ignore[misc]
            assert count == n and total == sum(range(n)) * 2, f"{t}: wrong result {count} {total}"
    rate = {k: rows / secs for k, (rows, secs) in results.items()}
    print(f"lakebase upsert bench: {n:,} rows (half existing keys), batchsize {args.batchsize:,}")
    for k, (rows, secs) in results.items():
        print(f"  {k:28s} {rows:>10,} rows in {secs:7.2f} s = {rate[k]:>10,.0f} rows/s")
    hr_rate = rate["headrace lakebase"]
    print(f"  ratio headrace / hand-written copy+upsert: {hr_rate / rate['copy+upsert (hand-written)']:.2f} (goal >= 0.8)")
    print(f"  ratio headrace / executemany:              {hr_rate / rate['executemany']:.2f}")
    print(f"  ratio default batchsize / batchsize 100000: "
          f"{rate['headrace, default batchsize'] / rate['headrace, batchsize 100000']:.2f}")


if __name__ == "__main__":
    main()
