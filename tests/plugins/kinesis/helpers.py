"""Helpers for the kinesis plugin tests (importable in pipeline subprocesses)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterable
from typing import Any

import pyarrow as pa

from headrace.testing import wait_for

__all__ = ["create_stream", "put_values", "read_all_values", "sink_opts", "source_opts", "to_kinesis", "wait_active", "wait_for"]


def create_stream(client: Any, shards: int = 1, prefix: str = "t") -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:10]}"
    client.create_stream(StreamName=name, ShardCount=shards)
    wait_active(client, name)
    return name


def wait_active(client: Any, name: str) -> None:
    """Wait until a stream is ACTIVE again (after create, split or merge)."""
    wait_for(lambda: client.describe_stream_summary(StreamName=name)["StreamDescriptionSummary"]["StreamStatus"] == "ACTIVE",
             what=f"stream {name} active")  # fmt: skip


def put_values(client: Any, stream: str, values: Iterable[int], *, key: Callable[[int], str] = lambda v: f"k{v}") -> None:
    """Put one record per value (data = the decimal value), 500 per PutRecords call."""
    vals = list(values)
    for i in range(0, len(vals), 500):
        chunk = vals[i : i + 500]
        resp = client.put_records(StreamName=stream, Records=[{"Data": str(v).encode(), "PartitionKey": key(v)} for v in chunk])
        assert resp["FailedRecordCount"] == 0, resp


def source_opts(kinesis: Any, stream: str, **extra: Any) -> dict[str, Any]:
    return {"streamName": stream, "endpoint": kinesis.endpoint_url, "region": kinesis.region,
            "awsAccessKey": kinesis.aws_access_key_id, "awsSecretKey": kinesis.aws_secret_access_key,
            "initialPosition": "trim_horizon", "minFetchPeriod": "0", "shardFetchInterval": "0",
            "maxFetchDuration": "2s", **extra}  # fmt: skip


def sink_opts(kinesis: Any, stream: str, **extra: Any) -> dict[str, Any]:
    return {"streamName": stream, "endpoint": kinesis.endpoint_url, "region": kinesis.region,
            "awsAccessKey": kinesis.aws_access_key_id, "awsSecretKey": kinesis.aws_secret_access_key,
            "retryBackoff": "0.01", **extra}  # fmt: skip


def read_all_values(client: Any, stream: str) -> list[int]:
    """Every record's data (as int) in the stream, all shards, with a plain boto3 loop."""
    out: list[int] = []
    for s in client.list_shards(StreamName=stream)["Shards"]:
        it = client.get_shard_iterator(StreamName=stream, ShardId=s["ShardId"], ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
        while it:
            r = client.get_records(ShardIterator=it, Limit=10000)
            out.extend(int(x["Data"]) for x in r["Records"])
            it = r.get("NextShardIterator")
            if not r["Records"] and not r.get("MillisBehindLatest"):
                break
    return out


def to_kinesis(table: pa.Table) -> pa.Table:
    """rate-micro-batch rows (timestamp, value) -> partitionKey, data (the value as text)."""
    values = table.column("value").to_pylist()
    return pa.table({"partitionKey": [f"k{v % 7}" for v in values], "data": [json.dumps(v).encode() for v in values]})
