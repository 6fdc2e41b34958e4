"""A real-time query keeps bounded memory whatever the rate and the interval, and ``stop()``
returns at once: rate at 200k rows/s into noop, one 10-minute interval."""

from __future__ import annotations

import os
import time

import headrace as hr
from headrace.testing import wait_for


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


def test_real_time_memory_is_bounded_and_stop_is_quick() -> None:
    q = (hr.read_stream.format("rate").option("rowsPerSecond", 200_000).load()
         .write_stream.format("noop").trigger(real_time="10 minutes").start())  # fmt: skip
    try:
        wait_for(lambda: q.status["message"].startswith("Processing new data (real-time)"), timeout=10)
        time.sleep(0.5)  # warm up: pools and buffers reach their working size
        base = rss_mb()
        growth = []
        for _ in range(6):  # 3 s at 200k rows/s: per-row bookkeeping would add tens of MB
            time.sleep(0.5)
            growth.append(rss_mb() - base)
        t0 = time.monotonic()
        q.stop()
        stopped_in = time.monotonic() - t0
    finally:
        q.stop()
    assert q.exception() is None
    assert stopped_in < 2.0, f"stop() took {stopped_in:.1f} s"
    progress = q.last_progress
    assert progress is not None and progress["numInputRows"] > 200_000, "the query ran at a high rate"
    assert max(growth) < 25, f"RSS grew by {max(growth):.1f} MB during one real-time interval: {growth}"
    e2e = progress["latencies"]["e2eLatencyMs"]
    assert set(e2e) == {"P0", "P50", "P90", "P95", "P99", "P100"}
