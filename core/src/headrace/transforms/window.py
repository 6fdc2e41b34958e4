"""Event-time windows as grouping keys: ``hr.window`` (tumbling, sliding) and
``hr.session_window``, with Spark's semantics.

``window("ts", "1 minute")`` puts each row in the window ``[start, start + 1 minute)`` with
``start = ts - (ts - startTime) mod duration``; ``window("ts", "1 minute", "30 seconds")``
puts it in every window of that length starting at a multiple of the slide (plus
``startTime``) that contains it (``duration / slide`` windows when the slide divides the
duration). The grouping key in the output is a struct column ``window{start, end}`` of
timestamps, as in Spark. Window assignment is vectorised (numpy over the event-time column).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from headrace.errors import HeadraceError
from headrace.options import Duration

__all__ = ["SessionWindowSpec", "WindowSpec", "event_time_micros", "event_time_range_us", "exact_seconds",
           "session_window", "window", "window_struct_type"]  # fmt: skip

_US = 1_000_000


def _micros(value: Any, what: str, *, allow_zero: bool = False, allow_negative: bool = False) -> int:
    try:
        seconds = Duration(min=None).parse(value)
    except ValueError as e:
        raise HeadraceError(f"{what}: {e}") from None
    us = round(seconds * _US)
    if (us < 0 and not allow_negative) or (us == 0 and not allow_zero):
        raise HeadraceError(f"{what} must be {'0 or more' if allow_zero else 'more than 0'}, not {value!r}")
    return us


@dataclass(frozen=True)
class WindowSpec:
    """A tumbling (``slide_us == duration_us``) or sliding event-time window over ``column``."""

    column: str
    duration_us: int
    slide_us: int
    start_us: int = 0
    name: str = "window"

    @property
    def tumbling(self) -> bool:
        return self.slide_us == self.duration_us

    @property
    def windows_per_row(self) -> int:
        return -(-self.duration_us // self.slide_us)

    def describe(self) -> str:
        slide = "" if self.tumbling else f", slide {self.slide_us / _US:g}s"
        return f"window({self.column}, {self.duration_us / _US:g}s{slide})"

    def state_text(self) -> str:
        """The window as an aggregation's state description records it: every parameter,
        exact (``window(ts, duration 5s, slide 5s, start 0s)``)."""
        return (
            f"window({self.column}, duration {exact_seconds(self.duration_us)}, slide {exact_seconds(self.slide_us)}, "
            f"start {exact_seconds(self.start_us)})"
        )

    def _start_of(self, ts_us: int) -> int:
        """The latest window start at or before ``ts_us`` (Python's floor division)."""
        return (ts_us - self.start_us) // self.slide_us * self.slide_us + self.start_us

    def single_start(self, ts_us: np.ndarray) -> int | None:
        """The start of the one tumbling window every event time of ``ts_us`` (int64
        microseconds, no nulls, not empty) lies in; ``None`` when they span several windows or
        the window slides (a row is then in several)."""
        if not len(ts_us):
            return None
        return self.single_start_between(int(ts_us.min()), int(ts_us.max()))

    def single_start_between(self, lo_us: int, hi_us: int) -> int | None:
        """:meth:`single_start` of event times from ``lo_us`` to ``hi_us`` (the extremes)."""
        if not self.tumbling:
            return None
        lo, hi = self._start_of(lo_us), self._start_of(hi_us)
        return lo if lo == hi else None

    def assign(self, ts_us: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For event times (int64 microseconds, no nulls): the row index and window start of
        every (row, window) pair. Vectorised; a tumbling window gives one pair per row."""
        rows = np.arange(len(ts_us), dtype=np.int64)
        if self.tumbling and len(ts_us):
            # a chunk within one window (the common case: chunks are short next to windows):
            # its start once, not a division per row
            lo, hi = self._start_of(int(ts_us.min())), self._start_of(int(ts_us.max()))
            if lo == hi:
                return rows, np.full(len(ts_us), lo, np.int64)
        # the latest window start at or before ts (floor division: numpy's int64 mod is 6x slower)
        last = (ts_us - self.start_us) // self.slide_us * self.slide_us + self.start_us
        if self.tumbling:
            return rows, last
        idx, starts = [], []
        for k in range(self.windows_per_row):
            s = last - k * self.slide_us
            keep = s + self.duration_us > ts_us
            idx.append(rows[keep])
            starts.append(s[keep])
        return np.concatenate(idx), np.concatenate(starts)


@dataclass(frozen=True)
class SessionWindowSpec:
    """A session window over ``column``: rows of one key closer than ``gap_us`` to each other
    belong to one session ``[first, last + gap)``."""

    column: str
    gap_us: int
    name: str = "session_window"

    def describe(self) -> str:
        return f"session_window({self.column}, {self.gap_us / _US:g}s)"

    def state_text(self) -> str:
        """The session window as its aggregation's state description records it (exact gap)."""
        return f"session_window({self.column}, gap {exact_seconds(self.gap_us)})"


def exact_seconds(us: int) -> str:
    """Microseconds as exact seconds: ``5s``, ``0.25s``, ``-1.000001s`` (no rounding, unlike
    ``describe``'s ``%g``)."""
    whole, frac = divmod(abs(int(us)), _US)
    tail = f".{frac:06d}".rstrip("0") if frac else ""
    return f"{'-' if us < 0 else ''}{whole}{tail}s"


def window(column: str, duration: Any, slide: Any = None, start_time: Any = None) -> WindowSpec:
    """A tumbling window (``slide`` omitted) or a sliding window of ``duration`` every
    ``slide`` over the timestamp column ``column``, as Spark's ``window``. Durations are
    strings such as ``"1 minute"``, ``"30 seconds"``, ``"10s"``. Called at definition time."""
    if not isinstance(column, str) or not column:
        raise HeadraceError(f"window: the event-time column must be a column name, not {column!r}")
    d = _micros(duration, f"window({column!r}) duration")
    s = d if slide is None else _micros(slide, f"window({column!r}) slide")
    if s > d:
        raise HeadraceError(
            f"window({column!r}): the slide ({slide!r}) must not be longer than the duration ({duration!r}), as in Spark"
        )
    st = 0 if start_time is None else _micros(start_time, f"window({column!r}) start_time", allow_zero=True,
                                              allow_negative=True)  # fmt: skip
    if abs(st) >= s:
        raise HeadraceError(f"window({column!r}): start_time ({start_time!r}) must be shorter than the slide, as in Spark")
    return WindowSpec(column, d, s, st)


def session_window(column: str, gap: Any) -> SessionWindowSpec:
    """A session window over the timestamp column ``column`` closed after ``gap`` without
    rows of its key, as Spark's ``session_window``. Called at definition time."""
    if not isinstance(column, str) or not column:
        raise HeadraceError(f"session_window: the event-time column must be a column name, not {column!r}")
    return SessionWindowSpec(column, _micros(gap, f"session_window({column!r}) gap"))


def window_struct_type(ts_type: pa.DataType) -> pa.StructType:
    """The output type of a window column: ``struct<start, end>`` of microsecond timestamps in
    the event-time column's time zone."""
    tz = getattr(ts_type, "tz", None)
    t = pa.timestamp("us", tz=tz)
    return pa.struct([pa.field("start", t), pa.field("end", t)])


def check_event_time(schema: pa.Schema, column: str, what: str) -> pa.DataType:
    """The type of the event-time ``column``; raises naming it when it is missing or not a
    timestamp."""
    if column not in schema.names:
        raise HeadraceError(f"{what}: no column {column!r} in the stream (columns: {', '.join(schema.names)})")
    t = schema.field(column).type
    if not pa.types.is_timestamp(t):
        raise HeadraceError(
            f"{what}: the event-time column {column!r} is {t}, not a timestamp; cast it first, e.g. "
            f"with_column({column!r}, \"CAST({column} AS TIMESTAMP)\")"
        )
    return t


def event_time_range_us(col: pa.ChunkedArray | pa.Array) -> tuple[int, int] | None:
    """The earliest and latest event time of a microsecond timestamp column without nulls,
    read chunk by chunk (no copy of a column in several chunks); ``None`` for another unit,
    nulls, or no rows."""
    if col.null_count or not len(col) or col.type.unit != "us":
        return None
    chunks = col.chunks if isinstance(col, pa.ChunkedArray) else [col]
    lo = hi = None
    for c in chunks:
        if not len(c):
            continue
        us = c.view(pa.int64()).to_numpy(zero_copy_only=False)
        a, b = int(us.min()), int(us.max())
        lo, hi = (a, b) if lo is None or hi is None else (min(lo, a), max(hi, b))
    return None if lo is None or hi is None else (lo, hi)


def event_time_micros(col: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, np.ndarray | None]:
    """A timestamp column as int64 microseconds since the epoch, and the mask of its valid rows
    (``None`` when none is null)."""
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    tz = getattr(col.type, "tz", None)
    if col.type.unit != "us":
        col = col.cast(pa.timestamp("us", tz=tz), safe=False)
    ints = col.view(pa.int64())
    valid = None
    if ints.null_count:
        valid = ints.is_valid().to_numpy(zero_copy_only=False)
        ints = ints.fill_null(0)
    return ints.to_numpy(zero_copy_only=False), valid
