"""The kafka sink: columns, errors, delivery failures; the transactional mode against Tansu."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any, cast

import pyarrow as pa
import pytest
from confluent_kafka import Consumer, TopicPartition

from headrace.errors import HeadraceError
from headrace.plugins import registry
from headrace.protocols import SinkContext
from headrace.testing import run_pipeline
from headrace_kafka._client import KafkaClientError
from headrace_kafka.sink import KafkaSink
from tests.plugins.kafka.helpers import consume_all, int_values, unique


def make_sink(servers: str, tmp_path: Path, query_id: str = "q1", **options: Any) -> KafkaSink:
    opts = registry().get("kafka").sink_options.parse({"kafka.bootstrap.servers": servers, **options}, connector="kafka")
    return KafkaSink(opts, SinkContext(query_id=query_id, state_path=str(tmp_path / "sink")))


def write(sink: KafkaSink, batch_id: int, table: pa.Table) -> None:
    sink.commit(batch_id, [sink.write(batch_id, iter(table.to_batches()))])


def test_topic_key_partition_and_header_columns(kafka: Any, tmp_path: Path) -> None:
    a, b = kafka.create_topic(unique(), 3), kafka.create_topic(unique(), 1)
    table = pa.table({
        "topic": [a, a, b],
        "key": ["k1", None, "k3"],
        "value": [b"v1", b"v2", b"v3"],
        "partition": pa.array([2, 1, 0], pa.int32()),
        "headers": pa.array([[{"key": "h", "value": b"x"}], None, []],
                            pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
        "ignored": [1, 2, 3],
    })  # fmt: skip
    sink = make_sink(kafka.bootstrap_servers, tmp_path)
    write(sink, 0, table)
    sink.close()
    got_a = {m.value(): m for m in consume_all(kafka.bootstrap_servers, a, expect=2)}
    assert got_a[b"v1"].partition() == 2 and got_a[b"v1"].key() == b"k1" and got_a[b"v1"].headers() == [("h", b"x")]
    assert got_a[b"v2"].partition() == 1 and got_a[b"v2"].key() is None
    assert [m.value() for m in consume_all(kafka.bootstrap_servers, b, expect=1)] == [b"v3"]


def test_topic_option_overrides_the_column(kafka: Any, tmp_path: Path) -> None:
    t = kafka.create_topic(unique(), 1)
    sink = make_sink(kafka.bootstrap_servers, tmp_path, topic=t)
    write(sink, 0, pa.table({"topic": ["elsewhere"], "value": ["x"]}))
    sink.close()
    assert [m.value() for m in consume_all(kafka.bootstrap_servers, t, expect=1)] == [b"x"]


@pytest.mark.parametrize(
    ("table", "options", "needle"),
    [
        pytest.param(pa.table({"v": ["x"]}), {"topic": "t"}, "no 'value' column", id="no-value"),
        pytest.param(pa.table({"value": [1]}), {"topic": "t"}, "column 'value' has type int64", id="int-value"),
        pytest.param(pa.table({"value": ["x"]}), {}, "set the option topic", id="no-topic"),
        pytest.param(pa.table({"value": ["x"], "topic": pa.array([None], pa.string())}), {}, "null 'topic'", id="null-topic"),
    ],
)
def test_bad_input_fails_clearly(kafka: Any, tmp_path: Path, table: pa.Table, options: dict[str, Any], needle: str) -> None:
    sink = make_sink(kafka.bootstrap_servers, tmp_path, **options)
    with pytest.raises(HeadraceError, match=needle):
        write(sink, 0, table)
    sink.close()


def test_delivery_failure_fails_the_batch(kafka: Any, tmp_path: Path) -> None:
    t = kafka.create_topic(unique(), 1)
    sink = make_sink(kafka.bootstrap_servers, tmp_path, topic=t, flushTimeout="3s",
                     **cast(dict[str, Any], {"kafka.message.timeout.ms": 500}))  # fmt: skip
    kafka.set_broker_up(-1, up=False)
    try:
        with pytest.raises(KafkaClientError, match=r"batch 0: .*(not delivered|undelivered)"):
            write(sink, 0, pa.table({"value": ["x", "y"]}))
    finally:
        kafka.set_broker_up(-1, up=True)
        sink.close()


def test_a_failing_sink_fails_the_query_with_the_batch_id(kafka: Any, tmp_path: Path) -> None:
    spec = {
        "source": {"format": "rate-micro-batch", "options": {"rowsPerBatch": 10, "totalRows": 10}},
        "sink": {"format": "kafka", "options": {"kafka.bootstrap.servers": kafka.bootstrap_servers, "topic": unique()}},
        "checkpoint": str(tmp_path / "chk"),
    }
    res = run_pipeline(spec, timeout=60)
    assert res.returncode == 1 and "in batch 0" in res.stderr and "column 'value' has type int64" in res.stderr


# ---------------------------------------------------------------------- transactional (Tansu)
# The librdkafka mock does not store offsets committed in a transaction, which the exactly-once
# marker needs; Tansu does. Neither filters aborted records for read_committed readers, so the
# tests below check the cases where a correct sink writes nothing twice at all.


def committed_marker(tansu: Any, query_id: str, topic: str) -> int:
    c = Consumer({"bootstrap.servers": tansu.bootstrap_servers, "group.id": f"headrace-{query_id}"})
    try:
        return int(c.committed([TopicPartition(topic, 0)], timeout=10)[0].offset)
    finally:
        c.close()


def rows(lo: int, hi: int) -> pa.Table:
    return pa.table({"value": [str(i) for i in range(lo, hi)]})


def test_transactional_batches_commit_once(tansu: Any, tmp_path: Path) -> None:
    t = tansu.create_topic(unique("txn"), 1)
    qid = uuid.uuid4().hex
    sink = make_sink(tansu.bootstrap_servers, tmp_path, qid, topic=t, transactional="true")
    write(sink, 0, rows(0, 10))
    write(sink, 1, rows(10, 20))
    sink.close()
    assert committed_marker(tansu, qid, t) == 2  # batch 1 is the last committed
    again = make_sink(tansu.bootstrap_servers, tmp_path, qid, topic=t, transactional="true")  # restarted query
    write(again, 1, rows(10, 20))  # replay of an already committed batch: nothing written
    write(again, 2, rows(20, 25))
    again.close()
    assert sorted(int_values(consume_all(tansu.bootstrap_servers, t, 1, expect=25))) == list(range(25))
    assert committed_marker(tansu, qid, t) == 3


def test_transactional_kill_after_kafka_commit_does_not_duplicate(tansu: Any, tmp_path: Path) -> None:
    t = tansu.create_topic(unique("txn"), 1)
    spec = {
        "source": {"format": "rate-micro-batch", "options": {"rowsPerBatch": 100, "totalRows": 400}},
        "transform": "tests.plugins.kafka.helpers:to_kafka_value",
        "sink": {"format": "kafka", "options": {"kafka.bootstrap.servers": tansu.bootstrap_servers, "topic": t,
                                                "transactional": "true"}},
        "checkpoint": str(tmp_path / "chk"),
    }  # fmt: skip
    for point in ("after_sink_commit:1", "after_commit:2"):
        assert run_pipeline(spec, crash=point, timeout=90).killed
    run_pipeline(spec, timeout=90).check()
    got = int_values(consume_all(tansu.bootstrap_servers, t, 1, expect=400, read_committed=True))
    assert sorted(got) == list(range(400)), f"{len(got) - 400} duplicates"
