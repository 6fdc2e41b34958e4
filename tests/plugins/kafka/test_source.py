"""The kafka source against librdkafka's mock cluster: columns, offsets, limits, data loss."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pytest
from confluent_kafka import Consumer, TopicPartition

import headrace as hr
from headrace.errors import DataLossError, HeadraceError
from headrace.plugins import registry
from headrace.protocols import ReadLimit, SourceContext
from headrace_kafka.source import KafkaSource
from tests.plugins.kafka.helpers import produce, unique, wait_for


def make_source(kafka: Any, **options: Any) -> KafkaSource:
    spec = registry().get("kafka")
    opts = spec.source_options.parse({"kafka.bootstrap.servers": kafka.bootstrap_servers, **options}, connector="kafka")
    return KafkaSource(opts, SourceContext(query_id=uuid.uuid4().hex))


def read_all(src: KafkaSource, start: dict[str, Any], end: dict[str, Any]) -> list[int]:
    return sorted(int(v) for p in src.partitions(start, end) for b in src.read(p) for v in b.column("value").to_pylist())


def run_query(kafka: Any, tmp_path: Path, trigger: dict[str, Any] | None = None, **options: Any) -> Any:
    name = unique("q").replace("-", "_")
    q = (hr.read_stream.format("kafka").options({"kafka.bootstrap.servers": kafka.bootstrap_servers, **options}).load()
         .write_stream.format("memory").query_name(name).option("checkpointLocation", str(tmp_path / name))
         .trigger(**(trigger or {"available_now": True})).start())  # fmt: skip
    return q, name


def test_columns_keys_headers_and_timestamps(kafka: Any, tmp_path: Path) -> None:
    topic = kafka.create_topic(unique(), 3)
    produce(kafka.bootstrap_servers, topic, range(30), partitions=3, key=lambda v: b"k%d" % v,
            headers=[("h", b"1"), ("h", b"2")], timestamp_ms=1_700_000_000_000)  # fmt: skip
    q, name = run_query(kafka, tmp_path, subscribe=topic, startingOffsets="earliest", includeHeaders=True)
    q.await_termination(60)
    t = hr.memory_table(name)
    assert t.column_names == ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType", "headers"]
    rows = t.to_pylist()
    assert sorted(int(r["value"]) for r in rows) == list(range(30))
    assert {r["partition"] for r in rows} == {0, 1, 2} and {r["topic"] for r in rows} == {topic}
    assert all(r["key"] == b"k" + r["value"] for r in rows)
    assert rows[0]["headers"] == [{"key": "h", "value": b"1"}, {"key": "h", "value": b"2"}]
    assert {r["timestampType"] for r in rows} == {0}
    assert {int(r["timestamp"].timestamp() * 1000) for r in rows} == {1_700_000_000_000}
    # offsets are per partition and gap-free
    for p in range(3):
        assert sorted(r["offset"] for r in rows if r["partition"] == p) == list(range(10))


def test_max_offsets_per_trigger_splits_by_lag(kafka: Any) -> None:
    topic = kafka.create_topic(unique(), 2)
    produce(kafka.bootstrap_servers, topic, range(90), partition=0)
    produce(kafka.bootstrap_servers, topic, range(90, 100), partition=1)
    src = make_source(kafka, subscribe=topic, startingOffsets="earliest", maxOffsetsPerTrigger=50)
    try:
        start = src.initial_offset()
        end = src.latest_offset(start, src.default_read_limit())
        assert end == {topic: {"0": 45, "1": 5}}
        assert len(read_all(src, start, end)) == 50
        m = src.metrics(end)
        assert m["offsetsOutstanding"] == 50 and m["partitionLag"] == {f"{topic}-0": 45, f"{topic}-1": 5}
    finally:
        src.close()


def test_min_offsets_per_trigger_waits_for_data_or_max_delay(kafka: Any) -> None:
    topic = kafka.create_topic(unique(), 1)
    produce(kafka.bootstrap_servers, topic, range(10))
    src = make_source(kafka, subscribe=topic, startingOffsets="earliest", minOffsetsPerTrigger=20, maxTriggerDelay="300ms")
    try:
        start = src.initial_offset()
        limit = src.default_read_limit()
        assert limit == ReadLimit(min_rows=20, max_trigger_delay=0.3)
        src._last_batch_at = time.monotonic()
        assert src.latest_offset(start, limit) == start  # 10 < 20 and the delay has not passed
        produce(kafka.bootstrap_servers, topic, range(10, 25))
        assert src.latest_offset(start, limit) == {topic: {"0": 25}}  # enough rows now
        produce(kafka.bootstrap_servers, topic, range(25, 30))
        after = {topic: {"0": 25}}
        src._last_batch_at = time.monotonic()  # as if the batch to 25 had just run
        assert src.latest_offset(after, limit) == after
        time.sleep(0.35)  # the delay is the behaviour under test
        assert src.latest_offset(after, limit) == {topic: {"0": 30}}
    finally:
        src.close()


def test_starting_offsets_json_and_missing_partitions(kafka: Any) -> None:
    topic = kafka.create_topic(unique(), 3)
    produce(kafka.bootstrap_servers, topic, range(30), partitions=3)
    src = make_source(kafka, subscribe=topic, startingOffsets=f'{{"{topic}": {{"0": -2, "1": -1, "2": 4}}}}')
    try:
        assert src.initial_offset() == {topic: {"0": 0, "1": 10, "2": 4}}
    finally:
        src.close()
    src = make_source(kafka, subscribe=topic, startingOffsets=f'{{"{topic}": {{"0": -2}}}}')
    with pytest.raises(HeadraceError, match=rf"does not list {topic}-1, {topic}-2"):
        src.initial_offset()
    src.close()
    src = make_source(kafka, subscribe=topic, startingOffsets="latest")
    assert src.initial_offset() == {topic: {"0": 10, "1": 10, "2": 10}}
    src.close()


def test_assign_reads_only_the_given_partitions(kafka: Any, tmp_path: Path) -> None:
    topic = kafka.create_topic(unique(), 3)
    produce(kafka.bootstrap_servers, topic, range(30), partitions=3)
    q, name = run_query(kafka, tmp_path, assign=f'{{"{topic}": [0, 2]}}', startingOffsets="earliest")
    q.await_termination(60)
    assert set(hr.memory_table(name).column("partition").to_pylist()) == {0, 2}
    assert hr.memory_table(name).num_rows == 20


@pytest.mark.parametrize("strategy", ["error", "latest"])
def test_starting_timestamp_without_matching_records(kafka: Any, strategy: str) -> None:
    # Neither test broker implements ListOffsets by time (the mock answers -1, i.e. "no such record"),
    # so this checks what happens when no record is at or after the timestamp.
    topic = kafka.create_topic(unique(), 2)
    produce(kafka.bootstrap_servers, topic, range(10), partitions=2)
    src = make_source(kafka, subscribe=topic, startingTimestamp=str(int(time.time() * 1000) + 3_600_000),
                      startingOffsetsByTimestampStrategy=strategy)  # fmt: skip
    try:
        if strategy == "error":
            with pytest.raises(HeadraceError, match="startingOffsetsByTimestampStrategy=latest"):
                src.initial_offset()
        else:
            assert src.initial_offset() == {topic: {"0": 5, "1": 5}}
    finally:
        src.close()


def test_ending_offsets_bound_the_stream(kafka: Any, tmp_path: Path) -> None:
    topic = kafka.create_topic(unique(), 2)
    produce(kafka.bootstrap_servers, topic, range(20), partitions=2)
    q, name = run_query(kafka, tmp_path, subscribe=topic, startingOffsets="earliest",
                        endingOffsets=f'{{"{topic}": {{"0": 3, "1": -1}}}}', maxOffsetsPerTrigger=4)  # fmt: skip
    q.await_termination(60)
    t = hr.memory_table(name)
    assert t.num_rows == 13 and len(q.recent_progress) == 4
    assert sorted(t.filter(pc.equal(t.column("partition"), 0)).column("offset").to_pylist()) == [0, 1, 2]


def test_min_partitions_and_max_records_split_ranges(kafka: Any) -> None:
    topic = kafka.create_topic(unique(), 2)
    produce(kafka.bootstrap_servers, topic, range(100), partition=0)
    produce(kafka.bootstrap_servers, topic, range(100, 120), partition=1)
    for opts, expected in (({"minPartitions": 6}, 6), ({"maxRecordsPerPartition": 30}, 5), ({}, 2)):
        src = make_source(kafka, subscribe=topic, startingOffsets="earliest", **opts)
        try:
            start = src.initial_offset()
            end = src.latest_offset(start, ReadLimit.all_available())
            parts = src.partitions(start, end)
            assert len(parts) == expected, opts
            assert read_all(src, start, end) == list(range(120))
        finally:
            src.close()


def test_pattern_picks_up_new_topics_between_batches(kafka: Any, tmp_path: Path) -> None:
    prefix = unique("pat")
    first = kafka.create_topic(f"{prefix}-a", 1)
    produce(kafka.bootstrap_servers, first, range(5))
    q, name = run_query(kafka, tmp_path, {"processing_time": "100 milliseconds"},
                        subscribePattern=f"{prefix}-.*", startingOffsets="earliest")  # fmt: skip
    try:
        wait_for(lambda: _rows(name) == 5, what="5 rows")
        second = kafka.create_topic(f"{prefix}-b", 2)
        produce(kafka.bootstrap_servers, second, range(5, 15), partitions=2)
        wait_for(lambda: _rows(name) == 15, what="rows of the new topic")
        assert set(hr.memory_table(name).column("topic").to_pylist()) == {first, second}
    finally:
        q.stop()


def _rows(name: str) -> int:
    try:
        return int(hr.memory_table(name).num_rows)
    except Exception:
        return 0


@pytest.mark.parametrize("fail", [True, False], ids=["failOnDataLoss", "skip"])
def test_trimmed_offsets_are_data_loss(kafka: Any, fail: bool) -> None:
    topic = kafka.create_topic(unique(), 1)
    produce(kafka.bootstrap_servers, topic, range(20))
    src = make_source(kafka, subscribe=topic, startingOffsets="earliest", failOnDataLoss=str(fail).lower())
    try:
        start = src.initial_offset()
        kafka.delete_records(topic, 0, 12)  # retention removed offsets 0..11
        end = src.latest_offset(start, ReadLimit.all_available())
        if fail:
            with pytest.raises(DataLossError, match=r"offsets 0\.\.11 are gone.*failOnDataLoss=false"):
                read_all(src, start, end)
        else:
            assert read_all(src, start, end) == list(range(12, 20))
    finally:
        src.close()


@pytest.mark.parametrize("fail", [True, False], ids=["failOnDataLoss", "skip"])
def test_deleted_topic_is_data_loss(kafka: Any, fail: bool) -> None:
    keep, gone = kafka.create_topic(unique(), 1), kafka.create_topic(unique(), 1)
    produce(kafka.bootstrap_servers, keep, range(3))
    produce(kafka.bootstrap_servers, gone, range(3))
    src = make_source(kafka, subscribe=f"{keep},{gone}", startingOffsets="earliest", failOnDataLoss=str(fail).lower())
    try:
        start = src.initial_offset()
        kafka.delete_topic(gone)
        wait_for(lambda: gone not in src._metadata().topics(), what="topic deletion")
        if fail:
            with pytest.raises(DataLossError, match=f"{gone}-0 no longer exists"):
                src.latest_offset(start, ReadLimit.all_available())
        else:
            end = src.latest_offset(start, ReadLimit.all_available())
            assert end == {keep: {"0": 3}} and read_all(src, start, end) == [0, 1, 2]
    finally:
        src.close()


def test_partitions_added_mid_stream(kafka: Any) -> None:
    # The mock cannot add partitions to a topic: re-create it with more. Partition 0's offsets go
    # back (data loss, skipped here); the new partitions 1 and 2 are read from their start.
    topic = kafka.create_topic(unique(), 1)
    produce(kafka.bootstrap_servers, topic, range(10))
    src = make_source(kafka, subscribe=topic, startingOffsets="earliest", failOnDataLoss="false")
    try:
        a = src.initial_offset()
        b = src.latest_offset(a, ReadLimit.all_available())
        assert read_all(src, a, b) == list(range(10))
        kafka.delete_topic(topic)
        kafka.create_topic(topic, 3)
        produce(kafka.bootstrap_servers, topic, range(100, 115), partitions=3, fresh=True)
        c = wait_for(lambda: (lambda e: e if len(e[topic]) == 3 else None)(src.latest_offset(b, ReadLimit.all_available())),
                     what="3 partitions")  # fmt: skip
        assert c == {topic: {"0": 5, "1": 5, "2": 5}}
        assert read_all(src, b, c) == sorted([101, 104, 107, 110, 113, 102, 105, 108, 111, 114])
    finally:
        src.close()


def test_no_consumer_group_offsets_are_committed(kafka: Any, tmp_path: Path) -> None:
    topic = kafka.create_topic(unique(), 1)
    produce(kafka.bootstrap_servers, topic, range(5))
    q, name = run_query(kafka, tmp_path, subscribe=topic, startingOffsets="earliest", groupIdPrefix="mine")
    q.await_termination(60)
    assert hr.memory_table(name).num_rows == 5
    c = Consumer({"bootstrap.servers": kafka.bootstrap_servers, "group.id": f"mine-{q.id}"})
    try:
        assert c.committed([TopicPartition(topic, 0)], timeout=10)[0].offset < 0
    finally:
        c.close()
