"""Benchmark of change data capture both ways, in one run:

1. ``source``: changes/s through the lakebase change source (engine, available-now, noop sink)
   vs a plain loop of ``pg_logical_slot_peek_binary_changes`` + pgoutput decoding of every
   message (``headrace_lakebase.pgoutput.decode``) on another slot holding the same changes;
   each measured twice, alternated, best of two. Goal: ratio >= 0.8.
2. ``pg->delta``: end-to-end PostgreSQL -> Delta SCD type 1 (change source -> delta sink with
   keys / sequenceBy / applyAsDeletes), changes/s. Goal >= 20,000/s.
3. ``delta->pg``: a Delta table's change feed (appends then an UPDATE of half the rows) ->
   lakebase AUTO CDC, rows/s, vs the lakebase sink's plain upsert rate (the same number of
   rows from memory with upsertkey). Goal: ratio >= 0.8.
4. ``--tombstones``: the cost of delete tombstones (on by default): 2. and 3. (AUTO CDC only)
   with the default ``tombstoneRetention`` and with ``tombstoneRetention=0``, interleaved
   A, B, A, B, best of two each.
5. ``--tombstone-history``: the delta sink's tombstone step alone (``TombstoneStore.apply``,
   what the sink's commit runs before the MERGE, fsyncs included) per batch of 10,000 events
   (half late upserts of deleted keys, 10% new deletes) after K earlier tombstones, K = 10,000
   and 200,000 (``--full``: 1,000,000); ``--baseline FILE`` adds another implementation of the
   same ``apply`` (e.g. an older ``_tombstones.py``), interleaved A, B, A, B, best of two.
   No PostgreSQL.

The workload: a table (id bigint PK, v bigint, s text, ts timestamptz) with REPLICA IDENTITY
FULL; N inserts in transactions of 1,000 rows, then N/2 updates and N/10 deletes (so about
1.6 N changes, update pre-images included in the source figure).

Run from the repository root: ``.venv/bin/python bench/cdc.py`` (N = 20,000) or ``--full``
(N = 300,000). Starts its own PostgreSQL (tests/services). Measures and prints; asserts nothing.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402
import pyarrow as pa  # noqa: E402

import headrace as hr  # noqa: E402
from headrace.testing import memory_stream  # noqa: E402
from headrace_lakebase.pgoutput import decode  # noqa: E402
from tests.services import Postgres  # noqa: E402

TABLE = "bench_src"
CDC_PG = {"keys": "id", "sequenceBy": "_lsn", "applyAsDeletes": "_change_type = 'delete'",
          "exceptColumnList": "_change_type,_lsn,_commit_timestamp"}  # fmt: skip
CDC_DELTA = {"keys": "id", "sequenceBy": "_commit_version", "applyAsDeletes": "_change_type = 'delete'",
             "exceptColumnList": "_change_type,_commit_version,_commit_timestamp"}  # fmt: skip


def workload(conn: psycopg.Connection, n: int) -> None:
    for lo in range(0, n, 1000):
        conn.execute(
            f"INSERT INTO {TABLE} SELECT g, g * 7, 'name-' || (g %% 977), now() FROM generate_series(%s::bigint, %s::bigint) g",
            (lo, min(n, lo + 1000) - 1),
        )
    for lo in range(0, n // 2, 1000):
        conn.execute(f"UPDATE {TABLE} SET v = v + 1 WHERE id >= %s AND id < %s", (lo, min(n // 2, lo + 1000)))
    for lo in range(0, n // 10, 1000):
        conn.execute(f"DELETE FROM {TABLE} WHERE id >= %s AND id < %s", (n - n // 10 + lo, min(n, n - n // 10 + lo + 1000)))


def plain_peek(dsn: str, slot: str, pub: str, page: int) -> tuple[int, float]:
    """Peek everything (pages of ``page`` messages, advancing as it goes) and decode each message."""
    changes = 0
    t0 = time.perf_counter()
    with psycopg.connect(dsn, autocommit=True) as c:
        while True:
            rows = c.execute(
                "SELECT lsn, data FROM pg_logical_slot_peek_binary_changes(%s, NULL, %s, 'proto_version', '1', "
                "'publication_names', %s)",
                (slot, page, pub),
            ).fetchall()
            if not rows:
                break
            last = None
            for lsn, data in rows:
                msg = decode(bytes(data))
                if data[0] in (73, 85, 68):  # I, U, D
                    changes += 1 + (data[0] == 85)  # an update is a pre- and a post-image
                del msg
                last = lsn
            c.execute("SELECT pg_replication_slot_advance(%s, %s)", (slot, last))
            if len(rows) < page:
                break
    return changes, time.perf_counter() - t0


def through_source(dsn: str, slot: str, pub: str, limit: int, work: Path) -> tuple[int, float]:
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    q = (hr.read_stream.format("postgresql").options(url=dsn, dbtable=TABLE, slotName=slot, publicationName=pub,
                                                     snapshotMode="never", maxChangesPerTrigger=limit).load()
         .write_stream.format("noop").option("checkpointLocation", str(work / "chk-src"))
         .trigger(available_now=True).start())  # fmt: skip
    q.await_termination()
    rows = sum(p["numInputRows"] for p in q.recent_progress)
    return rows, time.perf_counter() - t0


def pg_to_delta(dsn: str, slot: str, pub: str, limit: int, work: Path, extra: dict | None = None) -> tuple[int, float]:
    t0 = time.perf_counter()
    q = (hr.read_stream.format("postgresql").options(url=dsn, dbtable=TABLE, slotName=slot, publicationName=pub,
                                                     snapshotMode="never", maxChangesPerTrigger=limit).load()
         .write_stream.format("delta").options({**CDC_PG, **(extra or {})})
         .option("checkpointLocation", str(work / f"chk-delta-{slot}"))
         .trigger(available_now=True).start(str(work / f"mirror-{slot}")))  # fmt: skip
    q.await_termination()
    rows = sum(p["numInputRows"] for p in q.recent_progress)
    return rows, time.perf_counter() - t0


def delta_to_pg(dsn: str, n: int, work: Path, run: int, extra: dict | None = None,
                plain_too: bool = True) -> tuple[tuple[int, float], tuple[int, float]]:  # fmt: skip
    from deltalake import DeltaTable, write_deltalake

    work = work / f"d2p{run}"
    src = work / "delta-src"
    for lo in range(0, n, max(1, n // 5)):
        ids = pa.array(range(lo, min(n, lo + max(1, n // 5))), pa.int64())
        t = pa.table({"id": ids, "v": ids, "s": pa.array([f"name-{i % 977}" for i in ids.to_pylist()])})
        write_deltalake(str(src), t, mode="append", configuration={"delta.enableChangeDataFeed": "true"})
    DeltaTable(str(src)).update({"v": "v + 1"}, predicate=f"id < {n // 2}")
    t0 = time.perf_counter()
    q = (hr.read_stream.format("delta").options(path=str(src), readChangeFeed=True).load()
         .write_stream.format("postgresql").options(url=dsn, dbtable=f"bench_cdc_mirror{run}", batchsize=10000,
                                                    **CDC_DELTA, **(extra or {}))
         .option("checkpointLocation", str(work / "chk-d2p")).trigger(available_now=True).start())  # fmt: skip
    q.await_termination()
    cdc = (sum(p["numInputRows"] for p in q.recent_progress), time.perf_counter() - t0)
    if not plain_too:
        return cdc, cdc
    rows = n + n // 2
    ids = pa.array([i % n for i in range(rows)], pa.int64())
    data = pa.table({"id": ids, "v": ids, "s": pa.array([f"name-{i % 977}" for i in ids.to_pylist()])})
    stream = memory_stream(f"bench-cdc-plain{run}", data.schema)
    for b in data.to_batches(max_chunksize=max(1, rows // 4)):
        stream.add(pa.Table.from_batches([b]))
    t0 = time.perf_counter()
    q = (hr.read_stream.format("memory").option("name", f"bench-cdc-plain{run}").load()
         .write_stream.format("postgresql").options(url=dsn, dbtable=f"bench_plain_mirror{run}", batchsize=10000, upsertkey="id")
         .option("checkpointLocation", str(work / "chk-plain")).trigger(available_now=True).start())  # fmt: skip
    q.await_termination()
    plain = (rows, time.perf_counter() - t0)
    return cdc, plain


def tombstone_history(cls: type, folder: Path, earlier: int, batches: int = 10, size: int = 10_000) -> tuple[float, float]:
    """Median wall and process CPU seconds of one ``cls(folder, 2 days).apply`` per batch after
    ``earlier`` tombstones (recorded in batches of 100,000 before the timed ones)."""
    import resource
    import statistics

    import numpy as np

    from headrace.transforms.auto_cdc import DELETE, SEQ

    def events(ids: np.ndarray, seqs: np.ndarray, deletes: np.ndarray) -> pa.Table:
        order = np.argsort(ids)  # last_per_key's output is sorted by key
        return pa.table({"id": ids[order], SEQ: seqs[order], DELETE: deletes[order]})

    t = cls(str(folder), 2 * 86400.0)
    batch = 0
    for lo in range(0, earlier, 100_000):
        ids = np.arange(lo, min(earlier, lo + 100_000), dtype=np.int64)
        t.apply(events(ids, ids + 10**9, np.ones(len(ids), bool)), ["id"], batch)
        batch += 1
    if hasattr(t, "store") and t.store is not None:
        t.store.settle()  # the snapshot after the set-up out of the timed batches
    rng = np.random.default_rng(7)
    walls, cpus = [], []
    fresh = 10**10
    for _ in range(batches):
        late = rng.choice(max(earlier, 1), size // 2, replace=False).astype(np.int64)  # older than their deletes
        new = np.arange(fresh, fresh + size - len(late), dtype=np.int64)
        fresh += len(new)
        ids = np.concatenate([late, new])
        deletes = np.zeros(size, bool)
        deletes[len(late) :: 5] = True  # 1 in 5 of the new keys (10% of the batch) deleted
        ev = events(ids, np.full(size, 10**9 + 2 * 10**9, np.int64) - (np.arange(size) < len(late)) * 2 * 10**9, deletes)
        r0, w0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        t.apply(ev, ["id"], batch)
        w1, r1 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
        walls.append(w1 - w0)
        cpus.append(r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime)
        batch += 1
    if hasattr(t, "close"):
        t.close()
    return statistics.median(walls), statistics.median(cpus)


def history_main(full: bool, baseline: str | None) -> None:
    import importlib.util
    import os

    from headrace_delta._tombstones import TombstoneStore

    impls: list[tuple[str, type]] = [("state store", TombstoneStore)]
    if baseline:
        spec = importlib.util.spec_from_file_location("tombstones_baseline", baseline)
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        cls = next(getattr(mod, n) for n in ("TombstoneFile", "TombstoneStore") if hasattr(mod, n))
        impls.insert(0, (f"baseline {os.path.basename(baseline)}", cls))
    print(f"load average {os.getloadavg()[0]:.1f} (shared machine)")
    with tempfile.TemporaryDirectory() as tmp:
        for earlier in (10_000, 1_000_000 if full else 200_000):
            best: dict[str, tuple[float, float]] = {}
            for run in (1, 2):  # A, B, A, B
                for name, cls in impls:
                    w, c = tombstone_history(cls, Path(tmp) / f"{earlier}-{run}-{len(best)}-{name[:4]}", earlier)
                    if name not in best or w < best[name][0]:
                        best[name] = (w, c)
            for name, (w, c) in best.items():
                print(f"5. {earlier:>9,} earlier tombstones, {name:<30}: {w * 1e3:8.1f} ms/batch of 10,000 events "
                      f"(CPU {c * 1e3:7.1f} ms)")  # fmt: skip
        print(f"load average {os.getloadavg()[0]:.1f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--full", action="store_true", help="N = 300,000 (default 20,000)")
    ap.add_argument("--rows", type=int, default=None, help="N inserts (overrides --full)")
    ap.add_argument("--limit", type=int, default=100_000, help="maxChangesPerTrigger")
    ap.add_argument("--tombstones", action="store_true", help="only 4.: tombstones on vs off, interleaved")
    ap.add_argument("--tombstone-history", action="store_true",
                    help="only 5.: the tombstone step per batch after 10k vs 200k (--full: 1M) earlier tombstones")
    ap.add_argument("--baseline", default=None, help="5.: a _tombstones.py to compare with, interleaved")
    args = ap.parse_args()
    if args.tombstone_history:
        history_main(args.full, args.baseline)
        return
    n = args.rows or (300_000 if args.full else 20_000)
    settings = {"wal_level": "logical", "max_replication_slots": "10", "max_wal_senders": "10"}
    with Postgres(settings=settings) as pg, psycopg.connect(pg.dsn, autocommit=True) as conn, \
            tempfile.TemporaryDirectory() as tmp:  # fmt: skip
        work = Path(tmp)
        conn.execute(f"CREATE TABLE {TABLE} (id bigint PRIMARY KEY, v bigint, s text, ts timestamptz)")
        conn.execute(f"ALTER TABLE {TABLE} REPLICA IDENTITY FULL")
        conn.execute(f"CREATE PUBLICATION bench_pub FOR TABLE {TABLE}")
        for slot in ("plain1", "source1", "plain2", "source2", "delta", "tomb_on1", "tomb_off1", "tomb_on2", "tomb_off2"):
            conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        t0 = time.perf_counter()
        workload(conn, n)
        print(f"workload: {n:,} inserts, {n // 2:,} updates, {n // 10:,} deletes in {time.perf_counter() - t0:.1f} s")

        # one-time costs out of the timed runs: pyarrow imports pandas (when installed) on its
        # first pa.array() from Python values, about 1 s here, paid once per process
        import importlib.util

        if importlib.util.find_spec("pandas") is not None:
            import pandas  # noqa: F401
        from headrace.plugins import registry  # plugin discovery and connector imports, once per process

        for name in ("postgresql", "noop", "delta"):
            spec = registry().get(name)
            if spec.source:
                spec.load_source()
            if spec.sink:
                spec.load_sink()

        if args.tombstones:
            off = {"tombstoneRetention": "0"}
            on_d, off_d, on_p, off_p = [], [], [], []
            for i in (1, 2):  # A, B, A, B
                on_d.append(pg_to_delta(pg.dsn, f"tomb_on{i}", "bench_pub", args.limit, work))
                off_d.append(pg_to_delta(pg.dsn, f"tomb_off{i}", "bench_pub", args.limit, work, off))
                on_p.append(delta_to_pg(pg.dsn, n, work, 10 + i, plain_too=False)[0])
                off_p.append(delta_to_pg(pg.dsn, n, work, 20 + i, off, plain_too=False)[0])
            for what, a, b in (("PostgreSQL -> Delta SCD1", on_d, off_d), ("Delta -> PostgreSQL AUTO CDC", on_p, off_p)):
                (ac, at), (bc, bt) = min(a, key=lambda r: r[1]), min(b, key=lambda r: r[1])
                print(f"4. {what}: tombstones {ac / at:,.0f}/s, without {bc / bt:,.0f}/s, ratio {(ac / at) / (bc / bt):.2f}"
                      f"  (runs on: {', '.join(f'{c / t:,.0f}' for c, t in a)}; off: {', '.join(f'{c / t:,.0f}' for c, t in b)})")
            return

        # alternated twice, best of two each (the machine is shared)
        runs_p, runs_s = [], []
        for i in (1, 2):
            runs_p.append(plain_peek(pg.dsn, f"plain{i}", "bench_pub", args.limit))
            runs_s.append(through_source(pg.dsn, f"source{i}", "bench_pub", args.limit, work / f"s{i}"))
        pc, pt = min(runs_p, key=lambda r: r[1])
        sc, st = min(runs_s, key=lambda r: r[1])
        print(f"1. plain peek + decode : {pc:>9,} change rows in {pt:6.2f} s = {pc / pt:>10,.0f}/s")
        print(f"   change source       : {sc:>9,} change rows in {st:6.2f} s = {sc / st:>10,.0f}/s   "
              f"ratio {(sc / st) / (pc / pt):.2f} (goal >= 0.8)")  # fmt: skip
        dc, dt = pg_to_delta(pg.dsn, "delta", "bench_pub", args.limit, work)
        print(f"2. PostgreSQL -> Delta SCD1: {dc:,} changes in {dt:.2f} s = {dc / dt:,.0f}/s (goal >= 20,000/s)")
        runs = [delta_to_pg(pg.dsn, n, work, i) for i in (1, 2)]  # best of two each
        cc, ct = min((r[0] for r in runs), key=lambda r: r[1])
        uc, ut = min((r[1] for r in runs), key=lambda r: r[1])
        print(f"3. Delta -> PostgreSQL AUTO CDC: {cc:,} change rows in {ct:.2f} s = {cc / ct:,.0f}/s")
        print(f"   lakebase plain upsert      : {uc:,} rows in {ut:.2f} s = {uc / ut:,.0f}/s   "
              f"ratio {(cc / ct) / (uc / ut):.2f} (goal >= 0.8)")  # fmt: skip


if __name__ == "__main__":
    main()
