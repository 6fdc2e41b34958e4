"""The pubsub source's fetch against the real emulator: a micro-batch staged in chunks (several
segments, each acknowledged once durable while the pulls go on), a failure between two chunks,
concurrent pulls under the row cap, and the Arrow conversion of pulled messages."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import headrace_pubsub.source as source_module
from headrace.plugins import registry
from headrace.protocols import ReadLimit, SourceContext
from headrace_pubsub._schema import SCHEMA, messages_to_batch
from headrace_pubsub.source import PubSubSource
from tests.plugins.pubsub.helpers import Topic, drain

ALL = ReadLimit.all_available()


@pytest.fixture
def topic(pubsub_emulator: Any) -> Topic:
    return Topic(pubsub_emulator)


@pytest.fixture
def sources(tmp_path: Path) -> Iterator[list[PubSubSource]]:
    made: list[PubSubSource] = []
    yield made
    for s in made:
        s.close()


def make(made: list[PubSubSource], options: dict[str, Any], state: Path) -> PubSubSource:
    opts = registry().get("pubsub").source_options.parse(options, connector="pubsub", role="source")
    state.mkdir(exist_ok=True)
    src = PubSubSource(opts, SourceContext(query_id="q", run_id=uuid.uuid4().hex, state_path=str(state)))
    made.append(src)
    return src


def rows(src: PubSubSource, start: dict[str, Any], end: dict[str, Any]) -> list[int]:
    return [int(v) for p in src.partitions(start, end) for b in src.read(p) for v in b.column("payload").to_pylist()]


def test_a_batch_is_staged_and_acked_in_chunks(topic: Topic, sources: list[PubSubSource], tmp_path: Path,
                                               pubsub_emulator: Any, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.setattr(source_module, "_STAGE_ROWS", 1)  # a segment as soon as anything waits
    sub = topic.subscription(ack_deadline=1)  # an unacked message would come back within the test
    sent = topic.publish_ints(500)  # the emulator hands out at most 100 per pull: 5+ pulls
    src = make(sources, topic.source_options(sub, maxRecordsPerFetch=1000), tmp_path / "state")
    start = src.initial_offset()
    end = src.latest_offset(start, ALL)
    staged = src._store.staged()
    assert len(staged) >= 2 and staged == list(range(1, end["seq"] + 1))
    assert src.metrics(end)["numSegmentsStaged"] == len(staged)
    got = rows(src, start, end)
    assert sorted(got) == sent and got == rows(src, start, end)  # a replay reads the same rows, in order
    src.commit(end)  # waits for the acks of every segment of the batch
    assert src._store.staged() == []
    assert not drain(pubsub_emulator, topic.project, sub, idle=1.5), "staged messages were not acknowledged"


def test_a_failure_between_chunks_keeps_what_was_staged(topic: Topic, sources: list[PubSubSource], tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.setattr(source_module, "_STAGE_ROWS", 1)
    sub = topic.subscription(ack_deadline=1)  # what the failed run pulled returns after 1 s
    sent = topic.publish_ints(150)
    opts = topic.source_options(sub, fetchIdleTimeout="2 seconds")
    src = make(sources, opts, tmp_path / "state")
    stage = src._store.stage

    def fail_second(seq: int, *args: Any, **kwargs: Any) -> Any:
        if seq == 1:
            # more messages arrive while the first chunk is staged (the pullers wait fetchIdleTimeout
            # for them), so there is a second chunk even when the first took all of the first 150
            sent.extend(topic.publish_ints(150))
        if seq == 2:
            raise OSError("disk full (test)")
        return stage(seq, *args, **kwargs)

    monkeypatch.setattr(src._store, "stage", fail_second)
    with pytest.raises(OSError, match="disk full"):
        src.latest_offset(src.initial_offset(), ALL)
    assert src._store.staged() == [1] and not src._pending_fetch_ids
    src.close()
    again = make(sources, opts, tmp_path / "state")  # a restart on the same checkpoint folder
    first = again.latest_offset({"seq": 0}, ALL)
    assert first == {"seq": 1} and again.metrics(first)["resumedFromStaging"]
    got = rows(again, {"seq": 0}, first)
    again.commit(first)
    cur = first
    while (end := again.latest_offset(cur, ALL)) != cur:  # the rest, redelivered after the ack deadline
        got += rows(again, cur, end)
        again.commit(end)
        cur = end
    assert sorted(got) == sent, "a message was lost or duplicated"


def test_concurrent_pulls_keep_the_row_cap(topic: Topic, sources: list[PubSubSource], tmp_path: Path) -> None:
    src = make(sources, topic.source_options(maxRecordsPerFetch=150, numFetchPartitions=2), tmp_path / "state")
    sent = topic.publish_ints(450)
    got: list[int] = []
    cur = src.initial_offset()
    sizes, part_rows = [], []
    for limit in (ReadLimit(max_rows=130), ALL, ALL, ALL):
        end = src.latest_offset(cur, limit)
        part_rows += [p.rows for p in src.partitions(cur, end)]  # type: ignore[attr-defined]
        batch = rows(src, cur, end)
        sizes.append(len(batch))
        got += batch
        src.commit(end)
        cur = end
    assert sizes[0] == 130 and max(sizes) <= 300 and sizes[-1] == 0  # the read limit, then 2 partitions x 150
    assert max(part_rows) <= 150  # a part file holds one partition's messages
    assert sorted(got) == sent


def test_messages_to_batch_columns() -> None:
    from google.pubsub_v1 import PullResponse

    resp = PullResponse.pb()()
    for i in range(4):
        r = resp.received_messages.add()
        r.ack_id = f"a{i}"
        r.delivery_attempt = i
        m = r.message
        m.message_id, m.data = f"id{i}", b"x" * i
        m.publish_time.seconds, m.publish_time.nanos = 1_700_000_000, 123_456_789
        if i % 2:
            m.attributes["k"], m.attributes["j"] = str(i), "v"
        m.ordering_key = "key" if i == 3 else ""
    batch = messages_to_batch(PullResponse.pb().FromString(resp.SerializeToString()).received_messages)
    assert batch.schema == SCHEMA
    got = batch.to_pylist()
    assert [r["messageId"] for r in got] == ["id0", "id1", "id2", "id3"]
    assert [r["payload"] for r in got] == [b"", b"x", b"xx", b"xxx"]
    assert [sorted(r["attributes"]) for r in got] == [[], [("j", "v"), ("k", "1")], [], [("j", "v"), ("k", "3")]]
    assert {r["publishTimestampInMillis"] for r in got} == {1_700_000_000_123}
    assert [r["orderingKey"] for r in got] == [None, None, None, "key"]
    assert [r["deliveryAttempt"] for r in got] == [None, 1, 2, 3]
    assert pa.Table.from_batches([batch]).validate(full=True) is None


def test_ordering_keys_stay_in_order_across_chunks(pubsub_emulator: Any, sources: list[PubSubSource], tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """Pub/Sub withholds a key's next messages while earlier ones are unacked, so with several pulls
    in flight and a segment per chunk a key's messages still come in order (segments are read
    in order)."""
    monkeypatch.setattr(source_module, "_STAGE_ROWS", 1)
    topic = Topic(pubsub_emulator, ordering=True)
    src = make(sources, topic.source_options(enableMessageOrdering=True, maxRecordsPerFetch=1000), tmp_path / "state")
    futures = [topic.publisher.publish(topic.path, str(i).encode(), ordering_key=f"k{i % 3}") for i in range(300)]
    [f.result(timeout=30) for f in futures]
    got: list[int] = []
    cur, segments = src.initial_offset(), 0
    while (end := src.latest_offset(cur, ALL)) != cur:
        got += rows(src, cur, end)
        segments += end["seq"] - cur["seq"]
        src.commit(end)
        cur = end
    assert sorted(got) == list(range(300)) and segments >= 2
    for k in range(3):
        seq = [v for v in got if v % 3 == k]
        assert seq == sorted(seq), f"key k{k} out of order"
