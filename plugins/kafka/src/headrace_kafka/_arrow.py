"""The source's Arrow schema and the conversion of confluent-kafka messages to record batches."""

from __future__ import annotations

from collections.abc import Sequence
from operator import itemgetter
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import Message

__all__ = ["HEADERS_TYPE", "schema", "to_record_batch"]

HEADERS_TYPE = pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))
_TS = pa.timestamp("us", tz="UTC")
_TS_MS = pa.timestamp("ms", tz="UTC")
_SPARK_CREATE_TIME = pa.scalar(0, pa.int32())

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


_key = Message.key
_value = Message.value
_offset = Message.offset
_timestamp = Message.timestamp
_first, _second = itemgetter(0), itemgetter(1)
_CREATE_TIME = 1  # librdkafka's TIMESTAMP_CREATE_TIME
_NULL_TS = pa.scalar(None, pa.int64())


def _timestamps(msgs: Sequence[Any], n: int) -> tuple[pa.Array, pa.Array]:
    """(timestamp, timestampType) columns; no per-message Python bytecode (``map`` over C methods)."""
    if n == 0:
        return pa.array([], _TS), pa.array([], pa.int32())
    pairs = list(map(_timestamp, msgs))
    types, ms = list(map(_first, pairs)), list(map(_second, pairs))
    ts_ms = pa.array(ms, type=pa.int64())
    if types.count(_CREATE_TIME) == n and min(ms) >= 0:  # the common case: every record has a create time
        return ts_ms.cast(_TS_MS).cast(_TS), pa.repeat(_SPARK_CREATE_TIME, n)
    # timestampType: librdkafka's NOT_AVAILABLE=0, CREATE_TIME=1, LOG_APPEND_TIME=2; Spark's 0=create, 1=log append
    ts_types = pc.max_element_wise(pc.subtract(pa.array(types, type=pa.int32()), 1), 0)
    ts = pc.if_else(pc.greater_equal(ts_ms, 0), pc.multiply(ts_ms, 1000), _NULL_TS).cast(_TS)
    return ts, ts_types


def to_record_batch(
    msgs: Sequence[Any], topic: str, partition: int, include_headers: bool, offsets: Sequence[int] | None = None
) -> pa.RecordBatch:
    """Messages of ONE topic-partition (confluent_kafka.Message, no errors) as a record batch.

    One ``pa.array`` call per column over lists built by ``map`` on the C methods of
    ``Message`` (no Python loop per message). ``offsets``: the messages' offsets, when the caller
    has them already. Called once per consumed chunk, on the reading thread.
    """
    n = len(msgs)
    ts, ts_types = _timestamps(msgs, n)
    cols: list[pa.Array] = [
        pa.array(list(map(_key, msgs)), type=pa.binary()),
        pa.array(list(map(_value, msgs)), type=pa.binary()),
        pa.repeat(pa.scalar(topic, pa.string()), n),
        pa.repeat(pa.scalar(partition, pa.int32()), n),
        pa.array(offsets if offsets is not None else list(map(_offset, msgs)), type=pa.int64()),
        ts,
        ts_types,
    ]
    if include_headers:
        cols.append(_headers(msgs))
    return pa.RecordBatch.from_arrays(cols, schema=schema(include_headers))
