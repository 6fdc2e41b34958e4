"""Benchmark of declarative pipelines. Run from the repo root: ``.venv/bin/python bench/pipelines.py``.

A triggered run of the three-level pipeline (JSON files -> cloudFiles -> ``bronze`` streaming
table -> ``silver`` streaming table with an ``expect_or_drop`` expectation -> ``gold``
materialized view joining a ``dims`` table) vs the same three queries run one after another by
hand through the headrace API (``read_stream ... write_stream`` twice, then a batch join and
aggregate written with ``write_deltalake``). Both in this process, on fresh storage; the
pipeline's time includes loading the spec and definitions, the graph analysis, the event log
and the expectation metrics. Goal: pipeline overhead <= 10%.

Default: 100,000 input rows; ``--full``: 1,000,000. Prints measurements; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import headrace as hr  # noqa: E402

SPEC = """name: bench
storage: storage
libraries:
  - glob:
      include: transformations/**
"""

DEFS = '''
import headrace as hr
import headrace.pipelines as dp


@dp.table
def bronze():
    return (hr.read_stream.format("cloudFiles").option("cloudFiles.format", "json")
            .option("cloudFiles.inferColumnTypes", "true").option("cloudFiles.schemaLocation", "schema").load("landing"))


@dp.table
@dp.expect_or_drop("positive", "amount > 0")
def silver():
    return hr.read_stream.table("bronze")


@dp.materialized_view
def gold():
    return dp.read.table("silver").join(dp.read.format("json").load("dims.json"), on="k").sql(GOLD)


GOLD = "SELECT k, label, count(*) AS n, sum(amount) AS total FROM batch GROUP BY k, label"
'''

GOLD = "SELECT k, label, count(*) AS n, sum(amount) AS total FROM batch GROUP BY k, label"


def make_input(work: Path, rows: int, files: int) -> None:
    (work / "landing").mkdir(parents=True)
    per = rows // files
    for f in range(files):
        lines = [json.dumps({"id": f * per + i, "k": i % 100, "amount": (i * 7919) % 1000 - 100, "name": f"n{i % 977}"})
                 for i in range(per)]  # fmt: skip
        (work / "landing" / f"part-{f:04d}.json").write_text("\n".join(lines) + "\n")
    (work / "dims.json").write_text("\n".join(json.dumps({"k": k, "label": f"label-{k}"}) for k in range(100)) + "\n")


def run_pipeline(work: Path) -> float:
    from headrace.pipelines.runner import PipelineRun
    from headrace.pipelines.spec import load_pipeline

    (work / "pipeline.yml").write_text(SPEC)
    (work / "transformations").mkdir()
    (work / "transformations" / "defs.py").write_text(DEFS)
    t0 = time.perf_counter()
    result = PipelineRun(load_pipeline(str(work / "pipeline.yml")), out=None).run()
    took = time.perf_counter() - t0
    assert result.state == "COMPLETED", result.errors
    return took


def run_by_hand(work: Path) -> float:
    from deltalake import DeltaTable, write_deltalake

    from headrace.api.static import FileRead
    from headrace.transforms.expressions import condition_mask, run_sql
    from headrace.transforms.join import join_tables

    out = work / "manual"
    t0 = time.perf_counter()
    (hr.read_stream.format("cloudFiles").option("cloudFiles.format", "json")
       .option("cloudFiles.inferColumnTypes", "true").option("cloudFiles.schemaLocation", str(out / "schema"))
       .load(str(work / "landing"))
       .write_stream.format("delta").option("checkpointLocation", str(out / "chk" / "bronze"))
       .trigger(available_now=True).start(str(out / "bronze")).await_termination())  # fmt: skip
    (hr.read_stream.format("delta").load(str(out / "bronze"))
       .map_batches(lambda t: t.filter(condition_mask(t, "amount > 0")))
       .write_stream.format("delta").option("checkpointLocation", str(out / "chk" / "silver"))
       .trigger(available_now=True).start(str(out / "silver")).await_termination())  # fmt: skip
    silver = DeltaTable(str(out / "silver")).to_pyarrow_table()
    dims = FileRead("json", str(work / "dims.json")).read()
    gold = run_sql(join_tables(silver, dims, "k"), GOLD)
    write_deltalake(str(out / "gold"), gold, mode="overwrite", schema_mode="overwrite")
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--full", action="store_true", help="1,000,000 input rows (default 100,000)")
    ap.add_argument("--rows", type=int, help="input rows (overrides --full)")
    ap.add_argument("--files", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    rows = args.rows or (1_000_000 if args.full else 100_000)
    base = Path(tempfile.mkdtemp(prefix="headrace-bench-pipelines-"))
    try:
        src = base / "input"
        make_input(src, rows, args.files)
        times: dict[str, list[float]] = {"pipeline": [], "by hand": []}
        warm = base / "warm"
        make_input(warm, 1000, 2)  # imports (DuckDB, deltalake, sqlglot) and first-use costs, not measured
        for name, fn in (("pipeline", run_pipeline), ("by hand", run_by_hand)):
            work = base / f"warm-{name.replace(' ', '_')}"
            shutil.copytree(warm, work)
            cwd = os.getcwd()
            os.chdir(work)
            try:
                fn(work)
            finally:
                os.chdir(cwd)
        for i in range(args.repeats):
            for name, fn in (("by hand", run_by_hand), ("pipeline", run_pipeline)) if i % 2 else \
                    (("pipeline", run_pipeline), ("by hand", run_by_hand)):  # fmt: skip
                work = base / f"{name.replace(' ', '_')}-{i}"
                shutil.copytree(src, work)
                cwd = os.getcwd()
                os.chdir(work)
                try:
                    times[name].append(fn(work))
                finally:
                    os.chdir(cwd)
                shutil.rmtree(work)
        p, h = statistics.median(times["pipeline"]), statistics.median(times["by hand"])
        print(f"three-level pipeline, {rows:,} input rows in {args.files} files, median of {args.repeats}:")
        print(f"  by hand (3 queries through the API): {h:7.2f} s   {rows / h:,.0f} rows/s   runs {' '.join(f'{t:.2f}' for t in times['by hand'])}")
        print(f"  pipeline (headrace pipelines run):   {p:7.2f} s   {rows / p:,.0f} rows/s   runs {' '.join(f'{t:.2f}' for t in times['pipeline'])}")
        print(f"  pipeline overhead: {(p / h - 1) * 100:+.1f}%  (goal <= +10%)")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
