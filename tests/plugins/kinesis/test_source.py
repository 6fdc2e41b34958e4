"""KinesisSource against kinesalite: initial positions, rate limits, resharding, faults."""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

import pyarrow as pa
import pytest

from headrace.errors import DataLossError, HeadraceError
from headrace.plugins import registry
from headrace.protocols import Offset, ReadLimit, SourceContext
from tests.plugins.kinesis.helpers import create_stream, put_values, source_opts, wait_active, wait_for

ALL = ReadLimit.all_available()


def make_source(options: dict[str, Any]) -> Any:
    spec = registry().get("kinesis")
    return spec.load_source()(spec.source_options.parse(options, connector="kinesis", role="source"), SourceContext())


def read(src: Any, start: Offset, end: Offset) -> pa.Table:
    batches = [b for p in src.partitions(start, end) for b in src.read(p)]
    return pa.Table.from_batches(batches, schema=src.schema) if batches else src.schema.empty_table()


def values(t: pa.Table) -> list[int]:
    return [int(x) for x in t.column("data").to_pylist()]


def drain(src: Any, start: Offset, limit: ReadLimit = ALL, max_batches: int = 50) -> tuple[list[pa.Table], Offset]:
    """Run batches until no new data; returns each batch's rows and the last offset."""
    out: list[pa.Table]
    out, cur = [], start
    for _ in range(max_batches):
        end = src.latest_offset(cur, limit)
        if end == cur:
            return out, cur
        out.append(read(src, cur, end))
        cur = end
    raise AssertionError("the source never caught up")


@pytest.mark.parametrize("position", ["trim_horizon", "earliest", "latest", "at_timestamp"])
def test_initial_position(kinesis: Any, position: str) -> None:
    c = kinesis.client()
    s = create_stream(c, shards=2)
    put_values(c, s, range(10))
    time.sleep(0.05)
    cut = dt.datetime.now(dt.UTC)
    time.sleep(0.05)
    extra = {"initialTimestamp": cut.isoformat()} if position == "at_timestamp" else {}
    src = make_source(source_opts(kinesis, s, initialPosition=position, **extra))
    start = src.initial_offset()
    put_values(c, s, range(10, 15))
    batches, _ = drain(src, start)
    got = sorted(v for t in batches for v in values(t))
    assert got == (list(range(15)) if position in ("trim_horizon", "earliest") else list(range(10, 15)))
    src.close()


def test_columns_and_types(kinesis: Any) -> None:
    c = kinesis.client()
    s = create_stream(c)
    c.put_record(StreamName=s, Data=b"\x00\xffhello", PartitionKey="pk-1")
    src = make_source(source_opts(kinesis, s))
    a = src.initial_offset()
    t = read(src, a, src.latest_offset(a, ALL))
    row = t.to_pylist()[0]
    assert row["partitionKey"] == "pk-1" and row["data"] == b"\x00\xffhello" and row["stream"] == s
    assert row["shardId"] == "shardId-000000000000" and int(row["sequenceNumber"]) > 0
    assert abs((row["approximateArrivalTimestamp"] - dt.datetime.now(dt.UTC)).total_seconds()) < 60
    assert t.schema.field("approximateArrivalTimestamp").type == pa.timestamp("us", tz="UTC")
    m = src.metrics(src.latest_offset(a, ALL))
    assert m["msBehindLatest"] == {"shardId-000000000000": 0} and m["numShards"] == 1


def test_read_limit_and_max_records_per_fetch(kinesis: Any) -> None:
    c = kinesis.client()
    s = create_stream(c)
    put_values(c, s, range(25))
    src = make_source(source_opts(kinesis, s, maxRecordsPerFetch=4))
    batches, _ = drain(src, src.initial_offset(), ReadLimit(max_rows=10))
    assert [t.num_rows for t in batches] == [10, 10, 5]
    assert sorted(v for t in batches for v in values(t)) == list(range(25))


def test_min_fetch_period_spaces_calls(kinesis: Any) -> None:
    c = kinesis.client()
    s = create_stream(c)
    put_values(c, s, range(12))
    src = make_source(source_opts(kinesis, s, maxRecordsPerFetch=3, minFetchPeriod="150ms", maxFetchDuration="10s"))
    a = src.initial_offset()
    t0 = time.monotonic()
    end = src.latest_offset(a, ALL)  # 4 fetches of 3 records, then one empty: >= 4 periods
    took = time.monotonic() - t0
    assert len(values(read(src, a, end))) == 12
    assert took >= 4 * 0.15, took
    # the next trigger does not fetch the shard again before the period is over
    assert src.latest_offset(end, ALL) == end


