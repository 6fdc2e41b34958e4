"""trigger(real_time=...) kafka -> kafka: records flow as they arrive, latency metrics, restarts."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

import headrace as hr
from headrace.errors import UnsupportedError
from headrace.testing import run_pipeline
from tests.plugins.kafka.helpers import consume_all, int_values, produce, unique, wait_for


def relay(kafka: Any, tmp_path: Path, src: str, dst: str, interval: str = "1 second") -> hr.StreamingQuery:
    return (
        hr.read_stream.format("kafka")
        .options({"kafka.bootstrap.servers": kafka.bootstrap_servers, "subscribe": src, "startingOffsets": "earliest"})
        .load()
        .map_batches(lambda t: t.select(["key", "value"]))
        .write_stream.format("kafka")
        .options({"kafka.bootstrap.servers": kafka.bootstrap_servers, "topic": dst, "kafka.linger.ms": 0})
        .option("checkpointLocation", str(tmp_path / "chk"))
        .trigger(real_time=interval)
        .start()
    )


def test_records_flow_as_they_arrive_with_latency_metrics(kafka: Any, tmp_path: Path) -> None:
    src, dst = kafka.create_topic(unique("rt-in"), 2), kafka.create_topic(unique("rt-out"), 1)
    q = relay(kafka, tmp_path, src, dst, "2 seconds")
    try:
        time.sleep(0.3)  # let the long-running batch start before the first record
        produce(kafka.bootstrap_servers, src, range(50), partitions=2)
        # records arrive long before the 2 s interval closes the batch
        t0 = time.monotonic()
        got = consume_all(kafka.bootstrap_servers, dst, 1, expect=50, timeout=10)
        assert sorted(int_values(got)) == list(range(50))
        assert q.last_progress is None or (q.last_progress["batchId"] == 0 and time.monotonic() - t0 < 2)
        wait_for(lambda: q.last_progress is not None, what="the first real-time batch to close")
        prog = q.last_progress
        assert prog is not None
        assert prog["numInputRows"] == 50
        lat = prog["latencies"]
        for name in ("processingLatencyMs", "sourceQueuingLatencyMs", "e2eLatencyMs"):
            assert set(lat[name]) >= {"P50", "P90", "P95", "P99"}, lat
        assert 0 < lat["e2eLatencyMs"]["P99"] < 5000
        assert prog["sources"][0]["endOffset"] == {src: {"0": 25, "1": 25}}
        # a second interval continues from the checkpointed offsets
        produce(kafka.bootstrap_servers, src, range(50, 60), partitions=2)
        assert sorted(int_values(consume_all(kafka.bootstrap_servers, dst, 1, expect=60, timeout=10))) == list(range(60))
    finally:
        q.stop()
    assert q.exception() is None


def test_unsupported_pair_fails_at_start(kafka: Any, tmp_path: Path) -> None:
    src = kafka.create_topic(unique(), 1)
    with pytest.raises(UnsupportedError, match="sink 'files' does not support it"):
        (hr.read_stream.format("kafka").options({"kafka.bootstrap.servers": kafka.bootstrap_servers, "subscribe": src})
         .load().write_stream.format("files").option("path", str(tmp_path / "o"))
         .option("checkpointLocation", str(tmp_path / "c")).trigger(real_time="1 minute").start())  # fmt: skip


def test_kill_in_real_time_mode_replays_at_most_an_interval(kafka: Any, tmp_path: Path) -> None:
    src, dst = kafka.create_topic(unique("rt-in"), 2), kafka.create_topic(unique("rt-out"), 1)
    produce(kafka.bootstrap_servers, src, range(200), partitions=2)
    spec = {
        "source": {"format": "kafka", "options": {"kafka.bootstrap.servers": kafka.bootstrap_servers, "subscribe": src,
                                                  "startingOffsets": "earliest"}},
        "transform": "tests.plugins.kafka.helpers:select_key_value",
        "sink": {"format": "kafka", "options": {"kafka.bootstrap.servers": kafka.bootstrap_servers, "topic": dst}},
        "checkpoint": str(tmp_path / "chk"),
        "trigger": {"real_time": "500 milliseconds"},
        "run_for": 1.5,
    }  # fmt: skip
    assert run_pipeline(spec, crash="mid_write:0", timeout=60).killed  # dies inside the first interval
    produce(kafka.bootstrap_servers, src, range(200, 300), partitions=2)
    run_pipeline(spec, timeout=60).check()
    got = int_values(consume_all(kafka.bootstrap_servers, dst, 1, expect=300, timeout=20))
    assert set(got) == set(range(300))  # at least once: the killed interval may be written twice
