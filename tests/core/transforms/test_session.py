"""Session-window aggregations (append with a watermark, complete) for both state backends,
checked against DuckDB sessionising all input at once."""

from __future__ import annotations

import datetime as dt
import random
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pytest

from headrace.errors import UnsupportedError
from headrace.transforms.aggregate import AggregateOperator, aggregate_operator
from headrace.transforms.session import SessionWindowAggregateOperator
from headrace.transforms.window import session_window
from tests.core.transforms.stateful_harness import run_batches

BACKENDS = ["memory", "rocksdb"]
TS = pa.timestamp("us", tz="UTC")
T0 = 1_700_000_000
GAP = 10


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def events(rows: list[tuple[float, str, int]]) -> pa.Table:
    return pa.table({"ts": pa.array([int((T0 + s) * 1_000_000) for s, _, _ in rows], pa.int64()).cast(TS),
                     "user": [u for _, u, _ in rows], "amount": pa.array([a for _, _, a in rows], pa.int64())})  # fmt: skip


def duck_sessions(batches: list[pa.Table]) -> list[dict[str, Any]]:
    con = duckdb.connect()
    con.register("events", pa.concat_tables(batches))
    return con.sql(f"""
        WITH e AS (SELECT *, epoch_us(ts) AS t FROM events),
        l AS (SELECT *, CASE WHEN t - lag(t) OVER (PARTITION BY user ORDER BY t) < {GAP * 1_000_000} THEN 0 ELSE 1 END
              AS new FROM e),
        g AS (SELECT *, sum(new) OVER (PARTITION BY user ORDER BY t ROWS UNBOUNDED PRECEDING) AS sid FROM l)
        SELECT user, min(t) AS s, max(t) + {GAP * 1_000_000} AS e, count(*) AS n, sum(amount)::BIGINT AS total,
               max(amount) AS hi
        FROM g GROUP BY user, sid""").to_arrow_table().to_pylist()  # fmt: skip


def as_key(r: dict[str, Any]) -> tuple[Any, ...]:
    w = r["session_window"]
    us = lambda d: int(d.replace(tzinfo=dt.UTC).timestamp() * 1_000_000) if d.tzinfo is None else int(  # noqa: E731
        d.timestamp() * 1_000_000)
    return (r["user"], us(w["start"]), us(w["end"]))


def mk() -> AggregateOperator:
    return aggregate_operator([session_window("ts", f"{GAP} seconds"), "user"],
                              ["count(*) AS n", "sum(amount) AS total", "max(amount) AS hi"], watermark_column="ts")  # fmt: skip


def test_append_emits_each_closed_session_once(backend: str, tmp_path: Path) -> None:
    rng = random.Random(11)
    batches = []
    for b in range(8):
        rows = []
        for _ in range(40):
            rows.append((b * 30 + rng.uniform(0, 30), f"u{rng.randrange(4)}", rng.randrange(10)))
        batches.append(events(rows))
    flush = events([(10_000, "zz", 0)])
    run = run_batches(mk, [*batches, flush, flush.slice(0, 0)], state_path=str(tmp_path), backend=backend,
                      mode="append", watermark=("ts", 5_000))  # fmt: skip
    got = {as_key(r): (r["n"], r["total"], r["hi"]) for r in run.all_rows()}
    assert len(got) == len(run.all_rows()), "a session was emitted twice"
    want = {(r["user"], r["s"], r["e"]): (r["n"], r["total"], r["hi"]) for r in duck_sessions(batches)}
    assert got == want
    assert sum(m["numRowsDroppedByWatermark"] for m in run.metrics) == 0


def test_a_late_row_bridges_two_sessions(backend: str, tmp_path: Path) -> None:
    batches = [events([(0, "a", 1), (15, "a", 2)]),  # two sessions: [0,10) and [15,25)
               events([(8, "a", 4)]),  # watermark 10: joins them into [0, 25)
               events([(100, "b", 1)]),  # watermark 10: nothing closed yet
               events([(200, "b", 1)])]  # watermark 95: [0,25) closes  # fmt: skip
    run = run_batches(mk, batches, state_path=str(tmp_path), backend=backend, mode="append", watermark=("ts", 5_000))
    rows = run.all_rows()
    assert [(as_key(r), r["n"], r["total"]) for r in rows] == [
        (("a", T0 * 1_000_000, (T0 + 25) * 1_000_000), 3, 7)]  # fmt: skip


