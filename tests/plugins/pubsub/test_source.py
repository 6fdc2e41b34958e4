"""The pubsub source against the real emulator: subscriptions, columns, every option,
redelivery, nack, ack deadlines, ordering keys, staging and clean-up."""

from __future__ import annotations

import os
import pickle
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pyarrow as pa
import pytest

import headrace as hr
from headrace.plugins import registry
from headrace.protocols import ReadLimit, SourceContext
from headrace_pubsub._client import PubSubError
from headrace_pubsub.source import PubSubSource
from tests.plugins.pubsub.helpers import Topic, drain, ints_of, unique, wait_for

ALL = ReadLimit.all_available()


@pytest.fixture
def topic(pubsub_emulator: Any) -> Topic:
    return Topic(pubsub_emulator)


class Sources:
    """Builds sources on a state folder and closes them at the end of the test."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.made: list[PubSubSource] = []

    def __call__(self, options: dict[str, Any], state: str = "state") -> PubSubSource:
        spec = registry().get("pubsub")
        opts = spec.source_options.parse(options, connector="pubsub", role="source")
        (self.tmp_path / state).mkdir(exist_ok=True)
        src = PubSubSource(opts, SourceContext(query_id="q", run_id=uuid.uuid4().hex, state_path=str(self.tmp_path / state)))
        self.made.append(src)
        return src


@pytest.fixture
def make_source(tmp_path: Path) -> Iterator[Sources]:
    sources = Sources(tmp_path)
    yield sources
    for s in sources.made:
        s.close()


def read(src: PubSubSource, start: dict[str, Any], end: dict[str, Any]) -> pa.Table:
    batches = [b for p in src.partitions(start, end) for b in src.read(p)]
    return pa.Table.from_batches(batches, schema=src.schema)


def read_all(src: PubSubSource, limit: ReadLimit = ALL, start: dict[str, Any] | None = None) -> list[pa.Table]:
    """Batches until the subscription is idle, committing each (as the engine does)."""
    out: list[pa.Table] = []
    cur = start or src.initial_offset()
    while True:
        end = src.latest_offset(cur, limit)
        if end == cur:
            return out
        out.append(read(src, cur, end))
        src.commit(end)
        cur = end


def values(tables: list[pa.Table]) -> list[int]:
    return [int(v) for t in tables for v in t.column("payload").to_pylist()]


# ---------------------------------------------------------------------------- subscriptions
def test_subscription_is_created_on_the_topic(topic: Topic, make_source: Sources, pubsub_emulator: Any) -> None:
    opts = topic.source_options(ackDeadlineSeconds=15, enableMessageOrdering=True)
    make_source(opts)
    client = pubsub_emulator.subscriber()
    sub = client.get_subscription(subscription=f"projects/{topic.project}/subscriptions/{opts['subscriptionId']}")
    client.close()
    assert (sub.topic, sub.ack_deadline_seconds, sub.enable_message_ordering) == (topic.path, 15, True)
    make_source(opts, state="again")  # an existing subscription is reused


def test_subscription_of_another_topic_is_refused(topic: Topic, pubsub_emulator: Any, make_source: Sources) -> None:
    other = Topic(pubsub_emulator)
    sub = other.subscription()
    with pytest.raises(PubSubError, match=f"reads topic '{other.path}', not topicId '{topic.id}'"):
        make_source(topic.source_options(sub))


def test_missing_topic_is_named_with_the_fix(topic: Topic, make_source: Sources) -> None:
    with pytest.raises(PubSubError) as e:
        make_source({**topic.source_options(), "topicId": "no-such-topic"})
    assert "topic projects/headrace-test/topics/no-such-topic does not exist" in str(e.value)
    assert "gcloud pubsub topics create no-such-topic" in str(e.value)


def test_emulator_host_from_the_environment(topic: Topic, make_source: Sources, pubsub_emulator: Any,
                                            monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", pubsub_emulator.host)
    opts = {k: v for k, v in topic.source_options().items() if k != "endpoint"}
    src = make_source(opts)
    assert src.endpoint.emulator and src.endpoint.host == pubsub_emulator.host
    topic.publish_ints(3)
    assert sorted(values(read_all(src))) == [0, 1, 2]


# ---------------------------------------------------------------------------- rows
def test_columns(topic: Topic, make_source: Sources) -> None:
    src = make_source(topic.source_options())
    before = int(time.time() * 1000)
    ids = topic.publish([b"\x00\xffbin"], colour="red", size="L")
    (table,) = read_all(src)
    row = table.to_pylist()[0]
    assert table.schema == src.schema
    assert row["messageId"] == ids[0] and row["payload"] == b"\x00\xffbin"
    assert sorted(row["attributes"]) == [("colour", "red"), ("size", "L")]
    assert before - 5000 <= row["publishTimestampInMillis"] <= int(time.time() * 1000) + 5000
    assert row["orderingKey"] is None and row["deliveryAttempt"] is None


def test_query_reads_everything_exactly_once(topic: Topic, tmp_path: Path) -> None:
    opts = topic.source_options(maxRecordsPerFetch=40)
    q0 = hr.read_stream.format("pubsub").options(opts).load().write_stream.format("memory").query_name("ps_q") \
        .option("checkpointLocation", str(tmp_path / "chk")).trigger(available_now=True).start()  # fmt: skip
    q0.await_termination(60)  # creates the subscription
    sent = topic.publish_ints(150)
    q = hr.read_stream.format("pubsub").options(opts).load().write_stream.format("memory").query_name("ps_q") \
        .option("checkpointLocation", str(tmp_path / "chk")).trigger(available_now=True).start()  # fmt: skip
    q.await_termination(60)
    got = ints_of(hr.memory_table("ps_q").column("payload").to_pylist())
    assert sorted(got) == sent
    progress = q.recent_progress
    assert len(progress) >= 4 and all(p["numInputRows"] <= 40 for p in progress)
    metrics = progress[0]["sources"][0]["metrics"]
    assert metrics["numRecordsFetched"] == progress[0]["numInputRows"] and metrics["numPulls"] >= 1
    # staged rows are deleted once their batch's commit marker is durable (Source.commit runs before the
    # next batch, as in Spark): at report time at most the batch's own segment is still there
    assert metrics["numStagedSegments"] <= 1
    staged = list((tmp_path / "chk" / "sources" / "0").rglob("segments/*/MANIFEST.json"))
    assert staged == []  # and none once the query has ended
    assert q.delivery_guarantee == "exactly-once"  # replayable source, idempotent memory sink


# ---------------------------------------------------------------------------- options
def test_max_records_per_fetch_and_fetch_partitions(topic: Topic, make_source: Sources) -> None:
    src = make_source(topic.source_options(maxRecordsPerFetch=10, numFetchPartitions=3))
    sent = topic.publish_ints(75)
    start = src.initial_offset()
    end = src.latest_offset(start, ALL)
    parts = src.partitions(start, end)
    first = read(src, start, end)
    assert 1 <= len(parts) <= 3 and all(p.rows <= 10 for p in parts)  # type: ignore[attr-defined]
    assert first.num_rows <= 30
    rest = read_all(src, start=end)
    assert sorted(values([first, *rest])) == sent


def test_read_limit_max_rows(topic: Topic, make_source: Sources) -> None:
    src = make_source(topic.source_options())
    sent = topic.publish_ints(25)
    batches = read_all(src, ReadLimit(max_rows=7))
    assert [t.num_rows for t in batches] == [7, 7, 7, 4]
    assert sorted(values(batches)) == sent


def test_max_bytes_per_trigger_is_a_soft_limit(topic: Topic, make_source: Sources) -> None:
    src = make_source(topic.source_options(maxBytesPerTrigger=1000))
    topic.publish([b"x" * 100] * 60)
    batches = read_all(src, src.default_read_limit())
    sizes = [sum(len(p) for p in t.column("payload").to_pylist()) for t in batches]
    assert sum(sizes) == 6000 and len(batches) >= 4
    assert all(s <= 2000 for s in sizes), sizes  # over by at most about one pull


def test_fetch_idle_timeout_ends_an_empty_fetch(topic: Topic, make_source: Sources) -> None:
    src = make_source(topic.source_options(fetchIdleTimeout="300 milliseconds"))
    t0 = time.monotonic()
    assert src.latest_offset(src.initial_offset(), ALL) == {"seq": 0}
    assert 0.25 <= time.monotonic() - t0 < 2.0


def test_max_fetch_period_bounds_a_fetch(topic: Topic, make_source: Sources) -> None:
    src = make_source(topic.source_options(fetchIdleTimeout="30 seconds", maxFetchPeriod="700 milliseconds"))
    topic.publish_ints(5)
    t0 = time.monotonic()
    end = src.latest_offset(src.initial_offset(), ALL)
    assert 0.6 <= time.monotonic() - t0 < 3.0
    assert read(src, src.initial_offset(), end).num_rows == 5


def test_delete_subscription_on_stream_stop(topic: Topic, tmp_path: Path, pubsub_emulator: Any) -> None:
    from google.api_core import exceptions as gexc

    client = pubsub_emulator.subscriber()
    for delete in (False, True):
        opts = topic.source_options(deleteSubscriptionOnStreamStop=delete)
        q = hr.read_stream.format("pubsub").options(opts).load().write_stream.format("memory") \
            .query_name(unique("q").replace("-", "_")).option("checkpointLocation", str(tmp_path / str(delete))).start()  # fmt: skip
        path = f"projects/{topic.project}/subscriptions/{opts['subscriptionId']}"
        assert client.get_subscription(subscription=path).topic == topic.path
        q.stop()
        assert q.exception() is None
        if delete:
            with pytest.raises(gexc.NotFound):
                client.get_subscription(subscription=path)
        else:
            assert client.get_subscription(subscription=path).name == path
    client.close()


# ---------------------------------------------------------------------------- redelivery, nack, deadlines
def test_redelivered_messages_are_dropped_by_message_id(topic: Topic, make_source: Sources, pubsub_emulator: Any) -> None:
    from google.protobuf import timestamp_pb2

    opts = topic.source_options()
    src = make_source(opts)
    sent = topic.publish_ints(20)
    assert sorted(values(read_all(src))) == sent
    # seek back: Pub/Sub marks everything since then unacked and delivers it again
    client = pubsub_emulator.subscriber()
    client.seek(request={"subscription": f"projects/{topic.project}/subscriptions/{opts['subscriptionId']}",
                         "time": timestamp_pb2.Timestamp(seconds=int(time.time()) - 3600)})  # fmt: skip
    client.close()
    more = topic.publish_ints(5)
    assert sorted(values(read_all(src))) == more
    # a restarted source (same checkpoint folder) remembers the ids of committed segments too
    client = pubsub_emulator.subscriber()
    client.seek(request={"subscription": f"projects/{topic.project}/subscriptions/{opts['subscriptionId']}",
                         "time": timestamp_pb2.Timestamp(seconds=int(time.time()) - 3600)})  # fmt: skip
    client.close()
    src.close()
    again = make_source(opts)
    end = again.latest_offset({"seq": 100}, ALL)
    assert end == {"seq": 100}
    assert again._stats == {} and len(again._seen) == 25
    assert not drain(pubsub_emulator, topic.project, opts["subscriptionId"], idle=0.5), "duplicates were not acked"


def test_dedup_window_bounds_memory(topic: Topic, make_source: Sources) -> None:
    src = make_source(topic.source_options(dedupWindow="1 millisecond"))
    topic.publish_ints(5)
    read_all(src)
    wait_for(lambda: (cast(Any, src.commit({"seq": 1})), len(src._seen) == 0)[1],
             timeout=5, what="the dedup window to expire")
    assert not os.listdir(os.path.join(src._store.dedup_dir))


def test_nacked_message_is_redelivered_with_delivery_attempt(topic: Topic, make_source: Sources,
                                                             pubsub_emulator: Any) -> None:  # fmt: skip
    from google.pubsub_v1 import PullResponse

    dead = Topic(pubsub_emulator)
    sub_id = unique("sub")
    path = f"projects/{topic.project}/subscriptions/{sub_id}"
    client = pubsub_emulator.subscriber()
    client.create_subscription(request={"name": path, "topic": topic.path, "ack_deadline_seconds": 10,
                                        "dead_letter_policy": {"dead_letter_topic": dead.path, "max_delivery_attempts": 5}})  # fmt: skip
    topic.publish([b"7"])
    got = wait_for(lambda: PullResponse.pb(client.pull(request={"subscription": path, "max_messages": 1,
                                                                "return_immediately": True})).received_messages,
                   what="the first delivery")  # fmt: skip
    client.modify_ack_deadline(subscription=path, ack_ids=[got[0].ack_id], ack_deadline_seconds=0)  # nack
    client.close()
    src = make_source(topic.source_options(sub_id))
    (table,) = read_all(src)
    assert table.column("payload").to_pylist() == [b"7"]
    assert table.column("deliveryAttempt").to_pylist() == [2]


def _competitor(pubsub_emulator: Any, path: str, stop: threading.Event, stolen: list[Any]) -> threading.Thread:
    """Another consumer of the same subscription: it gets any message whose deadline expired."""
    from google.pubsub_v1 import PullResponse

    def run() -> None:
        client = pubsub_emulator.subscriber()
        while not stop.is_set():
            resp = client.pull(request={"subscription": path, "max_messages": 100, "return_immediately": True})
            got = list(PullResponse.pb(resp).received_messages)
            stolen.extend(got)
            if got:
                client.modify_ack_deadline(subscription=path, ack_ids=[m.ack_id for m in got], ack_deadline_seconds=0)
            stop.wait(0.05)
        client.close()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_ack_deadline_is_extended_during_a_long_fetch(topic: Topic, make_source: Sources, pubsub_emulator: Any) -> None:
    sub = topic.subscription(ack_deadline=1)
    src = make_source(topic.source_options(sub, fetchIdleTimeout="2.5 seconds", maxFetchPeriod="2.5 seconds"))
    sent = topic.publish_ints(8)
    stolen: list[Any]
    stop, stolen = threading.Event(), []
    result: dict[str, Any] = {}
    fetch = threading.Thread(target=lambda: result.update(end=src.latest_offset(src.initial_offset(), ALL)))
    fetch.start()
    wait_for(lambda: src._pending_fetch_ids, what="the fetch to hold messages")
    competitor = _competitor(pubsub_emulator, f"projects/{topic.project}/subscriptions/{sub}", stop, stolen)
    fetch.join(30)
    stop.set()
    competitor.join(10)
    assert not stolen, f"{len(stolen)} messages expired while the fetch held them"
    assert sorted(values([read(src, src.initial_offset(), result["end"])])) == sent
    assert src._stats[1]["fetchDurationMs"] >= 2000


def test_slow_batch_does_not_cause_redelivery(topic: Topic, tmp_path: Path, pubsub_emulator: Any) -> None:
    """Messages are acked once staged, before the batch runs: a batch slower than the ack
    deadline does not make Pub/Sub deliver them again (to a competing consumer or to us)."""
    sub = topic.subscription(ack_deadline=1)
    sent = topic.publish_ints(30)
    seen: list[int] = []
    stolen: list[Any]
    stop, stolen = threading.Event(), []
    threads: list[threading.Thread] = []
    slow_done = threading.Event()

    def slow_sink(table: pa.Table, batch_id: int) -> None:
        seen.extend(ints_of(table.column("payload").to_pylist()))
        if batch_id == 0:
            threads.append(_competitor(pubsub_emulator, f"projects/{topic.project}/subscriptions/{sub}", stop, stolen))
            time.sleep(2.5)  # the slow batch itself, longer than the 1 s ack deadline
            stop.set()
            slow_done.set()

    q = hr.read_stream.format("pubsub").options(topic.source_options(sub, maxRecordsPerFetch=30)).load() \
        .write_stream.foreach_batch(slow_sink).option("checkpointLocation", str(tmp_path / "chk")).start()  # fmt: skip
    try:
        wait_for(slow_done.is_set, what="the slow batch")
        wait_for(lambda: sorted(seen) == sent, timeout=10, what="every message")
        time.sleep(1.5)  # longer than the ack deadline: would any message come back?
    finally:
        q.stop()
        stop.set()
        for t in threads:
            t.join(10)
    assert q.exception() is None
    assert not stolen, f"{len(stolen)} messages were redelivered during the slow batch"
    assert sorted(seen) == sent


# ---------------------------------------------------------------------------- ordering, available-now, staging
def test_ordering_keys_keep_their_order(pubsub_emulator: Any, make_source: Sources) -> None:
    topic = Topic(pubsub_emulator, ordering=True)
    src = make_source(topic.source_options(enableMessageOrdering=True, maxRecordsPerFetch=7))
    futures = [topic.publisher.publish(topic.path, str(i).encode(), ordering_key=f"k{i % 3}") for i in range(45)]
    [f.result(timeout=30) for f in futures]
    rows = [r for t in read_all(src) for r in t.to_pylist()]
    assert sorted(int(r["payload"]) for r in rows) == list(range(45))
    for k in range(3):
        seq = [int(r["payload"]) for r in rows if r["orderingKey"] == f"k{k}"]
        assert seq == sorted(seq) and len(seq) == 15


def test_available_now_stops_at_messages_published_before_it(topic: Topic, make_source: Sources,
                                                            pubsub_emulator: Any) -> None:  # fmt: skip
    opts = topic.source_options()
    src = make_source(opts)
    first = topic.publish_ints(10)
    assert src.prepare_for_available_now()
    later = topic.publish_ints(5)
    batches = read_all(src)
    assert sorted(values(batches)) == first
    left = drain(pubsub_emulator, topic.project, opts["subscriptionId"], idle=0.5)
    assert sorted(int(m.message.data) for m in left) == later  # handed back, not lost


def test_available_now_waits_for_the_end_once(topic: Topic, make_source: Sources) -> None:
    """A fetch that ended because the subscription stayed empty for fetchIdleTimeout ends the
    available-now run: the next call returns at once instead of waiting that long again. A fetch
    that ended at its limit does not."""
    src = make_source(topic.source_options(fetchIdleTimeout="1500 milliseconds", maxRecordsPerFetch=4))
    sent = topic.publish_ints(6)
    assert src.prepare_for_available_now()
    start = src.initial_offset()
    first = src.latest_offset(start, ALL)  # ends at maxRecordsPerFetch: not drained
    assert first["seq"] > 0 and not src._drained
    second = src.latest_offset(first, ALL)  # the last 2 messages, then 1.5 s of nothing
    assert second["seq"] > first["seq"] and src._drained
    t0 = time.monotonic()
    assert src.latest_offset(second, ALL) == second  # the end, without a second wait
    assert time.monotonic() - t0 < 1.0
    assert sorted(values([read(src, start, second)])) == sent


def test_staged_segments_live_until_commit(topic: Topic, make_source: Sources) -> None:
    src = make_source(topic.source_options())
    topic.publish_ints(4)
    end = src.latest_offset(src.initial_offset(), ALL)
    assert src._store.staged() == [1]
    assert read(src, src.initial_offset(), end).num_rows == 4
    assert read(src, src.initial_offset(), end).num_rows == 4  # replay reads the same staged rows
    src.commit(end)
    assert src._store.staged() == []
    assert len(os.listdir(src._store.dedup_dir)) == 1
    # the committed segment's folder went to retired/, deleted in the background
    assert pickle.loads(pickle.dumps(src)).schema == src.schema  # a copy without the deleter thread
    wait_for(lambda: not os.listdir(src._store.retired_dir), timeout=10, what="the retired segment to be deleted")


def test_retired_segments_left_by_a_crash_are_deleted_at_start(topic: Topic, make_source: Sources, tmp_path: Path) -> None:
    src = make_source(topic.source_options())
    topic.publish_ints(3)
    end = src.latest_offset(src.initial_offset(), ALL)
    src._store._delete_later = lambda path: None  # type: ignore[method-assign]  # the process dies before deleting
    src.commit(end)
    left = os.listdir(src._store.retired_dir)
    assert left and src._store.staged() == []
    again = make_source(topic.source_options())  # a restart on the same state folder
    assert not os.listdir(again._store.retired_dir) and again._store.staged() == []