def test_max_fetch_rate_limits_bytes(kinesis: Any) -> None:
    c = kinesis.client()
    s = create_stream(c)
    c.put_records(StreamName=s, Records=[{"Data": b"x" * 20_000, "PartitionKey": str(i)} for i in range(10)])
    # 0.1 MB/s and 2 records (40 kB) per fetch: each fetch waits 0.4 s before the next
    src = make_source(source_opts(kinesis, s, maxRecordsPerFetch=2, maxFetchRate=0.1, maxFetchDuration="1s"))
    a = src.initial_offset()
    t0 = time.monotonic()
    end = src.latest_offset(a, ALL)
    n = read(src, a, end).num_rows
    assert time.monotonic() - t0 < 2.0
    assert 4 <= n <= 6, f"{n} records in 1 s at 0.1 MB/s of 20 kB records"


def test_max_fetch_duration_cuts_the_batch(kinesis: Any) -> None:
    c = kinesis.client()
    s = create_stream(c)
    put_values(c, s, range(20))
    src = make_source(source_opts(kinesis, s, maxRecordsPerFetch=1, minFetchPeriod="100ms", maxFetchDuration="350ms"))
    batches, _ = drain(src, src.initial_offset())
    assert len(batches) >= 4 and all(t.num_rows <= 5 for t in batches)
    assert sorted(v for t in batches for v in values(t)) == list(range(20))


def _shards(c: Any, s: str) -> list[dict[str, Any]]:
    return c.list_shards(StreamName=s)["Shards"]


def test_split_and_merge_mid_stream_parents_before_children(kinesis: Any) -> None:
    c = kinesis.client()
    s = create_stream(c, shards=1)
    put_values(c, s, range(0, 20))
    src = make_source(source_opts(kinesis, s))
    cur = src.initial_offset()
    end = src.latest_offset(cur, ALL)
    batches = [read(src, cur, end)]
    cur = end
    # split shard 0 into 1 and 2, write, then merge 1 and 2 into 3, write again
    c.split_shard(StreamName=s, ShardToSplit="shardId-000000000000", NewStartingHashKey=str(2**127))
    wait_active(c, s)
    put_values(c, s, range(20, 40))
    c.merge_shards(StreamName=s, ShardToMerge="shardId-000000000001", AdjacentShardToMerge="shardId-000000000002")
    wait_active(c, s)
    put_values(c, s, range(40, 60))
    order: list[list[str]] = []
    for _ in range(30):
        end = src.latest_offset(cur, ALL)
        if end == cur:
            break
        t = read(src, cur, end)
        batches.append(t)
        order.append(sorted(set(t.column("shardId").to_pylist())))
        cur = end
    got = [v for t in batches for v in values(t)]
    assert sorted(got) == list(range(60)), "every record exactly once across split and merge"
    first_batch = {sid: i for i, sids in enumerate(order) for sid in reversed(sids)}
    last_batch = {sid: i for i, sids in reversed(list(enumerate(order))) for sid in sids}
    # children only in batches after their parents' last batch
    assert last_batch.get("shardId-000000000000", -1) < min(first_batch["shardId-000000000001"], first_batch["shardId-000000000002"])
    assert max(last_batch["shardId-000000000001"], last_batch["shardId-000000000002"]) < first_batch["shardId-000000000003"]
    # finished shards are dropped from the offset; the listing starts after them
    assert list(cur["shards"]) == ["shardId-000000000003"] and cur["after"] == "shardId-000000000002"
    # and a replay of every batch (no in-memory records) reads the same rows
    assert src.metrics(cur)["numShards"] == 1


def test_replay_from_checkpointed_offsets_is_deterministic(kinesis: Any) -> None:
    c = kinesis.client()
    s = create_stream(c, shards=2)
    put_values(c, s, range(30))
    src = make_source(source_opts(kinesis, s))
    a = src.initial_offset()
    b = src.latest_offset(a, ReadLimit(max_rows=12))
    first = read(src, a, b)
    put_values(c, s, range(30, 40))  # newer records must not leak into the replayed range
    fresh = make_source(source_opts(kinesis, s))  # a restarted query: nothing in memory
    again = read(fresh, a, b)
    assert first.to_pylist() == again.to_pylist() and first.num_rows == 12


