"""The event-time watermark, moved between batches and recorded with each one.

For batch ``n`` the engine writes ``batchWatermarkMs`` (the watermark in force) and
``eventTimeMaxMs`` (the maximum event time seen before the batch, per ``with_watermark`` step)
into ``offsets/<n>``, and the maxima after the batch into ``commits/<n>``. A replayed batch
uses its recorded watermark, so stateful operators produce the same output; a restart after a
committed batch continues from the maxima recorded with it.

As in Spark: each step's watermark is ``max event time - delay`` over the rows it has seen,
the query's is the minimum over its steps that have seen rows, and it never goes backwards.
The first batch runs with watermark 0 (1970-01-01).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

from headrace.transforms.watermark import WatermarkOperator

__all__ = ["EventTimeTracker", "iso_ms"]


def iso_ms(ms: float) -> str:
    """Epoch milliseconds as Spark prints them: ``2024-01-01T00:00:00.000Z``."""
    t = dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC)
    return t.isoformat(timespec="milliseconds").replace("+00:00", "Z")


class EventTimeTracker:
    """The watermark state of one query run (driver side)."""

    def __init__(self, ops: Sequence[tuple[int, WatermarkOperator]]) -> None:
        self.ops = list(ops)
        self.max_ms: dict[str, int] = {}
        self.watermark_ms: int | None = 0 if self.ops else None

    @property
    def enabled(self) -> bool:
        return bool(self.ops)

    def metadata(self, timestamp_ms: int) -> dict[str, Any]:
        """What ``offsets/<n>`` records for the next batch (empty without a watermark)."""
        if not self.enabled:
            return {}
        return {"batchWatermarkMs": self.watermark_ms, "batchTimestampMs": timestamp_ms,
                "eventTimeMaxMs": dict(self.max_ms)}  # fmt: skip

    def commit_info(self) -> dict[str, Any]:
        """What ``commits/<n>`` records after the batch (empty without a watermark)."""
        return {"eventTimeMaxMs": dict(self.max_ms)} if self.enabled else {}

    def restore(self, offsets_meta: Mapping[str, Any], commit_info: Mapping[str, Any] | None = None) -> None:
        """Continue from a checkpoint: the metadata of the last batch and, when that batch is
        committed, its commit entry (the maxima after it)."""
        if not self.enabled:
            return
        self.watermark_ms = int(offsets_meta.get("batchWatermarkMs") or 0)
        maxima = (commit_info or {}).get("eventTimeMaxMs", offsets_meta.get("eventTimeMaxMs")) or {}
        self.max_ms = {str(k): int(v) for k, v in dict(maxima).items()}
        if commit_info is not None:
            self._recompute()

    def _recompute(self) -> None:
        marks = [self.max_ms[str(i)] - op.delay_ms for i, op in self.ops if str(i) in self.max_ms]
        if marks:
            self.watermark_ms = max(self.watermark_ms or 0, min(marks))

    def after_batch(self, batch_watermark_ms: int | None) -> dict[str, str]:
        """Fold the batch's event times in and move the watermark for the next batch.
        Returns the batch's ``eventTime`` progress entry (Spark's shape)."""
        if not self.enabled:
            return {}
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
