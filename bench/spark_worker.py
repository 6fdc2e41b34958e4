"""The Python side of bench/spark.py's adapter run against its floor, without Spark:
``.venv/bin/python bench/spark_worker.py [--files 20 --rows 50000 --per-trigger 5 --profile]``.

Calls what Spark calls on the adapter's data sources (``headrace.cloudFiles`` read,
``headrace.files`` write) for each micro-batch, in this one process: on the "driver" the
reader's offsets and partitions, on each "task" a pickled copy of the reader reading its
partition and a pickled copy of the writer writing what was read (as Spark's Arrow batches of
``spark.sql.execution.arrow.maxRecordsPerBatch`` rows), then the writer's commit; and the same
for the floor (bench/spark.py: pyarrow reading the files, one ``ParquetWriter`` per task, no
commit). Prints the CPU and wall seconds of each part, summed over the batches (median of
``--rounds``), and the ratio of the two totals; ``--profile`` prints cProfile's top functions
of the adapter's parts. What Spark adds around them (its processes, the JVM's Arrow <-> row
conversions) is the same for both and not here: bench/spark.py measures the whole.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pickle
import pstats
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

SPARK_BATCH_ROWS = 10_000  # spark.sql.execution.arrow.maxRecordsPerBatch's default
TASKS = 2


class Clock:
    """CPU and wall seconds per named part."""

    def __init__(self) -> None:
        self.cpu: dict[str, float] = {}
        self.wall: dict[str, float] = {}

    def run(self, part: str, fn: Callable[..., Any], prof: cProfile.Profile | None = None) -> Any:
        c0, w0 = time.process_time(), time.perf_counter()
        if prof is not None:
            prof.enable()
        try:
            return fn()
        finally:
            if prof is not None:
                prof.disable()
            self.cpu[part] = self.cpu.get(part, 0.0) + time.process_time() - c0
            self.wall[part] = self.wall.get(part, 0.0) + time.perf_counter() - w0


def spark_batches(tables: list[pa.RecordBatch]) -> list[pa.RecordBatch]:
    """What Spark hands a writer task: the rows again as Arrow batches of 10,000 rows."""
    t = pa.Table.from_batches(tables) if tables else None
    return t.combine_chunks().to_batches(max_chunksize=SPARK_BATCH_ROWS) if t is not None else []


def adapter_round(
    src: Path, work: Path, per_trigger: int, clock: Clock, prof: cProfile.Profile | None
) -> int:
    from pyspark import cloudpickle  # what Spark pickles the reader, the writer and the partitions with
    from pyspark.sql.types import StructType

    import headrace.spark
    from headrace.spark.sink import HeadraceCommitMessage
    from headrace.spark.type_mapping import arrow_to_spark_schema

    schema: StructType = arrow_to_spark_schema(pq.read_schema(next(src.glob("*.parquet"))))
    read_cls = headrace.spark.data_source_class("cloudFiles", max_tasks=TASKS)
    write_cls = headrace.spark.data_source_class("files")
    chk = work / "chk"
    ropts = {"path": str(src), "cloudFiles.format": "parquet", "cloudFiles.schemaLocation": str(chk / "schema"),
             "cloudFiles.maxFilesPerTrigger": str(per_trigger),
             "headraceStatePath": str(chk / "sources" / "0" / "headrace")}  # fmt: skip
    wopts = {"path": str(work / "out"), "checkpointLocation": str(chk)}
    os.makedirs(chk / "offsets", exist_ok=True)
    reader = clock.run("driver: reader", lambda: read_cls(ropts).streamReader(schema), prof)
    clock.run("driver: reader", reader.prepareForTriggerAvailableNow, prof)
    start = clock.run("driver: reader", reader.initialOffset, prof)
    limit = reader.getDefaultReadLimit()
    rows, batch_id = 0, 0
    while True:
        end = clock.run("driver: offsets", lambda s=start: reader.latestOffset(s, limit), prof)
        if end == start:
            break
        parts = clock.run("driver: partitions", lambda s=start, e=end: reader.partitions(s, e), prof)
        blob = cloudpickle.dumps(reader)
        writer = clock.run("driver: plan write", lambda: write_cls(wopts).streamWriter(schema, False), prof)
        wblob = cloudpickle.dumps(writer)
        messages = []
        for part in parts:
            pblob = cloudpickle.dumps(part)
            task_reader = pickle.loads(blob)
            got = clock.run(
                "task: read", lambda r=task_reader, pb=pblob: list(r.read(pickle.loads(pb))), prof
            )
            batches = spark_batches(got)
            rows += sum(b.num_rows for b in batches)
            task_writer = pickle.loads(wblob)

            def write(w: Any = task_writer, bs: list[pa.RecordBatch] = batches, b: int = batch_id) -> Any:
                from headrace.spark.type_mapping import conform_batches

                sink = w._sink()
                try:  # HeadraceStreamWriter.write without Spark's TaskContext (the batch id it reads)
                    return HeadraceCommitMessage(
                        sink.write(b, iter(conform_batches(iter(bs), w._arrow_schema)))
                    )
                finally:
                    sink.close()

            messages.append(clock.run("task: write", write, prof))
        committer = clock.run("driver: commit", lambda: write_cls(wopts).streamWriter(schema, False), prof)
        clock.run("driver: commit", lambda c=committer, m=messages, b=batch_id: c.commit(m, b), prof)
        clock.run("driver: commit", lambda e=end: reader.commit(e), prof)
        start, batch_id = end, batch_id + 1
    reader.stop()
    return rows


def floor_round(src: Path, work: Path, per_trigger: int, clock: Clock) -> int:
    files = sorted(str(p) for p in src.glob("*.parquet"))
    target = pq.read_schema(files[0])
    out = work / "out"
    os.makedirs(out, exist_ok=True)
    rows = 0
    for batch_id, i in enumerate(range(0, len(files), per_trigger)):
        chunk = files[i : i + per_trigger]
        k = max(1, min(TASKS, len(chunk)))
        for t in range(k):

            def read(fs: list[str] = chunk[t::k]) -> list[pa.RecordBatch]:
                got = []
                for f in fs:
                    for b in pq.ParquetFile(f).iter_batches(batch_size=1 << 20):
                        got.append(pa.Table.from_batches([b]).cast(target).to_batches()[0])
                return got

            batches = spark_batches(clock.run("task: read", read))
            rows += sum(b.num_rows for b in batches)

            def write(bs: list[pa.RecordBatch] = batches, b: int = batch_id, task: int = t) -> None:
                w = None
                for rb in bs:
                    if w is None:
                        w = pq.ParquetWriter(str(out / f"part-{b}-{task}.parquet"), rb.schema)
                    w.write_batch(rb)
                if w is not None:
                    w.close()

            clock.run("task: write", write)
    return rows


def fresh_task(kind: str, folder: Path) -> None:
    """One task's work of one micro-batch in this (new) interpreter; prints its CPU seconds.
    ``folder`` holds the input files and, for the adapter, the pickled reader, partition and
    writer (written by :func:`fresh_rounds`)."""
    import pyspark.worker  # noqa: F401  (a forked worker has it: the daemon imported it)

    c0 = time.process_time()
    if kind == "adapter":
        reader = pickle.loads((folder / "reader.pkl").read_bytes())
        batches = spark_batches(list(reader.read(pickle.loads((folder / "part.pkl").read_bytes()))))
        writer = pickle.loads((folder / "writer.pkl").read_bytes())
        from headrace.spark.type_mapping import conform_batches

        sink = writer._sink()
        sink.write(0, iter(conform_batches(iter(batches), writer._arrow_schema)))
        sink.close()
    else:
        clock = Clock()
        floor_round(folder / "in", folder / f"floor-{os.getpid()}", 10**6, clock)
    print(f"{time.process_time() - c0:.4f}")


def fresh_rounds(base: Path, rounds: int) -> None:
    """``--fresh``: each round one new interpreter per kind, interleaved; medians printed."""
    from pyspark import cloudpickle

    import headrace.spark
    from headrace.spark.type_mapping import arrow_to_spark_schema

    src = base / "in"
    schema = arrow_to_spark_schema(pq.read_schema(next(src.glob("*.parquet"))))
    chk = base / "chk"
    os.makedirs(chk / "offsets", exist_ok=True)
    ropts = {"path": str(src), "cloudFiles.format": "parquet", "cloudFiles.schemaLocation": str(chk / "schema"),
             "cloudFiles.maxFilesPerTrigger": "1000000", "headraceStatePath": str(chk / "state")}  # fmt: skip
    reader = headrace.spark.data_source_class("cloudFiles", max_tasks=1)(ropts).streamReader(schema)
    reader.prepareForTriggerAvailableNow()
    start = reader.initialOffset()
    parts = reader.partitions(start, reader.latestOffset(start, reader.getDefaultReadLimit()))
    writer = headrace.spark.data_source_class("files")(
        {"path": str(base / "out"), "checkpointLocation": str(chk)}
    )
    (base / "reader.pkl").write_bytes(cloudpickle.dumps(reader))
    (base / "part.pkl").write_bytes(cloudpickle.dumps(parts[0]))
    (base / "writer.pkl").write_bytes(cloudpickle.dumps(writer.streamWriter(schema, False)))
    got: dict[str, list[float]] = {"adapter": [], "floor": []}
    import subprocess

    for _ in range(rounds):
        for kind in got:
            out = subprocess.run([sys.executable, __file__, "--task", kind, str(base)], capture_output=True,
                                 text=True, check=True)  # fmt: skip
            got[kind].append(float(out.stdout.split()[-1]))
    for kind, values in got.items():
        print(f"fresh worker, one task ({kind}): median {statistics.median(values):.3f} CPU s "
              f"({' '.join(f'{v:.3f}' for v in values)})")  # fmt: skip
    print(f"floor / adapter {statistics.median(got['floor']) / statistics.median(got['adapter']):.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=20)
    ap.add_argument("--rows", type=int, default=50_000)
    ap.add_argument("--per-trigger", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument(
        "--profile", action="store_true", help="cProfile the adapter's parts (top 25 by own time)"
    )
    ap.add_argument(
        "--fresh", action="store_true", help="one task per new interpreter (a fresh worker's cost)"
    )
    ap.add_argument("--task", nargs=2, metavar=("KIND", "FOLDER"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.task:
        fresh_task(args.task[0], Path(args.task[1]))
        return
    print(f"load average at start: {' / '.join(f'{x:.1f}' for x in os.getloadavg())}")
    from bench.spark import (
        write_files,
    )  # not in --task: it imports pyarrow.dataset, which a task must pay itself

    base = Path(tempfile.mkdtemp(prefix="headrace-bench-worker-"))
    try:
        src = base / "in"
        src.mkdir()
        write_files(src, args.files, args.rows)
        if args.fresh:
            fresh_rounds(base, args.rounds)
            return
        total = args.files * args.rows
        results: dict[str, list[Clock]] = {"adapter": [], "floor": []}
        prof = cProfile.Profile() if args.profile else None
        for r in range(args.rounds + 1):  # the first round warms up (imports), not counted
            for name in ("adapter", "floor"):
                work = base / f"{name}-{r}"
                clock = Clock()
                got = (adapter_round(src, work, args.per_trigger, clock, prof if r else None) if name == "adapter"
                       else floor_round(src, work, args.per_trigger, clock))  # fmt: skip
                assert got == total, (name, got, total)
                if r:
                    results[name].append(clock)
                shutil.rmtree(work, ignore_errors=True)
        for name, clocks in results.items():
            print(f"{name}:")
            for part in clocks[0].cpu:
                cpu = statistics.median(c.cpu.get(part, 0.0) for c in clocks)
                wall = statistics.median(c.wall.get(part, 0.0) for c in clocks)
                print(f"  {part:<20} cpu {cpu * 1000:8.1f} ms   wall {wall * 1000:8.1f} ms")
        cpus = {n: statistics.median(sum(c.cpu.values()) for c in cl) for n, cl in results.items()}
        walls = {n: statistics.median(sum(c.wall.values()) for c in cl) for n, cl in results.items()}
        print(f"total CPU: adapter {cpus['adapter']:.3f} s, floor {cpus['floor']:.3f} s, "
              f"floor / adapter {cpus['floor'] / cpus['adapter']:.2f}")  # fmt: skip
        print(f"total wall: adapter {walls['adapter']:.3f} s, floor {walls['floor']:.3f} s, "
              f"floor / adapter {walls['floor'] / walls['adapter']:.2f}")  # fmt: skip
        if prof is not None:
            pstats.Stats(prof).sort_stats("tottime").print_stats(25)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(f"load average at end: {' / '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
