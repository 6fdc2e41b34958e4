"""The Arrow schema of the ``pubsub`` source and the conversion of pulled messages into it.

No client library import: messages are duck-typed protobuf ``ReceivedMessage`` objects.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa

__all__ = ["IDS_SCHEMA", "SCHEMA", "messages_to_batch"]

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


def messages_to_batch(received: Sequence[Any]) -> pa.RecordBatch:
    """Convert protobuf ``ReceivedMessage`` objects (in pull order) into one batch of ``SCHEMA``.

    Called once per fetch partition per micro-batch, on the driver.
    """
    ids: list[str] = []
    payloads: list[bytes] = []
    attrs: list[list[tuple[str, str]] | None] = []
    times: list[int] = []
    keys: list[str | None] = []
    attempts: list[int | None] = []
    for r in received:
        m = r.message
        ids.append(m.message_id)
        payloads.append(m.data)
        a = m.attributes
        attrs.append(list(a.items()) if a else [])
        pt = m.publish_time
        times.append(pt.seconds * 1000 + pt.nanos // 1_000_000)
        keys.append(m.ordering_key or None)
        attempts.append(r.delivery_attempt or None)
    return pa.RecordBatch.from_arrays(
        [
            pa.array(ids, pa.string()),
            pa.array(payloads, pa.binary()),
            pa.array(attrs, SCHEMA.field("attributes").type),
            pa.array(times, pa.int64()),
            pa.array(keys, pa.string()),
            pa.array(attempts, pa.int32()),
        ],
        schema=SCHEMA,
    )
