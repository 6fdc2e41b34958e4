"""Engine overhead: rate-micro-batch -> noop through headrace vs iterating the same Arrow batches.

What it measures (the engine's fixed cost per batch, which small batches feel):

- ``direct``: the same batches read straight from the source class (latest_offset, partitions,
  read), no engine, no checkpoint: the time of a batch spent on its rows.
- ``headrace``: the query, ``trigger(available_now=True)``, with a checkpoint on local disk and
  ``checkpointFsync`` on (durable offsets entries and commit markers), the default; and the
  same with ``checkpointFsync=false``.
- **per-batch overhead** = median time between two batch ends through headrace (taken in an
  ``on_progress`` callback) - median time of one direct batch; and the mean the same way
  ((wall - direct wall) / batches). Both include everything per batch: offsets log, commit
  markers, source commits, progress report, history, listener plugins, thread hand-offs.
- rows/s both ways and their ratio, at 64k-row and 1M-row batches; the whole time of a 1-row
  batch (median between batch ends, fsync on: all of it is overhead).

Every variant runs interleaved (direct, durable, not durable, 1-row; three times) so that a
shared machine's noise falls on all of them; CPU time per batch (user + system, all threads) and
minor page faults per batch are printed too (memory the allocator handed back to the kernel
between batches and faulted in again: hundreds a batch once cost ~0.4 ms, see
docs/performance.md). Installed listener plugins (e.g. headrace-prometheus) are part of the default figures;
``--no-listeners`` also measures without them (the engine alone).

    .venv/bin/python bench/core_overhead.py [--batches 300] [--rows 65536] [--rounds 3] [--big-batches 100] [--no-listeners]
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import resource
import statistics
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass

import headrace as hr
from headrace.plugins import registry
from headrace.protocols import ReadLimit, SourceContext


@dataclass
class Run:
    rows_per_s: float
    per_batch_ms: float  # median
    mean_batch_ms: float
    cpu_ms: float  # user + system per batch, all threads
    fixed_ms: float = 0.0  # start to first batch end + last batch end to termination (query start and stop)
    faults: float = 0.0  # minor page faults per batch (whole process): memory handed back and faulted in again


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def direct(rows: int, batches: int, partitions: int) -> Run:
    """The same batches, read straight from the source class: no engine, no checkpoint."""
    spec = registry().get("rate-micro-batch")
    opts = spec.source_options.parse({"rowsPerBatch": rows, "totalRows": rows * batches, "numPartitions": partitions})
    src = spec.load_source()(opts, SourceContext())
    start = src.initial_offset()
    n = 0
    times = []
    f0, c0 = _faults(), _cpu()
    t = time.perf_counter()
    for _ in range(batches):
        tb = time.perf_counter()
        end = src.latest_offset(start, ReadLimit(max_rows=rows))
        for p in src.partitions(start, end):
            for b in src.read(p):
                n += b.num_rows
        start = end
        times.append(time.perf_counter() - tb)
    elapsed = time.perf_counter() - t
    assert n == rows * batches
    return Run(n / elapsed, statistics.median(times) * 1e3, elapsed / batches * 1e3, (_cpu() - c0) / batches * 1e3,
               faults=(_faults() - f0) / batches)


def engine(rows: int, batches: int, partitions: int, fsync: bool = True) -> tuple[Run, list[dict]]:
    progress: list[dict] = []
    ends: list[float] = []

    def on_progress(p: hr.QueryProgress) -> None:
        ends.append(time.perf_counter())
        progress.append(p.to_dict())

    with tempfile.TemporaryDirectory() as chk:
        f0, c0 = _faults(), _cpu()
        t = time.perf_counter()
        q = (hr.read_stream.format("rate-micro-batch")
             .options(rowsPerBatch=rows, totalRows=rows * batches, numPartitions=partitions).load()
             .write_stream.format("noop").option("checkpointLocation", chk)
             .option("checkpointFsync", fsync)
             .on_progress(on_progress)
             .trigger(available_now=True).start())  # fmt: skip
        q.await_termination()
        elapsed = time.perf_counter() - t
        cpu = _cpu() - c0
        faults = _faults() - f0
    n = sum(p["numInputRows"] for p in progress)
    assert n == rows * batches, n
    gaps = [b - a for a, b in itertools.pairwise(ends)] or [elapsed]
    fixed = (ends[0] - t) + (t + elapsed - ends[-1]) if ends else elapsed
    return Run(n / elapsed, statistics.median(gaps) * 1e3, elapsed / batches * 1e3, cpu / batches * 1e3,
               fixed * 1e3, faults / batches), progress


@contextlib.contextmanager
def without_listeners() -> Iterator[list[str]]:
    """Unregister the plugins that listen to progress (for the engine-alone figures)."""
    pm = registry().pm
    registry().hook  # noqa: B018 - loads the entry points
    gone = [(name, plugin) for name, plugin in pm.list_name_plugin()
            if name and any(i.plugin is plugin for i in pm.hook.headrace_query_progress.get_hookimpls())]  # fmt: skip
    for _, plugin in gone:
        pm.unregister(plugin)
    try:
        yield [name for name, _ in gone]
    finally:
        for name, plugin in gone:
            pm.register(plugin, name=name)


def listeners() -> list[str]:
    pm = registry().pm
    registry().hook  # noqa: B018 - loads the entry points
    return [pm.get_name(i.plugin) or "?" for i in pm.hook.headrace_query_progress.get_hookimpls()]


def compare(rows: int, batches: int, partitions: int, rounds: int, alone: bool) -> dict[str, list[Run]]:
    """Every variant once per round, interleaved (also with and without listener plugins), so
    that the machine's noise falls on all of them alike."""
    out: dict[str, list[Run]] = {k: [] for k in ("direct", "durable", "nosync", "durable-alone", "nosync-alone", "tiny")}
    for _ in range(rounds):
        out["direct"].append(direct(rows, batches, partitions))
        out["durable"].append(engine(rows, batches, partitions)[0])
        out["nosync"].append(engine(rows, batches, partitions, fsync=False)[0])
        out["tiny"].append(engine(1, batches, 1)[0])
        if alone:
            with without_listeners():
                out["durable-alone"].append(engine(rows, batches, partitions)[0])
                out["nosync-alone"].append(engine(rows, batches, partitions, fsync=False)[0])
    return out


