"""The Arrow schema of the ``pubsub`` source and the conversion of pulled messages into it.

No client library import: messages are duck-typed protobuf ``ReceivedMessage`` objects.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pyarrow as pa

__all__ = ["IDS_SCHEMA", "SCHEMA", "Columns", "messages_to_batch"]

SCHEMA = pa.schema(
    [
        pa.field("messageId", pa.string(), nullable=False),
        pa.field("payload", pa.binary(), nullable=False),
        pa.field("attributes", pa.map_(pa.string(), pa.string())),
        pa.field("publishTimestampInMillis", pa.int64(), nullable=False),
        pa.field("orderingKey", pa.string()),
        pa.field("deliveryAttempt", pa.int32()),
    ]
)
"""Columns of the source: the reference's four, plus ``orderingKey`` and ``deliveryAttempt``
(set only on subscriptions with a dead-letter policy; null otherwise)."""

IDS_SCHEMA = pa.schema([pa.field("messageId", pa.string(), nullable=False), pa.field("ackId", pa.string())])
"""What each staged segment remembers besides its rows: message ids (for de-duplication after
restarts) and ack ids (to acknowledge again after a crash between staging and ack)."""


class Columns:
    """Pulled messages gathered column by column, in pull order: one pass over the protobuf
    objects (the pullers add each message as they accept it), then one Arrow array per column.

    Attributes go in as flat key and value lists with offsets (a ``MapArray`` built from
    arrays), not as a list of pairs per row: ~3x cheaper for pyarrow to convert. Not
    thread-safe: the fetch holds its lock while adding."""

    __slots__ = ("ack_ids", "attempts", "attr_keys", "attr_offsets", "attr_values", "bytes", "ids", "keys",
                 "payloads", "times")  # fmt: skip

    def __init__(self) -> None:
        self.ids: list[str] = []
        self.payloads: list[bytes] = []
        self.attr_keys: list[str] = []
        self.attr_values: list[str] = []
        self.attr_offsets: list[int] = [0]
        self.times: list[int] = []
        self.keys: list[str | None] = []
        self.attempts: list[int | None] = []
        self.ack_ids: list[str] = []
        self.bytes = 0

    def __len__(self) -> int:
        return len(self.ids)

    def add(self, received: Any, message_id: str, publish_ms: int) -> None:
        """Append one ``ReceivedMessage`` (its id and publish time already read by the caller)."""
        m = received.message
        data = m.data
        self.ids.append(message_id)
        self.payloads.append(data)
        self.bytes += len(data)
        attrs = m.attributes
        if attrs:
            keys, values = self.attr_keys, self.attr_values
            for k in attrs:  # the map's own iterator and __getitem__ (C); .items() is the slow abc view
                keys.append(k)
                values.append(attrs[k])
        self.attr_offsets.append(len(self.attr_keys))
        self.times.append(publish_ms)
        self.keys.append(m.ordering_key or None)
        self.attempts.append(received.delivery_attempt or None)
        self.ack_ids.append(received.ack_id)

    def to_batch(self) -> pa.RecordBatch:
        """The rows as one record batch of ``SCHEMA``."""
        attributes = pa.MapArray.from_arrays(
            pa.array(self.attr_offsets, pa.int32()),
            pa.array(self.attr_keys, pa.string()),
            pa.array(self.attr_values, pa.string()),
            type=SCHEMA.field("attributes").type,
        )
        return pa.RecordBatch.from_arrays(
            [
                pa.array(self.ids, pa.string()),
                pa.array(self.payloads, pa.binary()),
                attributes,
                pa.array(self.times, pa.int64()),
                pa.array(self.keys, pa.string()),
                pa.array(self.attempts, pa.int32()),
            ],
            schema=SCHEMA,
        )


def publish_millis(message: Any) -> int:
    """A message's publish time in epoch milliseconds."""
    pt = message.publish_time
    return int(pt.seconds * 1000 + pt.nanos // 1_000_000)


def messages_to_batch(received: Iterable[Any]) -> pa.RecordBatch:
    """Convert protobuf ``ReceivedMessage`` objects (in pull order) into one batch of ``SCHEMA``.

    Called by tests and tools; the source builds its batches with :class:`Columns` directly."""
    cols = Columns()
    for r in received:
        cols.add(r, r.message.message_id, publish_millis(r.message))
    return cols.to_batch()
