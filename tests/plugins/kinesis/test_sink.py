"""KinesisSink against kinesalite: batching within limits, partial failures, clear errors."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

import headrace as hr
from headrace.errors import HeadraceError
from headrace.plugins import registry
from headrace.protocols import SinkContext
from tests.plugins.kinesis.helpers import create_stream, read_all_values, sink_opts


def make_sink(options: dict[str, Any]) -> Any:
    spec = registry().get("kinesis")
    return spec.load_sink()(spec.sink_options.parse(options, connector="kinesis", role="sink"), SinkContext())


def table(lo: int, hi: int, **cols: Any) -> pa.Table:
    return pa.table({"partitionKey": [f"k{i}" for i in range(lo, hi)], "data": [str(i) for i in range(lo, hi)], **cols})


def test_batches_respect_record_and_byte_limits(kinesis: Any) -> None:
    c = kinesis.client()
    s = create_stream(c, shards=2)
    sink = make_sink(sink_opts(kinesis, s, maxRecordsPerRequest=100))
    msg = sink.write(0, iter(table(0, 250).to_batches(max_chunksize=70)))
    assert (msg.records, msg.requests) == (250, 3)
    big = pa.table({"partitionKey": ["a"] * 12, "data": [b"x" * 1_000_000] * 12})  # 12 MB: at least 3 requests
    msg = sink.write(1, iter(big.to_batches()))
    assert msg.records == 12 and msg.requests >= 3
    assert sorted(v for v in read_all_values_text(c, s) if v is not None) == list(range(250))


def read_all_values_text(c: Any, s: str) -> list[int | None]:
    out: list[int | None] = []
    for sh in c.list_shards(StreamName=s)["Shards"]:
        it = c.get_shard_iterator(StreamName=s, ShardId=sh["ShardId"], ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
        r = c.get_records(ShardIterator=it, Limit=10000)
        out.extend(int(x["Data"]) if len(x["Data"]) < 20 else None for x in r["Records"])
    return out


def test_explicit_hash_key_routes_records(kinesis: Any) -> None:
    c = kinesis.client()
    s = create_stream(c, shards=2)
    sink = make_sink(sink_opts(kinesis, s, explicitHashKeyColumn="h"))
    sink.write(0, iter(table(0, 10, h=[str(2**127 + 5)] * 10).to_batches()))  # all into the upper shard
    it = c.get_shard_iterator(StreamName=s, ShardId="shardId-000000000001", ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
    assert len(c.get_records(ShardIterator=it)["Records"]) == 10


def test_partial_failures_retry_only_failed_records(faulty_kinesis: Any) -> None:
    c = faulty_kinesis.client()
    s = create_stream(c)
    sink = make_sink(sink_opts(faulty_kinesis, s))
    faulty_kinesis.set(partialPutRecords=2)  # two calls fail every 2nd record
    msg = sink.write(0, iter(table(0, 40).to_batches()))
    faulty_kinesis.set()
    assert msg.retried == 20 + 10 and msg.requests == 3
    assert sorted(read_all_values(c, s)) == list(range(40)), "each record exactly once: only failed ones are resent"


def test_partial_failures_give_up_after_max_retries(faulty_kinesis: Any) -> None:
    c = faulty_kinesis.client()
    s = create_stream(c)
    sink = make_sink(sink_opts(faulty_kinesis, s, maxRetries=1))
    faulty_kinesis.set(partialPutRecords=5)
    with pytest.raises(HeadraceError, match=r"still rejected.*after 1 retries.*ProvisionedThroughputExceeded.*fix"):
        sink.write(0, iter(table(0, 8).to_batches()))
    faulty_kinesis.set()


@pytest.mark.parametrize(
    ("data", "match"),
    [
        pytest.param(pa.table({"data": ["1"]}), r"no column 'partitionKey'", id="missing-key-column"),
        pytest.param(pa.table({"partitionKey": ["a"], "data": [1]}), r"'data' is int64; it must be binary or string", id="int-data"),
        pytest.param(pa.table({"partitionKey": [""], "data": ["1"]}), r"row 0 has partition key ''", id="empty-key"),
        pytest.param(pa.table({"partitionKey": ["a"], "data": [b"x" * (1024 * 1024)]}), r"row 0 is 1048577 bytes", id="too-big"),
    ],
)
def test_bad_rows_are_clear_errors(kinesis: Any, data: pa.Table, match: str) -> None:
    sink = make_sink(sink_opts(kinesis, "never-written"))
    with pytest.raises(HeadraceError, match=match):
        sink.write(0, iter(data.to_batches()))


def test_pipeline_into_kinesis(kinesis: Any, tmp_path: Any) -> None:
    from tests.plugins.kinesis.helpers import to_kinesis

    c = kinesis.client()
    s = create_stream(c, shards=2)
    q = (hr.read_stream.format("rate-micro-batch").options(rowsPerBatch=50, totalRows=200).load().map_batches(to_kinesis)
         .write_stream.format("kinesis").options(sink_opts(kinesis, s)).option("checkpointLocation", str(tmp_path / "c"))
         .trigger(available_now=True).start())  # fmt: skip
    assert q.await_termination(60)
    assert sorted(read_all_values(c, s)) == list(range(200))
    assert q.last_progress is not None and q.delivery_guarantee == "at-least-once"
