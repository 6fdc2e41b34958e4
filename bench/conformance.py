"""The cost of the Spark conformance run: per catalogue case, Spark's time and headrace's time
for the same query over the same seed's micro-batches, and the totals.

Each case runs alone on each engine (one Spark query at a time, so its time is its own; the
deep tier, ``scripts/conformance.py``, runs them concurrently instead), after one warm-up query
on each engine (Spark's first query plans and starts its Python workers). Spark's session start
is reported apart. The times are wall clock from ``start()`` to the end of the available-now
run, collection through ``foreachBatch`` included on both sides; each pair is also compared, so
the figure is that of a run that checks.

    .venv/bin/python bench/conformance.py                       # every case, seed 1
    .venv/bin/python bench/conformance.py --query session --query tumbling --seed 7
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.conformance.catalogue import CATALOGUE
from tests.conformance.generator import generate
from tests.conformance.harness import (
    compare,
    run_headrace,
    run_spark,
    spark_session,
    spark_skip_reason,
    write_input,
)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--query", action="append", default=[], help="only cases whose id contains this (repeatable)")
    args = ap.parse_args(argv)
    reason = spark_skip_reason()
    if reason:
        print(f"cannot run Spark: {reason}", file=sys.stderr)
        return 2
    cases = [c for c in CATALOGUE if not args.query or any(q in c.id for q in args.query)]
    if not cases:
        print(f"no case matches {args.query}", file=sys.stderr)
        return 2
    load = os.getloadavg()[0]
    t0 = time.monotonic()
    spark = spark_session()
    session_s = time.monotonic() - t0
    data = generate(args.seed)
    tmp = tempfile.mkdtemp(prefix="bench-conformance-")
    rows: list[tuple[str, float, float, bool]] = []
    try:
        paths = write_input(data, tmp)
        warm = cases[0].spec
        run_spark(spark, warm, paths, os.path.join(tmp, "warm-spark"))
        run_headrace(warm, paths, data, os.path.join(tmp, "warm-headrace"))
        for case in cases:
            s = run_spark(spark, case.spec, paths, os.path.join(tmp, f"spark-{case.id}"))
            h = run_headrace(case.spec, paths, data, os.path.join(tmp, f"headrace-{case.id}"))
            same = compare(case.spec, data.seed, s, h).identical
            rows.append((case.id, s.seconds, h.seconds, same))
            print(f"{case.id:32s} spark {s.seconds:7.2f} s  headrace {h.seconds:6.2f} s  "
                  f"spark/headrace {s.seconds / max(h.seconds, 1e-9):6.1f}x  {'identical' if same else 'DIFFERS'}",
                  flush=True)  # fmt: skip
    finally:
        spark.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    spark_total = sum(r[1] for r in rows)
    headrace_total = sum(r[2] for r in rows)
    print(f"\n{data.describe()}; {len(rows)} cases, {sum(r[3] for r in rows)}/{len(rows)} identical; "
          f"load average at start {load:.1f} on {os.cpu_count()} cores")  # fmt: skip
    print(f"Spark session start {session_s:.1f} s (once per run)")
    print(f"total: Spark {spark_total:.1f} s, headrace {headrace_total:.1f} s "
          f"(Spark/headrace {spark_total / max(headrace_total, 1e-9):.1f}x; headrace is "
          f"{100 * headrace_total / max(spark_total + headrace_total, 1e-9):.0f}% of the run's query time)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
