"""The checkpoint's entries: ``offsets/<n>`` (:class:`OffsetEntry`) and ``commits/<n>``."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from headrace.protocols import Offset

__all__ = ["FORMAT_VERSION", "LATE_EVENTS_KEY", "OffsetEntry", "commit_json"]

FORMAT_VERSION = 1


def _is_offset(value: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(k, str) for k in value)


def commit_json(batch_id: int, info: dict[str, Any] | None = None) -> bytes:
    """The body of ``commits/<n>``: version, batch id, time written, and what the engine records
    with it (the event-time maxima of a query with a watermark)."""
    doc = {"version": FORMAT_VERSION, "batchId": batch_id, "timestamp": int(time.time() * 1000), **(info or {})}
    return json.dumps(doc).encode()


#: the metadata key of the watermark for late events (the previous batch's ``batchWatermarkMs``)
LATE_EVENTS_KEY = "batchWatermarkForLateEventsMs"


def _check_watermarks(metadata: dict[str, Any]) -> None:
    """The recorded watermarks are epoch milliseconds, the one for late events no later than the
    batch's (watermarks never go backwards); raises ValueError naming the bad value."""
    values: dict[str, int] = {}
    for key in ("batchWatermarkMs", LATE_EVENTS_KEY):
        if key not in metadata:
            continue
        v = metadata[key]
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"metadata.{key} must be a non-negative integer (epoch ms), not {json.dumps(v)[:80]}")
        values[key] = v
    late, wm = values.get(LATE_EVENTS_KEY), values.get("batchWatermarkMs")
    if late is not None and (wm is None or late > wm):
        raise ValueError(
            f"metadata.{LATE_EVENTS_KEY} ({late}) must be at most metadata.batchWatermarkMs ({json.dumps(wm)}): "
            "the watermark for late events is the previous batch's"
        )


@dataclass(frozen=True)
class OffsetEntry:
    """One ``offsets/<n>`` entry: per source, where the batch starts and ends.

    ``ends`` items are ``None`` for a real-time batch still running (its end is written when the
    interval closes). ``metadata`` is what the batch must be replayed with (Spark's
    ``OffsetSeqMetadata``): ``batchWatermarkMs`` (the watermark for eviction),
    ``batchWatermarkForLateEventsMs`` (for late input: the previous batch's watermark; absent
    from entries written before it was recorded, where it is read from the previous entry),
    ``batchTimestampMs`` and the event-time maxima the watermark was computed from
    (``eventTimeMaxMs``); empty without a watermark.
    """

    batch_id: int
    starts: list[Offset]
    ends: list[Offset | None]
    timestamp_ms: int
    real_time: bool = False
    metadata: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> bytes:
        doc = {
            "version": FORMAT_VERSION,
            "batchId": self.batch_id,
            "timestamp": self.timestamp_ms,
            "realTime": self.real_time,
            "sources": [{"start": s, "end": e} for s, e in zip(self.starts, self.ends, strict=True)],
        }
        if self.metadata:
            doc["metadata"] = self.metadata
        return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> OffsetEntry:
        """Parse an entry, checking its structure; raises ValueError saying what is wrong."""
        srcs = data.get("sources")
        if not isinstance(srcs, list) or not srcs:
            raise ValueError(f"'sources' must be a non-empty list, not {json.dumps(srcs)[:80]}")
        batch_id = data.get("batchId")
        if isinstance(batch_id, bool) or not isinstance(batch_id, int) or batch_id < 0:
            raise ValueError(f"'batchId' must be a batch number, not {json.dumps(batch_id)[:80]}")
        timestamp = data.get("timestamp", 0)
        if isinstance(timestamp, bool) or not isinstance(timestamp, int | float):
            raise ValueError(f"'timestamp' must be a number, not {json.dumps(timestamp)[:80]}")
        real_time = data.get("realTime", False)
        if not isinstance(real_time, bool):
            raise ValueError(f"'realTime' must be true or false, not {json.dumps(real_time)[:80]}")
        metadata = data.get("metadata") or {}
        if not isinstance(metadata, dict):
            raise ValueError(f"'metadata' must be an object, not {json.dumps(metadata)[:80]}")
        _check_watermarks(metadata)
        for i, src in enumerate(srcs):
            if not isinstance(src, dict) or "start" not in src or "end" not in src:
                raise ValueError(f"sources[{i}] must be an object with 'start' and 'end'")
            if not _is_offset(src["start"]):
                raise ValueError(f"sources[{i}].start must be an offset object, not {json.dumps(src['start'])[:80]}")
            if not (_is_offset(src["end"]) or (src["end"] is None and real_time)):
                raise ValueError(f"sources[{i}].end must be an offset object, not {json.dumps(src['end'])[:80]}")
        return cls(
            batch_id=batch_id,
            starts=[s["start"] for s in srcs],
            ends=[s["end"] for s in srcs],
            timestamp_ms=int(timestamp),
            real_time=real_time,
            metadata=dict(metadata),
        )


