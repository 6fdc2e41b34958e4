"""The source's Arrow schema and the conversion of confluent-kafka messages to record batches."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["HEADERS_TYPE", "schema", "to_record_batch"]

HEADERS_TYPE = pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))
_TS = pa.timestamp("us", tz="UTC")

_BASE = [
    pa.field("key", pa.binary()),
    pa.field("value", pa.binary()),
    pa.field("topic", pa.string(), nullable=False),
    pa.field("partition", pa.int32(), nullable=False),
    pa.field("offset", pa.int64(), nullable=False),
    pa.field("timestamp", _TS),
    pa.field("timestampType", pa.int32(), nullable=False),
]
_SCHEMA = pa.schema(_BASE)
_SCHEMA_HEADERS = pa.schema([*_BASE, pa.field("headers", HEADERS_TYPE)])


def schema(include_headers: bool) -> pa.Schema:
    """The source's columns, as Spark's Kafka source has them (``headers`` only when asked)."""
    return _SCHEMA_HEADERS if include_headers else _SCHEMA


def _headers(msgs: Sequence[Any]) -> pa.Array:
    out = []
    for m in msgs:
        h = m.headers()
        out.append(None if h is None else [(k, v if v is None or isinstance(v, bytes) else bytes(v)) for k, v in h])
    return pa.array([None if h is None else [{"key": k, "value": v} for k, v in h] for h in out], type=HEADERS_TYPE)


def to_record_batch(msgs: Sequence[Any], topic: str, partition: int, include_headers: bool) -> pa.RecordBatch:
    """Messages of ONE topic-partition (confluent_kafka.Message, no errors) as a record batch.

    Called once per consumed chunk, on the reading thread.
    """
    n = len(msgs)
    ts_pairs = [m.timestamp() for m in msgs]
    ts_ms = pa.array([t[1] for t in ts_pairs], type=pa.int64())
    ts_types = pa.array([t[0] for t in ts_pairs], type=pa.int32())
    # timestampType: librdkafka's NOT_AVAILABLE=0, CREATE_TIME=1, LOG_APPEND_TIME=2; Spark's 0=create, 1=log append
    ts_types = pc.max_element_wise(pc.subtract(ts_types, 1), 0)
    ts_valid = pc.greater_equal(ts_ms, 0)
    ts = pc.if_else(ts_valid, pc.multiply(ts_ms, 1000), pa.scalar(None, pa.int64())).cast(_TS)
    cols: list[pa.Array] = [
        pa.array([m.key() for m in msgs], type=pa.binary()),
        pa.array([m.value() for m in msgs], type=pa.binary()),
        pa.array([topic] * n, type=pa.string()),
        pa.array([partition] * n, type=pa.int32()),
        pa.array([m.offset() for m in msgs], type=pa.int64()),
        ts,
        ts_types,
    ]
    if include_headers:
        cols.append(_headers(msgs))
    return pa.RecordBatch.from_arrays(cols, schema=schema(include_headers))
