"""Where a Python data source's query start goes in Spark. Run from the repo root:
``.venv/bin/python bench/spark_start.py``.

For every streaming query that reads a Python data source, Spark 4 starts a fresh Python
process (``python -m pyspark.sql.streaming.python_streaming_source_runner``, with
``$SPARK_HOME/python/lib/pyspark.zip`` first on its ``PYTHONPATH``), sends it the pickled data
source, and calls the reader's methods in it before the first micro-batch. This bench runs the
same steps in the same kind of process, without a JVM, and prints the wall and CPU milliseconds
of each (medians of ``--rounds``, interleaved), for:

- ``adapter``: ``headrace.cloudFiles`` through ``headrace.spark`` (the options of bench/spark.py);
- ``floor``: bench/spark.py's minimal Python data source (no headrace).

Steps: importing the runner's modules (pyspark, from the zip as Spark does: the zip holds no
bytecode, so they are compiled in every process), ``setup_spark_files`` (a new folder on
``sys.path`` and ``importlib.invalidate_caches()``, which re-reads the zips), unpickling the data
source, ``streamReader``, ``prepareForTriggerAvailableNow``, ``initialOffset``, the first
``latestOffset`` and ``partitions``. ``--site-packages`` also times the runner's imports from
site-packages (what the zip costs; not a setting Spark offers, see docs/spark.md).
The interpreter start itself and the JVM's side are not in these figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

CHILD = r"""
import json, pickle, resource, sys, time
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
marks = [("start", time.perf_counter(), cpu())]
def mark(name):
    marks.append((name, time.perf_counter(), cpu()))
import pyspark.sql.streaming.python_streaming_source_runner as runner
mark("import runner modules")
import importlib
sys.path.insert(1, sys.argv[2])
importlib.invalidate_caches()
mark("setup_spark_files")
from pyspark.sql.types import _parse_datatype_json_string
blob = open(sys.argv[1], "rb").read()
data_source = pickle.loads(blob)
mark("unpickle data source")
schema = _parse_datatype_json_string(sys.argv[3])
reader = runner._streamReader(data_source, schema)
mark("streamReader")
reader.prepareForTriggerAvailableNow()
mark("prepareForTriggerAvailableNow")
start = reader.initialOffset()
mark("initialOffset")
end = reader.latestOffset(start, reader.getDefaultReadLimit())
mark("first latestOffset")
reader.partitions(start, end)
mark("partitions")
reader.stop()
print(json.dumps([(n, t - p[1], c - p[2]) for (n, t, c), p in zip(marks[1:], marks)]))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    ap.add_argument("--site-packages", action="store_true", help="also import pyspark from site-packages")
    ap.add_argument("--no-compile", action="store_true", help="do not compile headrace's sources first")
    args = ap.parse_args()

    import pyarrow.parquet as pq
    import spark as bench  # bench/spark.py
    from pyspark import cloudpickle
    from pyspark.find_spark_home import _find_spark_home

    import headrace.spark
    from headrace.spark.type_mapping import arrow_to_spark_schema

    print(bench.compile_bytecode() if not args.no_compile else "bytecode: not compiled first (--no-compile)")
    lib = Path(_find_spark_home()) / "python" / "lib"
    zips = ":".join(str(p) for p in sorted(lib.glob("*.zip")))
    work = Path(tempfile.mkdtemp(prefix="headrace-bench-spark-start-"))
    src = work / "in"
    bench.write_files(src, 20, 1000)
    schema = arrow_to_spark_schema(pq.read_schema(next(src.glob("*.parquet"))))
    cloudpickle.register_pickle_by_value(bench)  # the floor's classes travel by value, as from __main__
    kinds = {"adapter": zips, "floor": zips}
    if args.site_packages:
        kinds["adapter, pyspark from site-packages"] = ""
    got: dict[str, list[list[tuple[str, float, float]]]] = {k: [] for k in kinds}
    for r in range(args.rounds):
        for kind, path in kinds.items():
            chk = work / f"chk-{kind[:7]}-{r}"
            if kind.startswith("adapter"):
                cls = headrace.spark.data_source_class("cloudFiles", max_tasks=1)
                ds = cls({"cloudfiles.format": "parquet", "cloudfiles.schemalocation": str(chk / "schema"),
                          "cloudfiles.maxfilespertrigger": "5", "headracestatepath": str(chk / "state"),
                          "path": str(src)})  # fmt: skip
            else:
                ds = bench.floor_data_source()({"path": str(src), "maxfilespertrigger": "5", "tasks": "1"})
            blob = work / "ds.pkl"
            blob.write_bytes(cloudpickle.dumps(ds))
            # as Spark builds it: its zips, then the driver's PYTHONPATH
            env = dict(os.environ, PYTHONPATH=":".join(p for p in (path, os.environ.get("PYTHONPATH", "")) if p))
            files_dir = work / f"files-{r}"
            files_dir.mkdir(exist_ok=True)
            out = subprocess.run([sys.executable, "-c", CHILD, str(blob), str(files_dir), schema.json()],
                                 env=env, capture_output=True, text=True, check=False)  # fmt: skip
            if out.returncode:
                raise SystemExit(f"{kind}: {out.stderr[-3000:]}")
            got[kind].append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; medians of {args.rounds} rounds, ms "
          "(wall / CPU)")  # fmt: skip
    steps = [s for s, _, _ in got["adapter"][0]]
    width = {k: max(len(k), 19) + 3 for k in kinds}
    print(f"  {'step':32s}" + "".join(f"{k:>{width[k]}s}" for k in kinds))
    for i, step in enumerate(steps):
        cells = []
        for kind in kinds:
            w = statistics.median(run[i][1] for run in got[kind]) * 1000
            c = statistics.median(run[i][2] for run in got[kind]) * 1000
            cells.append(f"{w:9.1f} / {c:7.1f}".rjust(width[kind]))
        print(f"  {step:32s}" + "".join(cells))
    cells = []
    for kind in kinds:
        tw = statistics.median(sum(s[1] for s in run) for run in got[kind]) * 1000
        tc = statistics.median(sum(s[2] for s in run) for run in got[kind]) * 1000
        cells.append(f"{tw:9.1f} / {tc:7.1f}".rjust(width[kind]))
    print(f"  {'total':32s}" + "".join(cells))


if __name__ == "__main__":
    main()
