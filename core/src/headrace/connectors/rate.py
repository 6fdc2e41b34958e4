"""``rate`` and ``rate-micro-batch``: generated ``(timestamp, value)`` rows, as in Spark.

Both are deterministic: row ``i`` always has ``value = i`` and a timestamp computed from ``i``,
so any range can be re-read identically (replayable, exactly-once with an idempotent sink).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from headrace.checkpoint import atomic_write
from headrace.options import Options
from headrace.protocols import Offset, Partition, ReadLimit, RealTimeChunk, Source, SourceContext

__all__ = ["RateMicroBatchSource", "RateSource"]

SCHEMA = pa.schema([pa.field("timestamp", pa.timestamp("us", tz="UTC"), nullable=False),
                    pa.field("value", pa.int64(), nullable=False)])  # fmt: skip
_CHUNK = 65536

try:  # numpy makes generation ~50x faster; pyarrow alone works too
    import numpy as _np
except ImportError:  # pragma: no cover
    _np = None  # type: ignore[assignment]


def _int64(values: Any) -> pa.Array:
    """A numpy int64 array as an Arrow array, zero-copy (``pa.array`` would import pandas)."""
    return pa.Array.from_buffers(pa.int64(), len(values), [None, pa.py_buffer(values)])


_BASE: Any = None  # numpy 0.._CHUNK-1, made once: ranges are computed into Arrow buffers from it


def _range_into(out: Any, a: int) -> None:
    """``out[:] = a, a + 1, ...`` without a temporary."""
    global _BASE
    if _BASE is None:
        _BASE = _np.arange(_CHUNK, dtype=_np.int64)
    _np.add(_BASE[: len(out)], a, out=out)


def _int_range(a: int, b: int) -> pa.Array:
    if _np is not None and 0 < b - a <= _CHUNK:
        from headrace._buffers import int64_array, new_int64

        buf, view = new_int64(b - a)
        _range_into(view, a)
        return int64_array(buf, b - a)
    if _np is not None:
        return _int64(_np.arange(a, b, dtype=_np.int64))
    return pa.array(range(a, b), type=pa.int64())


@dataclass(frozen=True)
class RangePartition(Partition):
    """Rows ``[start, end)``."""

    start: int
    end: int


def _split(a: int, b: int, n: int) -> list[RangePartition]:
    if a >= b:
        return []
    n = max(1, min(n, b - a))
    step, extra = divmod(b - a, n)
    out, lo = [], a
    for k in range(n):
        hi = lo + step + (1 if k < extra else 0)
        out.append(RangePartition(lo, hi))
        lo = hi
    return out


class RateMicroBatchSource(Source):
    """``rowsPerBatch`` rows per micro-batch; row ``i`` has timestamp
    ``startTimestamp + (i // rowsPerBatch) * advanceMillisPerBatch``. Offsets: ``{"rows": n}``."""

    supports_planning_ahead = True  # offsets are row counts: latest_offset is arithmetic
    reads_wait = False  # rows are generated in process

    def __init__(self, options: Options, context: SourceContext) -> None:
        super().__init__(options, context)
        self.per_batch: int = options["rowsPerBatch"]
        self.num_partitions: int = options["numPartitions"]
        self.start_ts: int = options["startTimestamp"]
        self.advance: int = options["advanceMillisPerBatch"]
        self.total: int | None = options["totalRows"]
        self._available_now = False
        self._target: int | None = None

    @property
    def schema(self) -> pa.Schema:
        return SCHEMA

    def initial_offset(self) -> Offset:
        return {"rows": 0}

    def default_read_limit(self) -> ReadLimit:
        return ReadLimit(max_rows=self.per_batch)

    def prepare_for_available_now(self) -> bool:
        self._available_now = True
        if self.total is not None:  # what is there now; without totalRows, one batch from the start
            self._target = self.total
        return True

    def latest_offset(self, start: Offset, limit: ReadLimit) -> Offset:
        begin = int(start["rows"])
        if self._available_now and self._target is None:
            self._target = self.total if self.total is not None else begin + self.per_batch
        cap = self._target if self._target is not None else self.total
        n = self.per_batch if limit.max_rows is None else min(self.per_batch, limit.max_rows)
        end = cap if limit.is_all_available and cap is not None else begin + n
        if cap is not None:
            end = min(end, cap)
        return {"rows": max(begin, end)}

    def partitions(self, start: Offset, end: Offset) -> Sequence[Partition]:
        return _split(int(start["rows"]), int(end["rows"]), self.num_partitions)

    def read(self, partition: Partition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, RangePartition)
        for lo in range(partition.start, partition.end, _CHUNK):
            hi = min(partition.end, lo + _CHUNK)
            values = _int_range(lo, hi)
            if _np is not None:
                buf = self._timestamps_us(lo, hi)
                ts = pa.Array.from_buffers(SCHEMA.field("timestamp").type, hi - lo, [None, buf])
            else:  # pragma: no cover
                ts = pa.array([(self.start_ts + (i // self.per_batch) * self.advance) * 1000 for i in range(lo, hi)],
                              type=pa.int64()).cast(SCHEMA.field("timestamp").type)  # fmt: skip
            yield pa.RecordBatch.from_arrays([ts, values], schema=SCHEMA)

    def _timestamps_us(self, lo: int, hi: int) -> pa.Buffer:
        """The timestamps (µs) of rows ``[lo, hi)`` (at most ``_CHUNK``), computed in place in
        one pooled buffer (:func:`headrace._buffers.new_int64`), not one numpy temporary per
        arithmetic step."""
        from headrace._buffers import new_int64

        buf, ts = new_int64(hi - lo)
        first, last = lo // self.per_batch, (hi - 1) // self.per_batch
        if first == last:  # the whole chunk is one micro-batch: one timestamp
            ts.fill((self.start_ts + first * self.advance) * 1000)
            return buf
        _range_into(ts, lo)
        ts //= self.per_batch
        ts *= self.advance
        ts += self.start_ts
        ts *= 1000
        return buf

    def metrics(self, latest: Offset) -> Mapping[str, Any]:
        if self.total is None:
            return {}
        return {"numRowsOutstanding": max(0, self.total - int(latest["rows"]))}


class RateSource(Source):
    """``rowsPerSecond`` rows per second of wall-clock time since the stream first started
    (kept in the checkpoint, so a restart continues the same sequence). Row ``i`` has timestamp
    ``start + i / rowsPerSecond``. Supports the real-time trigger."""

    supports_real_time = True
    reads_wait = False  # rows are generated in process

    needs_state_path = True  # the start time, so a restart continues the same timeline

    def __init__(self, options: Options, context: SourceContext) -> None:
        super().__init__(options, context)
        self.rps: int = options["rowsPerSecond"]
        self.num_partitions: int = options["numPartitions"]
        self.max_rows: int | None = options["maxRowsPerTrigger"]
        self._start_ms: int | None = None
        self._available_now_target: int | None = None
        self._prepared = False

    @property
    def start_ms(self) -> int:
        if self._start_ms is None:
            state = os.path.join(self.context.state_path, "rate.json") if self.context.state_path else None
            if state and os.path.exists(state):
                with open(state) as f:
                    self._start_ms = int(json.load(f)["startTimeMs"])
            else:
                self._start_ms = int(time.time() * 1000)
                if state:
                    atomic_write(state, json.dumps({"startTimeMs": self._start_ms}).encode())
        return self._start_ms

    @property
    def schema(self) -> pa.Schema:
        return SCHEMA

    def initial_offset(self) -> Offset:
        _ = self.start_ms
        return {"rows": 0}

    def default_read_limit(self) -> ReadLimit:
        return ReadLimit(max_rows=self.max_rows) if self.max_rows else ReadLimit.all_available()

    def _available(self) -> int:
        return int((time.time() * 1000 - self.start_ms) * self.rps / 1000)

    def prepare_for_available_now(self) -> bool:
        self._prepared = True
        return True

    def latest_offset(self, start: Offset, limit: ReadLimit) -> Offset:
        if self._prepared and self._available_now_target is None:
            self._available_now_target = self._available()
        end = self._available_now_target if self._available_now_target is not None else self._available()
        if limit.max_rows is not None:
            end = min(end, int(start["rows"]) + limit.max_rows)
        return {"rows": max(int(start["rows"]), end)}

    def partitions(self, start: Offset, end: Offset) -> Sequence[Partition]:
        return _split(int(start["rows"]), int(end["rows"]), self.num_partitions)

    def _batch(self, lo: int, hi: int) -> pa.RecordBatch:
        values = _int_range(lo, hi)
        if _np is not None:
            micros = self.start_ms * 1000 + (_np.arange(lo, hi, dtype=_np.int64) * 1_000_000) // self.rps
            ts = _int64(micros)
        else:  # pragma: no cover
            ts = pa.array([self.start_ms * 1000 + i * 1_000_000 // self.rps for i in range(lo, hi)], type=pa.int64())
        return pa.RecordBatch.from_arrays([ts.cast(SCHEMA.field("timestamp").type), values], schema=SCHEMA)

    def read(self, partition: Partition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, RangePartition)
        for lo in range(partition.start, partition.end, _CHUNK):
            yield self._batch(lo, min(partition.end, lo + _CHUNK))

    def read_real_time(self, start: Offset, stop: Any) -> Iterator[RealTimeChunk]:
        assert isinstance(stop, threading.Event)
        pos = int(start["rows"])
        while not stop.is_set():
            avail = self._available()
            if avail > pos:
                batch = self._batch(pos, avail)
                times = [self.start_ms + i * 1000 / self.rps for i in range(pos, avail)]
                pos = avail
                yield RealTimeChunk(batch, {"rows": pos}, times)
            else:
                next_due = (self.start_ms + (pos + 1) * 1000 / self.rps) / 1000 - time.time()
                stop.wait(min(0.05, max(0.0005, next_due)))

    def metrics(self, latest: Offset) -> Mapping[str, Any]:
        return {"numRowsOutstanding": max(0, self._available() - int(latest["rows"]))}
