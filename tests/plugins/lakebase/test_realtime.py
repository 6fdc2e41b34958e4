"""The real-time trigger: rate -> lakebase, rows flushed by batchsize / batchinterval while the
long-running batch is still open."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import headrace as hr

Query = Callable[..., list[tuple[Any, ...]]]


def test_real_time_flushes_inside_the_long_batch(pg_options: dict[str, Any], table: str, query: Query, tmp_path: Path) -> None:
    q = (hr.read_stream.format("rate").option("rowsPerSecond", 400).load()
         .write_stream.format("lakebase").options(pg_options).option("upsertkey", "value")
         .option("batchsize", 50).option("batchinterval", "50 milliseconds")
         .option("checkpointLocation", str(tmp_path / "chk")).trigger(real_time="30 seconds").start())  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        seen = 0
        while seen < 200:  # rows arrive while batch 0 is still running
            assert time.monotonic() < deadline, f"only {seen} rows visible after 30 s"
            exists = query("SELECT to_regclass(%s)", (f"public.{table}",))[0][0]
            seen = query(f"SELECT count(*) FROM {table}")[0][0] if exists else 0
            time.sleep(0.02)
        assert q.recent_progress == [], "batch 0 ended before rows were checked"
        chunks = query("SELECT row_end - row_start FROM _headrace_lakebase_commits WHERE target = %s AND batch_id = 0 AND chunk >= 0",
                       (f"public.{table}",))  # fmt: skip
        sizes = [c[0] for c in chunks]
        assert len(sizes) >= 4 and max(sizes) <= 50
    finally:
        q.stop()
    assert q.exception() is None
    end = q.last_progress["sources"][0]["endOffset"]["rows"]  # type: ignore[index]
    assert query(f"SELECT count(*), count(DISTINCT value), min(value), max(value) FROM {table}") == [(end, end, 0, end - 1)]
