"""Real-time latency bookkeeping stays bounded whatever the rate and the interval."""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable
from typing import cast

from headrace.engine.real_time import LatencyReservoir, RealTimeStats


def test_reservoir_keeps_at_most_its_capacity() -> None:
    r = LatencyReservoir(100, random.Random(1))
    for _ in range(1000):
        r.extend(1000, float)
    assert len(r.items) == 100
    assert r.seen == 1_000_000


def test_reservoir_is_a_uniform_sample() -> None:
    r = LatencyReservoir(2000, random.Random(7))
    for chunk in range(100):
        r.extend(1000, cast(Callable[[int], float], lambda i, c=chunk: float(c * 1000 + i)))
    # a uniform sample of 0..99,999 has its median near 50,000 and covers the whole range
    assert 45_000 < statistics.median(r.items) < 55_000
    assert min(r.items) < 5_000 and max(r.items) > 95_000


def test_reservoir_computes_only_the_values_it_keeps() -> None:
    calls = [0]

    def value(i: int) -> float:
        calls[0] += 1
        return float(i)

    r = LatencyReservoir(1000, random.Random(3))
    for _ in range(1000):
        r.extend(10_000, value)
    assert calls[0] < 50_000  # 10M values offered


def test_stats_of_ten_million_rows_are_cheap_and_bounded() -> None:
    stats = RealTimeStats(capacity=4096)
    times = [float(i) for i in range(10_000)]
    t0 = time.monotonic()
    for k in range(1000):
        stats.add(20_000.0 + k, 20_001.0 + k, 10_000, times)
    lat = stats.latencies()
    assert time.monotonic() - t0 < 5
    assert all(len(v) <= 4096 for v in lat.values())
    assert all(0 <= x <= 25_000 for x in lat["e2eLatencyMs"])
