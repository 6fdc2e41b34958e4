"""The lakebase sink's bookkeeping across ``headrace checkpoint reset`` on a real PostgreSQL: in
insert mode (no keys) a rolled-back batch that was committed to the table is skipped when the
engine replays it (reported in numRowsSkipped, as the delta and files sinks do), never written
twice; the bookkeeping table keeps only the last committed batch's chunks and its mark."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from headrace.cli import main
from tests.plugins.lakebase.helpers import run_query

Query = Callable[..., list[tuple[Any, ...]]]


@pytest.mark.parametrize(("to_batch", "force"), [(0, False), (-1, True)], ids=["reset", "reset-force-to-start"])
def test_insert_mode_skips_committed_batches_replayed_after_a_reset(
    pg_options: dict[str, Any], table: str, query: Query, tmp_path: Path, to_batch: int, force: bool
) -> None:
    chk = str(tmp_path / "chk")
    first = run_query(pg_options, checkpoint=chk, rows=40, per_batch=10)
    assert first.exception() is None and [p["batchId"] for p in first.recent_progress] == [0, 1, 2, 3]
    assert query(f"SELECT count(*), count(DISTINCT value) FROM {table}") == [(40, 40)]
    assert main(["checkpoint", "reset", chk, "--to-batch", str(to_batch), *(["--force"] if force else [])]) == 0

    again = run_query(pg_options, checkpoint=chk, rows=40, per_batch=10)
    assert again.exception() is None
    replayed = [p for p in again.recent_progress if p["numInputRows"]]
    assert [p["batchId"] for p in replayed] == list(range(to_batch + 1, 4))
    for p in replayed:  # the table already holds these batches: skipped, not output
        assert p["sink"]["numOutputRows"] == 0
        assert p["sink"]["metrics"]["numRowsSkipped"] == p["numInputRows"] == 10
    assert query(f"SELECT count(*), count(DISTINCT value) FROM {table}") == [(40, 40)], "a batch was written twice"

    more = run_query(pg_options, checkpoint=chk, rows=60, per_batch=10)  # new batches are written as before
    assert [p["sink"]["numOutputRows"] for p in more.recent_progress if p["numInputRows"]] == [10, 10]
    assert query(f"SELECT count(*), count(DISTINCT value) FROM {table}") == [(60, 60)]
    marks = query("SELECT batch_id, writer, chunk FROM _headrace_lakebase_commits WHERE target = %s AND chunk = -1",
                  (f"public.{table}",))  # fmt: skip
    assert marks == [(5, "#committed", -1)]  # one mark, the last committed batch; older rows deleted
    assert query("SELECT DISTINCT batch_id FROM _headrace_lakebase_commits WHERE target = %s",
                 (f"public.{table}",)) == [(5,)]  # fmt: skip


def test_upsert_mode_applies_replayed_batches_again(pg_options: dict[str, Any], table: str, query: Query,
                                                    tmp_path: Path) -> None:  # fmt: skip
    """With keys a replay is idempotent: batch 1 (its chunks forgotten) is applied again, batch 2
    (the last committed, its chunks still recorded) is skipped; the table is the same either way."""
    chk = str(tmp_path / "chk")
    opts = {**pg_options, "upsertkey": "value"}
    run_query(opts, checkpoint=chk, rows=30, per_batch=10)
    assert main(["checkpoint", "reset", chk, "--to-batch", "0"]) == 0
    again = run_query(opts, checkpoint=chk, rows=30, per_batch=10)
    assert [p["sink"]["numOutputRows"] for p in again.recent_progress if p["numInputRows"]] == [10, 0]
    assert query(f"SELECT count(*), count(DISTINCT value) FROM {table}") == [(30, 30)]