def med(runs: list[Run], attr: str) -> float:
    return statistics.median(getattr(r, attr) for r in runs)


def report(res: dict[str, list[Run]]) -> None:
    d = res["direct"]
    print(f"  direct iteration        : {med(d, 'rows_per_s'):>14,.0f} rows/s, {med(d, 'per_batch_ms'):.3f} ms a batch "
          f"(median), cpu {med(d, 'cpu_ms'):.3f} ms a batch, {med(d, 'faults'):.0f} page faults a batch")
    variants = (("durable", "headrace, fsync on"), ("nosync", "headrace, fsync off"),
                ("durable-alone", "fsync on, no listeners"), ("nosync-alone", "fsync off, no listeners"))  # fmt: skip
    base = med(d, "per_batch_ms")
    for key, label in variants:
        r = res[key]
        if not r:
            continue
        over = med(r, "per_batch_ms") - med(d, "per_batch_ms")
        mean_over = med(r, "mean_batch_ms") - med(d, "mean_batch_ms")
        print(f"  {label:<24}: {med(r, 'rows_per_s'):>14,.0f} rows/s, ratio {med(r, 'rows_per_s') / med(d, 'rows_per_s'):.2f}; "
              f"per-batch overhead median {over:.3f} ms (mean {mean_over:.3f} ms); cpu {med(r, 'cpu_ms'):.3f} ms a batch; "
              f"{med(r, 'faults'):.0f} page faults a batch; start + stop {med(r, 'fixed_ms'):.0f} ms; rounds "
              f"{', '.join(f'{x.per_batch_ms - base:.3f}' for x in r)} ms")
    tiny = res["tiny"]
    print(f"  batches of 1 row, fsync on: {med(tiny, 'per_batch_ms'):.3f} ms a batch (median between batch ends; "
          f"rounds {', '.join(f'{t.per_batch_ms:.3f}' for t in tiny)}), cpu {med(tiny, 'cpu_ms'):.3f} ms a batch")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, default=300)
    ap.add_argument("--rows", type=int, default=65536)
    ap.add_argument("--partitions", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--big-batches", type=int, default=100, help="batches of the 1M-row comparison")
    ap.add_argument("--no-listeners", action="store_true", help="also measure without progress listener plugins")
    args = ap.parse_args()
    engine(args.rows, 5, args.partitions)  # warm up imports and caches
    direct(args.rows, 5, args.partitions)
    names = listeners()
    print(f"rate-micro-batch -> noop, {args.batches} batches of {args.rows:,} rows, {args.partitions} partition(s); "
          f"listener plugins: {', '.join(names) or 'none'} (goal: overhead < 0.5 ms)")
    report(compare(args.rows, args.batches, args.partitions, args.rounds, args.no_listeners))
    # 100 batches: with 20, a batch of 1M rows read in ~1 ms made the ratio mostly query start + stop
    big_rows, big_batches = 1 << 20, args.big_batches
    big_base = direct(big_rows, big_batches, args.partitions)
    big_ours = engine(big_rows, big_batches, args.partitions)[0]
    print(f"  at {big_rows:,}-row batches ({big_batches}): direct {big_base.rows_per_s:,.0f} rows/s, headrace "
          f"{big_ours.rows_per_s:,.0f} rows/s, ratio {big_ours.rows_per_s / big_base.rows_per_s:.2f}; per-batch overhead "
          f"median {big_ours.per_batch_ms - big_base.per_batch_ms:.3f} ms; start + stop {big_ours.fixed_ms:.0f} ms")


if __name__ == "__main__":
    main()