def test_expired_iterator_is_renewed(faulty_kinesis: Any) -> None:
    c = faulty_kinesis.client()
    s = create_stream(c)
    put_values(c, s, range(5))
    src = make_source(source_opts(faulty_kinesis, s))
    a = src.initial_offset()
    b = src.latest_offset(a, ALL)  # leaves a cached iterator for the next trigger
    assert values(read(src, a, b)) == list(range(5))
    put_values(c, s, range(5, 8))
    faulty_kinesis.set(clockOffsetMs=faulty_kinesis._state["clockOffsetMs"] + 301_000)  # iterators live 300 s
    end = src.latest_offset(b, ALL)
    assert values(read(src, b, end)) == [5, 6, 7]


def test_throttling_and_limit_exceeded_are_retried(faulty_kinesis: Any) -> None:
    c = faulty_kinesis.client()
    s = create_stream(c)
    put_values(c, s, range(6))
    src = make_source(source_opts(faulty_kinesis, s))
    faulty_kinesis.set(throttleGetRecords=3, limitListShards=2)
    a = src.initial_offset()
    batches, _ = drain(src, a)
    assert sorted(v for t in batches for v in values(t)) == list(range(6))
    faulty_kinesis.set()


def test_trimmed_records_fail_or_are_skipped(faulty_kinesis: Any) -> None:
    c = faulty_kinesis.client()
    s = create_stream(c)
    put_values(c, s, range(6))
    src = make_source(source_opts(faulty_kinesis, s))
    a = src.initial_offset()
    b = src.latest_offset(a, ReadLimit(max_rows=2))
    assert values(read(src, a, b)) == [0, 1]
    # the query stops; 25 h later (retention 24 h) records 0-5 are gone, 6-7 are new
    faulty_kinesis.set(clockOffsetMs=faulty_kinesis._state["clockOffsetMs"] + 25 * 3600 * 1000)
    put_values(c, s, [6, 7])
    restarted = make_source(source_opts(faulty_kinesis, s))
    with pytest.raises(DataLossError, match=r"failOnDataLoss=false"):
        restarted.latest_offset(b, ALL)
    lenient = make_source(source_opts(faulty_kinesis, s, failOnDataLoss="false"))
    batches, _ = drain(lenient, b)
    assert sorted(v for t in batches for v in values(t)) == [6, 7]


def test_unknown_stream_is_a_clear_error(kinesis: Any) -> None:
    src = make_source(source_opts(kinesis, "no-such-stream"))
    with pytest.raises(HeadraceError, match=r"no-such-stream.*not found.*fix"):
        src.initial_offset()


def test_available_now_ends_at_start_time(kinesis: Any) -> None:
    import headrace as hr

    c = kinesis.client()
    s = create_stream(c)
    put_values(c, s, range(8))
    q = (hr.read_stream.format("kinesis").options(source_opts(kinesis, s, maxRecordsPerFetch=3)).load()
         .write_stream.format("memory").query_name(f"an-{s}").option("checkpointLocation", f"/tmp/hr-kin-{s}")
         .trigger(available_now=True).start())  # fmt: skip
    assert q.await_termination(60)
    assert sorted(values(hr.memory_table(f"an-{s}"))) == list(range(8))
    wait_for(lambda: not q.is_active)


def test_role_arn_assumed_through_sts(kinesis: Any, s3: Any) -> None:
    """roleArn: credentials come from STS AssumeRole (moto's STS), then Kinesis is read with them."""
    c = kinesis.client()
    s = create_stream(c)
    put_values(c, s, range(3))
    opts = source_opts(kinesis, s, roleArn="arn:aws:iam::123456789012:role/reader", roleExternalId="ext-1",
                       stsEndpoint=s3.endpoint_url)  # fmt: skip
    src = make_source(opts)
    creds = src.client._request_signer._credentials.get_frozen_credentials()
    assert creds.access_key != kinesis.aws_access_key_id and creds.token, "credentials did not come from AssumeRole"
    batches, _ = drain(src, src.initial_offset())
    assert sorted(v for t in batches for v in values(t)) == [0, 1, 2]


def _available_now(kinesis: Any, s: str, chk: str, got: list[pa.Table]) -> None:
    import headrace as hr

    q = (hr.read_stream.format("kinesis").options(source_opts(kinesis, s, minFetchPeriod="0.2", shardFetchInterval="1s")).load()
         .write_stream.foreach_batch(lambda t, _b: got.append(t)).option("checkpointLocation", chk)
         .trigger(available_now=True).start())  # fmt: skip
    assert q.await_termination(120)
    assert q.exception() is None


