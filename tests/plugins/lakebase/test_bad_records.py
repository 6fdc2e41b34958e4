"""lakebase under the shared bad-record policy (headrace.badrecords): rows PostgreSQL refuses
(CHECK, NOT NULL, unique, out of range) dropped or dead-lettered, exactly once across SIGKILLs."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import headrace as hr
from headrace.badrecords import read_dead_letters
from headrace.testing import run_until_done

Query = Callable[..., list[tuple[Any, ...]]]


def _bad(v: int) -> bool:
    return v % 7 == 3


def _run(pg_options: dict[str, Any], tmp_path: Path, total: int, **opts: Any) -> hr.StreamingQuery:
    q = (hr.read_stream.format("rate-micro-batch").options(rowsPerBatch=50, totalRows=total).load()
         .write_stream.format("lakebase").options({**pg_options, "batchsize": 20, **opts})
         .option("checkpointLocation", str(tmp_path / "chk")).trigger(available_now=True).start())  # fmt: skip
    q.await_termination(60)
    return q


def test_rows_refused_by_a_check_constraint_are_dead_lettered(pg_options: dict[str, Any], table: str, query: Query,
                                                             tmp_path: Path) -> None:  # fmt: skip
    query(f"CREATE TABLE {table} (value bigint CHECK (value % 7 <> 3), timestamp timestamptz)")
    q = _run(pg_options, tmp_path, 150, badRecordsPolicy="deadLetter", badRecordsPath=str(tmp_path / "dlq"))
    assert [v for (v,) in query(f"SELECT value FROM {table} ORDER BY value")] == [v for v in range(150) if not _bad(v)]
    letters = read_dead_letters(str(tmp_path / "dlq"))
    assert sorted(json.loads(x["record"])["value"] for x in letters) == [v for v in range(150) if _bad(v)]
    assert {x["origin"] for x in letters} == {"sink-lakebase"}
    assert all("violates check constraint" in x["error"] and "SQLSTATE 23514" in x["error"] for x in letters)
    assert letters[0]["location"].startswith(f"public.{table} batch 0 writer local:")
    sink = [p["sink"]["metrics"] for p in q.recent_progress]
    assert sum(m["numBadRecordsDeadLettered"] for m in sink) == len(letters)


def test_drop_with_upsert_keys_and_a_not_null_column(pg_options: dict[str, Any], table: str, query: Query,
                                                     tmp_path: Path) -> None:  # fmt: skip
    query(f"CREATE TABLE {table} (value bigint PRIMARY KEY, timestamp timestamptz, "
          f"CONSTRAINT small CHECK (value < 120))")  # fmt: skip
    q = _run(pg_options, tmp_path, 150, badRecordsPolicy="drop")
    assert [v for (v,) in query(f"SELECT value FROM {table} ORDER BY value")] == list(range(120))
    assert sum(p["sink"]["metrics"]["numBadRecordsDropped"] for p in q.recent_progress) == 30


def test_over_the_threshold_the_query_fails(pg_options: dict[str, Any], table: str, query: Query, tmp_path: Path) -> None:
    query(f"CREATE TABLE {table} (value bigint CHECK (value % 7 <> 3), timestamp timestamptz)")
    with pytest.raises(hr.StreamingQueryException, match="more than maxBadRecordsFraction=0.1"):
        _run(pg_options, tmp_path, 150, badRecordsPolicy="drop", maxBadRecordsFraction=0.1)


def test_without_a_policy_a_refused_row_fails_the_query_as_before(pg_options: dict[str, Any], table: str, query: Query,
                                                                  tmp_path: Path) -> None:  # fmt: skip
    query(f"CREATE TABLE {table} (value bigint CHECK (value % 7 <> 3), timestamp timestamptz)")
    with pytest.raises(hr.StreamingQueryException, match="violates check constraint"):
        _run(pg_options, tmp_path, 150)


@pytest.mark.slow
def test_sigkill_at_every_stage_dead_letters_every_refused_row_exactly_once(
    pg_options: dict[str, Any], table: str, query: Query, tmp_path: Path
) -> None:
    total = 1200
    query(f"CREATE TABLE {table} (value bigint CHECK (value % 7 <> 3), timestamp timestamptz)")
    spec = {
        "source": {"format": "rate-micro-batch", "options": {"rowsPerBatch": 200, "totalRows": total, "numPartitions": 2}},
        "sink": {"format": "lakebase", "options": {**pg_options, "batchsize": 60, "badRecordsPolicy": "deadLetter",
                                                   "badRecordsPath": str(tmp_path / "dlq")}},
        "checkpoint": str(tmp_path / "chk"),
        "trigger": {"available_now": True},
    }  # fmt: skip
    results = run_until_done(spec, crashes=["mid_write:0", "before_sink_commit:1", "after_sink_commit:2", "after_commit:3"],
                             random_kills=2, kill_window=(0.8, 1.6), timeout=90)  # fmt: skip
    assert sum(r.killed for r in results) >= 4
    assert query(f"SELECT count(*), count(DISTINCT value) FROM {table}") == [(total - sum(map(_bad, range(total))),) * 2]
    assert [v for (v,) in query(f"SELECT value FROM {table} ORDER BY value")] == [v for v in range(total) if not _bad(v)]
    values = [json.loads(x["record"])["value"] for x in read_dead_letters(str(tmp_path / "dlq"))]
    assert len(values) == len(set(values)), "a refused row was dead-lettered twice"
    assert sorted(values) == [v for v in range(total) if _bad(v)]


def test_real_time_batches_settle_their_rejects(pg_options: dict[str, Any], table: str, query: Query, tmp_path: Path) -> None:
    from headrace.testing import wait_for

    query(f"CREATE TABLE {table} (value bigint CHECK (value % 7 <> 3), timestamp timestamptz)")
    q = (hr.read_stream.format("rate").option("rowsPerSecond", 200).load()
         .write_stream.format("lakebase").options({**pg_options, "batchsize": 50, "batchinterval": "100 milliseconds",
                                                   "badRecordsPolicy": "deadLetter", "badRecordsPath": str(tmp_path / "dlq")})
         .option("checkpointLocation", str(tmp_path / "chk")).trigger(real_time="1 second").start())  # fmt: skip
    try:
        wait_for(lambda: len(q.recent_progress) >= 2, timeout=30, what="two real-time batches")
    finally:
        q.stop()
    assert q.exception() is None
    values = [v for (v,) in query(f"SELECT value FROM {table} ORDER BY value")]
    refused = sorted(json.loads(x["record"])["value"] for x in read_dead_letters(str(tmp_path / "dlq")))
    assert values and not any(_bad(v) for v in values)
    assert sorted(values + refused) == list(range(len(values) + len(refused))), "a row lost or written twice"
    assert refused and all(_bad(v) for v in refused)
    assert sum(p["sink"]["metrics"]["numBadRecordsDeadLettered"] for p in q.recent_progress) == len(refused)
