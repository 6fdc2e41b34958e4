"""The Arrow schema of the source's rows, and turning GetRecords records into a RecordBatch."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

__all__ = ["SCHEMA", "records_to_batch"]

SCHEMA = pa.schema(
    [
        pa.field("partitionKey", pa.string(), nullable=False),
        pa.field("data", pa.binary(), nullable=False),
        pa.field("stream", pa.string(), nullable=False),
        pa.field("shardId", pa.string(), nullable=False),
        pa.field("sequenceNumber", pa.string(), nullable=False),
        pa.field("approximateArrivalTimestamp", pa.timestamp("us", tz="UTC"), nullable=False),
    ]
)
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def _micros(t: Any) -> int:
    if isinstance(t, dt.datetime):
        return (t - _EPOCH) // dt.timedelta(microseconds=1)
    return int(float(t) * 1_000_000)


def records_to_batch(records: Sequence[dict[str, Any]], stream: str, shard_id: str) -> pa.RecordBatch:
    """One RecordBatch (exactly :data:`SCHEMA`) from boto3 GetRecords ``Records``."""
    n = len(records)
    return pa.RecordBatch.from_arrays(
        [
            pa.array([r["PartitionKey"] for r in records], pa.string()),
            pa.array([r["Data"] for r in records], pa.binary()),
            pa.array([stream] * n, pa.string()),
            pa.array([shard_id] * n, pa.string()),
            pa.array([r["SequenceNumber"] for r in records], pa.string()),
            pa.array([_micros(r["ApproximateArrivalTimestamp"]) for r in records], pa.int64()).cast(
                SCHEMA.field("approximateArrivalTimestamp").type
            ),
        ],
        schema=SCHEMA,
    )
