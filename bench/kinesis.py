"""Benchmark: headrace's kinesis source vs a plain boto3 GetRecords loop, same shards, same run.

    .venv/bin/python bench/kinesis.py [--records N] [--shards S]

Starts kinesalite (tests/services), writes N records over S shards once, then times
(1) a plain boto3 loop: TRIM_HORIZON iterator per shard, GetRecords (10000 per call) until caught
up, records turned into Arrow batches with the same columns; and (2) a headrace query
(kinesis -> noop sink, trigger available_now, minFetchPeriod 0) reading the same records.
Prints records/s of each and the ratio headrace / boto3 (goal >= 0.8). Measures, asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pyarrow as pa

import headrace as hr
from headrace_kinesis._schema import records_to_batch
from tests.services import Kinesis


def fill(c: object, stream: str, n: int) -> None:
    payload = b"x" * 100
    for i in range(0, n, 500):
        c.put_records(StreamName=stream, Records=[{"Data": payload + str(j).encode(), "PartitionKey": f"k{j}"}  # type: ignore[attr-defined]
                                                  for j in range(i, min(n, i + 500))])  # fmt: skip


def raw_boto3(c: object, stream: str) -> int:
    rows = 0
    for sh in c.list_shards(StreamName=stream)["Shards"]:  # type: ignore[attr-defined]
        it = c.get_shard_iterator(StreamName=stream, ShardId=sh["ShardId"], ShardIteratorType="TRIM_HORIZON")["ShardIterator"]  # type: ignore[attr-defined]
        while it:
            r = c.get_records(ShardIterator=it, Limit=10000)  # type: ignore[attr-defined]
            if r["Records"]:
                rows += records_to_batch(r["Records"], stream, sh["ShardId"]).num_rows
            it = r.get("NextShardIterator")
            if not r["Records"] and not r.get("MillisBehindLatest"):
                break
    return rows


def headrace_run(k: Kinesis, stream: str) -> int:
    opts = {"streamName": stream, "endpoint": k.endpoint_url, "region": k.region, "awsAccessKey": k.aws_access_key_id,
            "awsSecretKey": k.aws_secret_access_key, "initialPosition": "trim_horizon", "minFetchPeriod": "0",
            "maxFetchRate": 1000, "maxFetchDuration": "60s"}  # fmt: skip
    with tempfile.TemporaryDirectory() as d:
        q = (hr.read_stream.format("kinesis").options(opts).load().write_stream.format("noop")
             .option("checkpointLocation", d).trigger(available_now=True).start())  # fmt: skip
        q.await_termination()
        return sum(p["numInputRows"] for p in q.recent_progress)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=40_000)
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    with Kinesis() as k:
        c = k.client()
        stream = "bench"
        c.create_stream(StreamName=stream, ShardCount=a.shards)
        fill(c, stream, a.records)
        pa.array([1])  # warm-up: pyarrow's first pa.array imports pandas (~1.5 s), not part of either side
        raw_boto3(c, stream)
        headrace_run(k, stream)
        best_raw = best_hr = 0.0
        for _ in range(a.rounds):
            t = time.perf_counter()
            n = raw_boto3(c, stream)
            best_raw = max(best_raw, n / (time.perf_counter() - t))
            t = time.perf_counter()
            m = headrace_run(k, stream)
            best_hr = max(best_hr, m / (time.perf_counter() - t))
            if not n == m == a.records:
                print(f"  warning: read {n} (boto3) and {m} (headrace) records of {a.records}")
        print(f"kinesis source, {a.records} records x {a.shards} shards (kinesalite), best of {a.rounds}:")
        print(f"  boto3 get_records loop : {best_raw:10.0f} records/s")
        print(f"  headrace kinesis->noop : {best_hr:10.0f} records/s")
        print(f"  ratio headrace/boto3   : {best_hr / best_raw:10.2f}  (goal >= 0.8)")


if __name__ == "__main__":
    main()
