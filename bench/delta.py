"""Benchmark of headrace-delta against delta-rs / pyarrow doing the same work in the same run.

    .venv/bin/python bench/delta.py

Prints, measured (nothing asserted):
1. source rows/s over a 100-version table vs reading the same added files with pyarrow;
2. sink rows/s vs plain ``write_deltalake`` of the same batches;
3. the time of one trigger (a new commit picked up) on a table with 10,000 versions vs 10.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

from headrace.plugins import registry
from headrace.protocols import ReadLimit, SinkContext, SourceContext

VERSIONS = 100
ROWS_PER_VERSION = 20_000
SINK_BATCHES = 20
SINK_ROWS = 50_000


def _table(lo: int, n: int) -> pa.Table:
    import pyarrow.compute as pc

    v = pa.array(range(lo, lo + n), pa.int64())
    return pa.table({"id": v, "x": pc.multiply(v, 3).cast(pa.float64()), "s": pc.cast(v, pa.string())})


def _best(fn: Callable[[], int], repeat: int = 3) -> float:
    """Best rows/s of ``repeat`` runs."""
    best = 0.0
    for _ in range(repeat):
        t = time.perf_counter()
        n = fn()
        best = max(best, n / (time.perf_counter() - t))
    return best


def bench_source(root: str) -> None:
    path = os.path.join(root, "src")
    write_deltalake(path, _table(0, 1).slice(0, 0))
    for i in range(VERSIONS):
        write_deltalake(path, _table(i * ROWS_PER_VERSION, ROWS_PER_VERSION), mode="append")
    spec = registry().get("delta")

    def headrace_read() -> int:
        opts = spec.source_options.parse({"path": path, "startingVersion": 0}, connector="delta", role="source")
        src = spec.load_source()(opts, SourceContext(query_id="bench"))
        start = src.initial_offset()
        rows = 0
        while True:
            end = src.latest_offset(start, src.default_read_limit())
            if end == start:
                break
            for p in src.partitions(start, end):
                for b in src.read(p):
                    rows += b.num_rows
            start = end
        src.close()
        return rows

    files = [os.path.join(path, f) for f in DeltaTable(path).file_uris()]

    def pyarrow_read() -> int:
        rows = 0
        for f in files:
            for rg in range(pq.ParquetFile(f).num_row_groups):
                rows += pq.ParquetFile(f).read_row_group(rg).num_rows
        return rows

    base = _best(pyarrow_read)
    ours = _best(headrace_read)
    print(f"source: headrace {ours:,.0f} rows/s vs pyarrow {base:,.0f} rows/s over {VERSIONS} versions "
          f"-> ratio {ours / base:.2f} (goal >= 0.8)")  # fmt: skip


def bench_sink(root: str) -> None:
    batches = [_table(i * SINK_ROWS, SINK_ROWS) for i in range(SINK_BATCHES)]
    spec = registry().get("delta")
    n = 0

    def plain() -> int:
        nonlocal n
        n += 1
        path = os.path.join(root, f"plain{n}")
        for i, t in enumerate(batches):
            write_deltalake(path, t, mode="append",
                            commit_properties=CommitProperties(app_transactions=[Transaction("b", i)]))  # fmt: skip
        return SINK_ROWS * SINK_BATCHES

    def ours() -> int:
        nonlocal n
        n += 1
        path = os.path.join(root, f"ours{n}")
        state = os.path.join(root, f"state{n}")
        opts = spec.sink_options.parse({"path": path}, connector="delta", role="sink")
        sink = spec.load_sink()(opts, SinkContext(query_id="bench", state_path=state))
        for i, t in enumerate(batches):
            sink.commit(i, [sink.write(i, iter(t.to_batches()))])
        sink.close()
        return SINK_ROWS * SINK_BATCHES

    base = _best(plain)
    got = _best(ours)
    print(f"sink: headrace {got:,.0f} rows/s vs write_deltalake {base:,.0f} rows/s ({SINK_BATCHES} batches of "
          f"{SINK_ROWS:,}) -> ratio {got / base:.2f} (goal >= 0.8)")  # fmt: skip


def _many_versions(path: str, n: int) -> None:
    """A table with ``n`` versions, written fast: commits made by hand after the first
    (each adds one small file), with a checkpoint every 100 versions as Delta writers do."""
    write_deltalake(path, pa.table({"v": pa.array([0], pa.int64())}))
    for v in range(1, n):
        _hand_commit(path, v, v)
        if v % 100 == 0:
            DeltaTable(path).create_checkpoint()


def _hand_commit(path: str, version: int, value: int) -> None:
    """Append one row as version ``version``: a Parquet file and a JSON commit, written directly
    (a stand-in for another writer, so the timed process does no delta-rs writes)."""
    import json
    import uuid

    name = f"part-{uuid.uuid4().hex}.parquet"
    pq.write_table(pa.table({"v": pa.array([value], pa.int64())}), os.path.join(path, name))
    size = os.path.getsize(os.path.join(path, name))
    ts = 1_700_000_000_000 + version
    with open(os.path.join(path, "_delta_log", f"{version:020d}.json"), "x") as f:
        f.write(json.dumps({"commitInfo": {"timestamp": ts, "operation": "WRITE"}}) + "\n")
        f.write(json.dumps({"add": {"path": name, "partitionValues": {}, "size": size,
                                    "modificationTime": ts, "dataChange": True}}) + "\n")  # fmt: skip


def bench_trigger(root: str) -> None:
    spec = registry().get("delta")
    times = {}
    for n in (10, 10_000):
        path = os.path.join(root, f"versions{n}")
        _many_versions(path, n)
        opts = spec.source_options.parse({"path": path, "startingVersion": "latest"}, connector="delta", role="source")
        src = spec.load_source()(opts, SourceContext(query_id="bench"))
        start = src.initial_offset()
        samples: list[float] = []
        for k in range(15):
            _hand_commit(path, n + k, k)
            t = time.perf_counter()
            end = src.latest_offset(start, ReadLimit(max_files=1000))
            rows = sum(b.num_rows for p in src.partitions(start, end) for b in src.read(p))
            src.commit(end)
            samples.append(time.perf_counter() - t)
            assert rows == 1
            start = end
        times[n] = sorted(samples)[len(samples) // 2]
        src.close()
    print(f"trigger (median of 15): {times[10_000] * 1000:.2f} ms with 10,000 versions vs {times[10] * 1000:.2f} ms "
          f"with 10 -> ratio {times[10_000] / times[10]:.2f} (goal <= 2)")  # fmt: skip


def main() -> None:
    root = tempfile.mkdtemp(prefix="headrace-bench-delta-")
    try:
        bench_source(root)
        bench_sink(root)
        bench_trigger(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
