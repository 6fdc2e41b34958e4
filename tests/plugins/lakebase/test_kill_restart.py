"""Failures mid-stream: PostgreSQL restarted under a running query, SIGKILL of the pipeline
process (engine crash points and random kills) with upserts of repeated keys."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import headrace as hr
from headrace.testing import run_pipeline
from tests.services import Postgres

Query = Callable[..., list[tuple[Any, ...]]]


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


@pytest.mark.parametrize("how", ["restart", "crash"])
def test_postgres_restart_mid_stream_loses_nothing(
    postgres_durable: Postgres, durable_pg_options: dict[str, Any], table: str, durable_query: Query,
    tmp_path: Path, how: str,
) -> None:
    """PostgreSQL (durable settings: a crash keeps every acknowledged commit) is shut down fast,
    or crashes (immediate shutdown, recovery from the WAL), under a running query: every row
    lands exactly once."""
    pg_options, query = durable_pg_options, durable_query
    total = 60_000
    q = (hr.read_stream.format("rate-micro-batch").options(rowsPerBatch=500, totalRows=total).load()
         .write_stream.format("lakebase").options(pg_options).option("batchsize", 250)
         .option("checkpointLocation", str(tmp_path / "chk")).trigger(available_now=True).start())  # fmt: skip

    def some_rows() -> bool:
        try:
            return bool(query(f"SELECT 1 FROM {table} LIMIT 1"))
        except Exception:
            return False

    wait_for(some_rows, 60, "the first rows")
    assert q.is_active, "the query ended before PostgreSQL could be restarted; raise totalRows"
    postgres_durable.crash_restart() if how == "crash" else postgres_durable.restart()
    q.await_termination(120)
    assert q.exception() is None
    assert query(f"SELECT count(*), count(DISTINCT value), min(value), max(value) FROM {table}") == [
        (total, total, 0, total - 1)
    ]
    retries = max(p["sink"]["metrics"]["numRetries"] for p in q.recent_progress)
    assert retries >= 1, "the restart did not hit the query (no retry recorded)"


def test_retries_run_out_and_the_query_fails_then_resumes(
    postgres: Postgres, pg_options: dict[str, Any], table: str, query: Query, tmp_path: Path
) -> None:
    opts = {**pg_options, "maxRetries": 2}
    chk = str(tmp_path / "chk")
    query(f"CREATE TABLE {table} (value bigint, timestamp timestamptz)")
    postgres.stop(cleanup=False)
    try:
        q = (hr.read_stream.format("rate-micro-batch").options(rowsPerBatch=100, totalRows=400).load()
             .write_stream.format("lakebase").options(opts).option("checkpointLocation", chk)
             .trigger(available_now=True).start())  # fmt: skip
        with pytest.raises(hr.StreamingQueryException, match=r"failed after 2 retries .*raise maxRetries"):
            q.await_termination(60)
    finally:
        postgres.start()
    q = (hr.read_stream.format("rate-micro-batch").options(rowsPerBatch=100, totalRows=400).load()
         .write_stream.format("lakebase").options(opts).option("checkpointLocation", chk)
         .trigger(available_now=True).start())  # fmt: skip
    q.await_termination(60)
    assert q.last_progress is not None and q.last_progress["batchId"] == 3
    assert query(f"SELECT count(*), count(DISTINCT value) FROM {table}") == [(400, 400)]


@pytest.mark.slow
@pytest.mark.parametrize(
    "mode, crash",
    [("upsert", "mid_write:2"), ("insert", "mid_write:2")],
    ids=["upsert-mid_write", "insert-mid_write"],
)  # fmt: skip
def test_sigkill_and_restart_exactly_once(
    mode: str, crash: str, pg_options: dict[str, Any], table: str, query: Query, tmp_path: Path
) -> None:
    rows = 3000
    upsert = mode == "upsert"
    spec = {
        "source": {"format": "rate-micro-batch", "options": {"rowsPerBatch": 600, "totalRows": rows, "numPartitions": 3}},
        "transform": "tests.plugins.lakebase.helpers:keyed_mod_100" if upsert else None,
        "sink": {"format": "lakebase", "options": {**pg_options, "batchsize": 250, **({"upsertkey": "k"} if upsert else {})}},
        "checkpoint": str(tmp_path / "chk"),
        "trigger": {"available_now": True},
    }  # fmt: skip
    assert run_pipeline(spec, crash=crash).killed
    run_pipeline(spec).check()
    if upsert:  # the last value of every key, whatever was replayed
        assert query(f"SELECT k, value FROM {table} ORDER BY k") == [(k, rows - 100 + k) for k in range(100)]
    else:  # every row exactly once, through the bookkeeping table alone
        assert query(f"SELECT count(*), count(DISTINCT value), min(value), max(value) FROM {table}") == [
            (rows, rows, 0, rows - 1)
        ]


@pytest.mark.slow
def test_sigkill_with_tombstones_and_out_of_order_events(pg_options: dict[str, Any], table: str, query: Query,
                                                          tmp_path: Path) -> None:  # fmt: skip
    """AUTO CDC with deletes and events arriving out of order across batches (older inserts after
    deletes): SIGKILL at every crash point; the table is each key's latest event, as computed
    from all events at once (the stored sequence guards live rows, the tombstones deleted ones)."""
    import os
    import random

    import pyarrow as pa
    from deltalake import write_deltalake

    from headrace.testing import CRASH_POINTS

    rng = random.Random(13)
    evs = []  # (id, v, seq, op), every sequence distinct
    for seq in rng.sample(range(1, 5000), 360):
        evs.append((rng.randrange(40), f"v{seq}", seq, "delete" if rng.random() < 0.3 else "upsert"))
    src = str(tmp_path / "events")
    for i in range(0, len(evs), 30):  # 12 commits, sequences shuffled across them
        part = evs[i:i + 30]
        write_deltalake(src, pa.table({"id": pa.array([e[0] for e in part], pa.int64()), "v": [e[1] for e in part],
                                       "seq": pa.array([e[2] for e in part], pa.int64()),
                                       "_change_type": [e[3] for e in part]}), mode="append")  # fmt: skip
    spec = {
        "source": {"format": "delta", "options": {"path": src, "maxFilesPerTrigger": 1}},
        "sink": {"format": "lakebase", "options": {**pg_options, "batchsize": 7, "keys": "id", "sequenceBy": "seq",
                                                   "applyAsDeletes": "_change_type = 'delete'",
                                                   "exceptColumnList": "_change_type"}},
        "checkpoint": str(tmp_path / "chk"),
        "trigger": {"available_now": True},
    }  # fmt: skip
    commits = tmp_path / "chk" / "commits"
    for point in [*(p for p in CRASH_POINTS if p != "mid_write"), "lakebase_between_bookkeeping_and_data", "mid_write"]:
        batch = max((int(n) for n in os.listdir(commits) if n.isdigit()), default=-1) + 1 if commits.is_dir() else 0
        r = run_pipeline(spec, crash=f"{point}:{batch}")
        assert r.killed or point == "mid_write", f"{point}:{batch} {r.stderr[-800:]}"
    run_pipeline(spec).check()
    latest: dict[int, tuple[str, int, str]] = {}
    for id_, v, seq, op in evs:
        if id_ not in latest or latest[id_][1] < seq:
            latest[id_] = (v, seq, op)
    expected = sorted((k, v) for k, (v, _, op) in latest.items() if op != "delete")
    assert query(f"SELECT id, v FROM {table} ORDER BY id") == expected
