"""The pubsub sink against the real emulator: columns, attributes, ordering keys, batching
options, errors, and a failed publish failing the batch."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import headrace as hr
from headrace.errors import HeadraceError
from headrace.plugins import registry
from headrace.protocols import SinkContext
from headrace_pubsub._client import PubSubError
from headrace_pubsub.sink import Published, PubSubSink
from tests.plugins.pubsub.helpers import Topic, drain

ATTRS = pa.map_(pa.string(), pa.string())


@pytest.fixture
def topic(pubsub_emulator: Any) -> Topic:
    return Topic(pubsub_emulator)


@pytest.fixture
def make_sink() -> Iterator[Any]:
    made: list[PubSubSink] = []

    def make(options: dict[str, Any]) -> PubSubSink:
        spec = registry().get("pubsub")
        opts = spec.sink_options.parse(options, connector="pubsub", role="sink")
        sink = PubSubSink(opts, SinkContext(query_id="q", run_id=uuid.uuid4().hex))
        made.append(sink)
        return sink

    yield make
    for s in made:
        s.close()


def test_publishes_data_attributes_and_ordering_keys(pubsub_emulator: Any, make_sink: Any) -> None:
    topic = Topic(pubsub_emulator)
    sub = topic.subscription(ordering=True)
    sink = make_sink(topic.sink_options())
    n = 60
    batch = pa.record_batch({
        "data": pa.array([str(i).encode() for i in range(n)], pa.binary()),
        "attributes": pa.array([[("i", str(i))] if i % 2 else [] for i in range(n)], ATTRS),
        "orderingKey": pa.array([f"k{i % 3}" for i in range(n)]),
    })  # fmt: skip
    msg = sink.write(0, iter([batch.slice(0, 25), batch.slice(25)]))
    sink.commit(0, [msg])
    assert msg == Published(n, sum(len(str(i)) for i in range(n)))
    assert sink._ordering and sink.metrics()["numMessagesPublished"] == n
    got = drain(pubsub_emulator, topic.project, sub, idle=0.5)
    assert sorted(int(m.message.data) for m in got) == list(range(n))
    for m in got:
        i = int(m.message.data)
        assert dict(m.message.attributes) == ({"i": str(i)} if i % 2 else {})
        assert m.message.ordering_key == f"k{i % 3}"
    for k in range(3):
        seq = [int(m.message.data) for m in got if m.message.ordering_key == f"k{k}"]
        assert seq == sorted(seq)


@pytest.mark.parametrize(
    ("column", "array"),
    [("payload", pa.array(["a", "bb"], pa.string())), ("data", pa.array(["a", "bb"], pa.large_string())),
     ("payload", pa.array([b"a", b"bb"], pa.large_binary()))],
    ids=["payload-string", "data-large-string", "payload-large-binary"],
)  # fmt: skip
def test_body_column_name_and_type(topic: Topic, make_sink: Any, pubsub_emulator: Any, column: str, array: pa.Array) -> None:
    sub = topic.subscription()
    sink = make_sink(topic.sink_options())
    sink.commit(0, [sink.write(0, iter([pa.record_batch({column: array})]))])
    assert sorted(m.message.data for m in drain(pubsub_emulator, topic.project, sub, idle=0.5)) == [b"a", b"bb"]


@pytest.mark.parametrize(
    ("batch", "message"),
    [
        (pa.record_batch({"value": pa.array([1])}), "exactly one of the columns 'data' or 'payload'"),
        (pa.record_batch({"data": pa.array([b"x"]), "payload": pa.array([b"y"])}), "exactly one of the columns"),
        (pa.record_batch({"data": pa.array([1])}), "column 'data' has type int64; it must be binary or string"),
        (pa.record_batch({"data": pa.array([b"x"]), "attributes": pa.array(["k=v"])}), "column 'attributes' has type string"),
        (pa.record_batch({"data": pa.array([b""])}), "has an empty 'data' and no attributes"),
    ],
    ids=["no-body", "two-bodies", "int-body", "string-attributes", "empty-message"],
)
def test_bad_rows_fail_with_the_fix(topic: Topic, make_sink: Any, batch: pa.RecordBatch, message: str) -> None:
    sink = make_sink(topic.sink_options())
    with pytest.raises(HeadraceError, match=message):
        sink.write(0, iter([batch]))


def test_ordering_keys_need_message_ordering(topic: Topic, make_sink: Any) -> None:
    sink = make_sink(topic.sink_options(enableMessageOrdering=False))
    with pytest.raises(HeadraceError, match="set enableMessageOrdering to true"):
        sink.write(0, iter([pa.record_batch({"data": pa.array([b"x"]), "orderingKey": pa.array(["k"])})]))


def test_batching_options_reach_the_client(topic: Topic, make_sink: Any) -> None:
    sink = make_sink(topic.sink_options(batchMaxMessages=7, batchMaxBytes="64k", batchMaxLatency="5 ms",
                                        maxOutstandingMessages=50))  # fmt: skip
    sink.write(0, iter([pa.record_batch({"data": pa.array([b"%d" % i for i in range(200)])})]))
    s = sink._publisher.batch_settings
    assert (s.max_messages, s.max_bytes, s.max_latency) == (7, 65536, 0.005)
    assert sink._publisher.publisher_options.flow_control.message_limit == 50


def test_missing_topic_is_reported_at_start(topic: Topic, make_sink: Any) -> None:
    with pytest.raises(PubSubError, match="topic projects/headrace-test/topics/nope-nope does not exist"):
        make_sink({**topic.sink_options(), "topicId": "nope-nope"})


def test_a_failed_publish_fails_the_batch(topic: Topic, make_sink: Any) -> None:
    sink = make_sink(topic.sink_options(publishTimeout="20 seconds"))
    topic.publisher.delete_topic(topic=topic.path)  # every publish of the batch now fails
    with pytest.raises(PubSubError, match=r"messages of batch 3 failed to publish: .*does not exist"):
        sink.write(3, iter([pa.record_batch({"data": pa.array([b"a", b"b"])})]))


def test_query_publishes_every_row(topic: Topic, pubsub_emulator: Any, tmp_path: Path) -> None:
    from tests.plugins.pubsub.helpers import to_payload

    sub = topic.subscription()
    q = hr.read_stream.format("rate-micro-batch").options(rowsPerBatch=100, totalRows=500).load() \
        .map_batches(to_payload).write_stream.format("pubsub").options(topic.sink_options()) \
        .option("checkpointLocation", str(tmp_path / "chk")).trigger(available_now=True).start()  # fmt: skip
    q.await_termination(60)
    assert q.delivery_guarantee == "at-least-once"
    assert q.last_progress is not None
    assert q.last_progress["sink"]["metrics"]["numMessagesPublished"] == 500
    got = drain(pubsub_emulator, topic.project, sub, idle=0.5)
    assert sorted(int(m.message.data) for m in got) == list(range(500))
    assert all(m.message.attributes["value"] == m.message.data.decode() for m in got)