def test_available_now_after_a_split_reads_everything_present_at_start(kinesis: Any, tmp_path: Any) -> None:
    """Two shards, one split between runs, 500 new records (parent, other shard and children):
    the next available-now run reads all 500 (not only the shards before the split), and a run
    after it reads nothing again. Every batch handed to foreach_batch has the Kinesis columns."""
    from headrace_kinesis._schema import SCHEMA

    c = kinesis.client()
    s = create_stream(c, shards=2)
    put_values(c, s, range(100))
    chk = str(tmp_path / "chk")
    got: list[pa.Table] = []
    _available_now(kinesis, s, chk, got)
    assert sorted(v for t in got for v in values(t)) == list(range(100))
    c.split_shard(StreamName=s, ShardToSplit="shardId-000000000000", NewStartingHashKey=str(2**127 // 2))
    wait_active(c, s)
    put_values(c, s, range(100, 600))
    got.clear()
    _available_now(kinesis, s, chk, got)
    assert sorted(v for t in got for v in values(t)) == list(range(100, 600))
    assert all(t.schema == SCHEMA for t in got)
    got.clear()
    _available_now(kinesis, s, chk, got)
    assert sum(t.num_rows for t in got) == 0 and all(t.schema == SCHEMA for t in got)


def test_available_now_leaves_records_after_its_start_for_the_next_run(kinesis: Any) -> None:
    """The run's end is fixed by sequence numbers at its start, not by arrival times: records put
    after the start, also into children of a split made after the start, wait for the next run."""
    c = kinesis.client()
    s = create_stream(c, shards=1)
    put_values(c, s, range(10))
    src = make_source(source_opts(kinesis, s))
    a = src.initial_offset()
    assert src.prepare_for_available_now()
    put_values(c, s, range(10, 15))  # after the start, same shard
    c.split_shard(StreamName=s, ShardToSplit="shardId-000000000000", NewStartingHashKey=str(2**127))
    wait_active(c, s)
    put_values(c, s, range(15, 20))  # after the start, into the children
    batches, end = drain(src, a)
    assert sorted(v for t in batches for v in values(t)) == list(range(10))
    nxt = make_source(source_opts(kinesis, s))
    assert nxt.prepare_for_available_now()
    batches, _ = drain(nxt, end)
    assert sorted(v for t in batches for v in values(t)) == list(range(10, 20))


def test_an_empty_range_after_a_split_reaches_the_sink_with_the_schema(kinesis: Any, tmp_path: Any) -> None:
    """A split with no new record: the batch that finishes the parent and lists the children has
    no rows, and foreach_batch still gets the Kinesis columns."""
    from headrace_kinesis._schema import SCHEMA

    c = kinesis.client()
    s = create_stream(c, shards=1)
    put_values(c, s, range(3))
    chk = str(tmp_path / "chk")
    got: list[pa.Table] = []
    _available_now(kinesis, s, chk, got)
    c.split_shard(StreamName=s, ShardToSplit="shardId-000000000000", NewStartingHashKey=str(2**127))
    wait_active(c, s)
    got.clear()
    _available_now(kinesis, s, chk, got)
    assert got and all(t.num_rows == 0 and t.schema == SCHEMA for t in got)


def test_available_now_boundary_expired_reads_until_caught_up(faulty_kinesis: Any, caplog: Any) -> None:
    """The LATEST iterator taken at start expired before it was needed (a batch longer than 5
    minutes): nothing present at start is missed, the run reads the shard until caught up."""
    c = faulty_kinesis.client()
    s = create_stream(c)
    put_values(c, s, range(5))
    src = make_source(source_opts(faulty_kinesis, s))
    a = src.initial_offset()
    assert src.prepare_for_available_now()
    faulty_kinesis.set(clockOffsetMs=faulty_kinesis._state["clockOffsetMs"] + 301_000)
    put_values(c, s, range(5, 8))
    with caplog.at_level("INFO", logger="headrace_kinesis"):
        batches, _ = drain(src, a)
    got = sorted(v for t in batches for v in values(t))
    assert got[:5] == list(range(5)) and set(got) <= set(range(8))
    assert "start boundary of shard shardId-000000000000 expired" in caplog.text
