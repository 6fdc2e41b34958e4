"""The event-time watermark, moved between batches and recorded with each one.

Each batch runs with two watermarks, as in Spark since 3.4: the one for eviction
(``batchWatermarkMs``: computed from the batches before it; stateful operators emit and evict
what it has passed) and the one for late events (``batchWatermarkForLateEventsMs``: the
previous batch's watermark; input rows it has passed are dropped as late). A row that arrives
one batch after the watermark passed it is therefore still aggregated, and its window emitted
at once, as Spark does.

For batch ``n`` the engine writes both watermarks and ``eventTimeMaxMs`` (the maximum event
time seen before the batch, per ``with_watermark`` step) into ``offsets/<n>``, and the maxima
after the batch into ``commits/<n>``. A replayed batch uses its recorded watermarks, so
stateful operators produce the same output (an entry written before the late-events watermark
was recorded takes it from the previous entry, :func:`late_events_ms`); a restart after a
committed batch continues from the maxima recorded with it.

As in Spark: each step's watermark is ``max event time - delay`` over the rows it has seen (0
while it has seen none), the query's is the minimum over its steps (``multipleWatermarkPolicy``
``min``, the default) or the maximum (``max``), and it never goes backwards. With several
watermarked inputs (the two sides of a stream-stream join), ``min`` therefore holds the
watermark at 0 until every input has seen a row. The first batch runs with watermark 0
(1970-01-01).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from headrace.checkpoint.entries import LATE_EVENTS_KEY
from headrace.transforms.watermark import WatermarkOperator

__all__ = ["WATERMARK_POLICIES", "EventTimeTracker", "iso_ms", "late_events_ms"]

#: ``multipleWatermarkPolicy`` values (Spark's ``spark.sql.streaming.multipleWatermarkPolicy``)
WATERMARK_POLICIES = ("min", "max")


def iso_ms(ms: float) -> str:
    """Epoch milliseconds as Spark prints them: ``2024-01-01T00:00:00.000Z``."""
    t = dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC)
    return t.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def late_events_ms(metadata: Mapping[str, Any], batch_id: int,
                   previous: Callable[[int], Mapping[str, Any] | None]) -> int:  # fmt: skip
    """The watermark for late events of batch ``batch_id`` whose ``offsets`` metadata is
    ``metadata``: the recorded one or, in an entry written before it was recorded, the
    previous batch's ``batchWatermarkMs`` (``previous(batch_id - 1)`` returns that entry's
    metadata, or None when it is gone: then the batch's own watermark, by which the code that
    wrote the entry dropped late rows). Called once per batch run, on the query's thread."""
    if LATE_EVENTS_KEY in metadata:
        return int(metadata[LATE_EVENTS_KEY])
    own = int(metadata.get("batchWatermarkMs") or 0)
    if batch_id <= 0:
        return 0
    prev = previous(batch_id - 1)
    if prev is None:
        return own
    return min(own, int(prev.get("batchWatermarkMs") or 0))


class EventTimeTracker:
    """The watermark state of one query run (driver side)."""

    def __init__(self, ops: Sequence[tuple[int | str, WatermarkOperator]], policy: str = "min") -> None:
        if policy not in WATERMARK_POLICIES:
            raise ValueError(f"multipleWatermarkPolicy {policy!r} is not one of {', '.join(WATERMARK_POLICIES)}")
        self.policy = policy
        self.ops = list(ops)
        self.max_ms: dict[str, int] = {}
        self.watermark_ms: int | None = 0 if self.ops else None
        # the watermark the last batch ran with: the next batch's watermark for late events
        self.batch_watermark_ms: int = 0

    @property
    def enabled(self) -> bool:
        return bool(self.ops)

    def metadata(self, timestamp_ms: int) -> dict[str, Any]:
        """What ``offsets/<n>`` records for the next batch (empty without a watermark): both
        watermarks, the batch's time and the event-time maxima."""
        if not self.enabled:
            return {}
        return {"batchWatermarkMs": self.watermark_ms, LATE_EVENTS_KEY: min(self.batch_watermark_ms, self.watermark_ms or 0),
                "batchTimestampMs": timestamp_ms, "eventTimeMaxMs": dict(self.max_ms)}  # fmt: skip

    def commit_info(self) -> dict[str, Any]:
        """What ``commits/<n>`` records after the batch (empty without a watermark)."""
        return {"eventTimeMaxMs": dict(self.max_ms)} if self.enabled else {}

    def restore(self, offsets_meta: Mapping[str, Any], commit_info: Mapping[str, Any] | None = None) -> None:
        """Continue from a checkpoint: the metadata of the last batch and, when that batch is
        committed, its commit entry (the maxima after it)."""
        if not self.enabled:
            return
        self.watermark_ms = int(offsets_meta.get("batchWatermarkMs") or 0)
        self.batch_watermark_ms = self.watermark_ms  # the next batch's watermark for late events
        maxima = (commit_info or {}).get("eventTimeMaxMs", offsets_meta.get("eventTimeMaxMs")) or {}
        self.max_ms = {str(k): int(v) for k, v in dict(maxima).items()}
        if commit_info is not None:
            self._recompute()

    def _recompute(self) -> None:
        # a step that has seen no row counts as 0 (Spark's WatermarkTracker)
        marks = [self.max_ms[str(i)] - op.delay_ms if str(i) in self.max_ms else 0 for i, op in self.ops]
        if marks:
            chosen = min(marks) if self.policy == "min" else max(marks)
            self.watermark_ms = max(self.watermark_ms or 0, chosen)

    def after_batch(self, batch_watermark_ms: int | None) -> dict[str, str]:
        """Fold the batch's event times in and move the watermark for the next batch.
        Returns the batch's ``eventTime`` progress entry (Spark's shape)."""
        if not self.enabled:
            return {}
        self.batch_watermark_ms = int(batch_watermark_ms or 0)
        out: dict[str, str] = {"watermark": iso_ms(batch_watermark_ms or 0)}
        lo: int | None = None
        hi: int | None = None
        total = 0
        n = 0
        for i, op in self.ops:
            s = op.stats
            if not s.count or s.max is None or s.min is None:
                continue
            key = str(i)
            self.max_ms[key] = max(self.max_ms.get(key, s.max), s.max)
            lo = s.min if lo is None else min(lo, s.min)
            hi = s.max if hi is None else max(hi, s.max)
            total += s.sum
            n += s.count
        if n and lo is not None and hi is not None:
            out.update({"min": iso_ms(lo), "max": iso_ms(hi), "avg": iso_ms(total / n)})
        self._recompute()
        return out