def test_late_rows_are_dropped(backend: str, tmp_path: Path) -> None:
    batches = [events([(0, "a", 1), (100, "a", 1)]), events([(50, "a", 1), (97, "a", 1)])]  # watermark 95
    run = run_batches(mk, batches, state_path=str(tmp_path), backend=backend, mode="append", watermark=("ts", 5_000))
    # 50 + 10 <= 95: late; 97 + 10 > 95: joins the session at 100
    assert run.metrics[1]["numRowsDroppedByWatermark"] == 1


def test_complete_mode_and_restart(backend: str, tmp_path: Path) -> None:
    rng = random.Random(5)
    batches = [events([(b * 20 + rng.uniform(0, 25), f"u{rng.randrange(3)}", rng.randrange(5)) for _ in range(30)])
               for b in range(5)]  # fmt: skip
    run = run_batches(mk, batches[:3], state_path=str(tmp_path), backend=backend, mode="complete")
    run = run_batches(mk, batches[3:], state_path=str(tmp_path), backend=backend, mode="complete", run=run)
    out = run.outputs[-1]
    assert out is not None
    got = {as_key(r): (r["n"], r["total"], r["hi"]) for r in out.to_pylist()}
    assert got == {(r["user"], r["s"], r["e"]): (r["n"], r["total"], r["hi"]) for r in duck_sessions(batches)}


def test_modes() -> None:
    op = mk()
    assert isinstance(op, SessionWindowAggregateOperator)
    assert not op.supports_real_time
    op.check_output_mode("append")
    op.check_output_mode("complete")
    with pytest.raises(UnsupportedError, match="Update output mode not supported for session window"):
        op.check_output_mode("update")
    no_wm = aggregate_operator([session_window("ts", "1 minute")], ["count(*)"])
    with pytest.raises(UnsupportedError, match="without watermark"):
        no_wm.check_output_mode("append")


def _counts(run: Any) -> list[tuple[int, int, int]]:
    return [(m["numRowsTotal"], m["numRowsUpdated"], m["numRowsRemoved"]) for m in run.metrics]


@pytest.mark.parametrize("restart_after", [None, 1, 2], ids=["one-run", "restart-after-1", "restart-after-2"])
def test_state_counts_are_sessions_as_spark(backend: str, tmp_path: Path, restart_after: int | None) -> None:
    """numRowsTotal counts sessions in state, numRowsUpdated the sessions written for the keys a
    batch touched (all of a touched key's sessions), numRowsRemoved the sessions a merge replaced
    or the watermark closed: SessionWindowStateStoreSaveExec's metrics (its state has one row per
    key and session start); the total carries over a restart."""
    batches = [events([(0, "a", 1), (15, "a", 2)]),  # a: [0,10) [15,25)
               events([(8, "a", 4)]),  # watermark 10: a's two sessions merge into [0,25) (one removed)
               events([(100, "b", 1)]),  # b: [100,110)
               events([(200, "b", 1)]),  # watermark 95: b: [100,110) [200,210) written; a's [0,25) closes
               events([(300, "c", 1)])]  # watermark 195: b's [100,110) closes; c: [300,310)  # fmt: skip
    kw: dict[str, Any] = {"state_path": str(tmp_path), "backend": backend, "mode": "append",
                          "watermark": ("ts", 5_000)}  # fmt: skip
    if restart_after is None:
        run = run_batches(mk, batches, **kw)
    else:
        run = run_batches(mk, batches[:restart_after], **kw)
        run = run_batches(mk, batches[restart_after:], run=run, **kw)
    assert _counts(run) == [(2, 2, 0), (1, 1, 1), (2, 1, 0), (2, 2, 1), (2, 1, 1)]
