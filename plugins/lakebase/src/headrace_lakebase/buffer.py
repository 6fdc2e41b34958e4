"""The bounded row buffer between a sink's ``write`` (producer) and its flusher thread.

Rows are cut into chunks of ``batch_size`` rows as they arrive; a partial chunk is cut when its
oldest row has waited ``interval`` seconds (or when the input ends). At most ``max_ready``
chunks wait for the flusher: beyond that ``add`` blocks, so a slow database slows the source
instead of growing memory (back-pressure). Every chunk carries its position in the writer's
input (``row_start``, ``row_end``) and a sequence number, which the sink records for
exactly-once replays.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass

import pyarrow as pa

__all__ = ["Chunk", "ChunkBuffer"]


@dataclass(frozen=True)
class Chunk:
    """Rows ``[row_start, row_end)`` of one writer's input, flushed in one transaction."""

    number: int
    row_start: int
    row_end: int
    batches: tuple[pa.RecordBatch, ...]

    @property
    def num_rows(self) -> int:
        return self.row_end - self.row_start


class ChunkBuffer:
    """Thread-safe: one producer calls :meth:`add` and :meth:`close`; one consumer calls
    :meth:`next_chunk`. ``skip`` input rows are dropped first (already written before a crash);
    positions start at ``skip``, chunk numbers at ``first_chunk``."""

    def __init__(
        self, *, batch_size: int, interval: float, max_ready: int = 2, skip: int = 0, first_chunk: int = 0
    ) -> None:
        self.batch_size = batch_size
        self.interval = interval
        self.max_ready = max_ready
        self._skip = skip
        self._pos = skip
        self._chunk = first_chunk
        self._pending: list[pa.RecordBatch] = []
        self._pending_rows = 0
        self._pending_since = 0.0
        self._ready: deque[Chunk] = deque()
        self._closed = False
        self._failed: BaseException | None = None
        self._cond = threading.Condition()

    # ------------------------------------------------------------ producer side
    def add(self, batch: pa.RecordBatch) -> None:
        """Buffer ``batch``; blocks while ``max_ready`` full chunks wait for the flusher.
        Raises the flusher's error (set with :meth:`fail`) if it failed."""
        if self._skip:
            drop = min(self._skip, batch.num_rows)
            self._skip -= drop
            batch = batch.slice(drop)
        if batch.num_rows == 0:
            return
        with self._cond:
            offset = 0
            while offset < batch.num_rows:
                while len(self._ready) >= self.max_ready and self._failed is None:
                    self._cond.wait()
                if self._failed is not None:
                    raise self._failed
                if not self._pending:
                    self._pending_since = time.monotonic()
                take = min(batch.num_rows - offset, self.batch_size - self._pending_rows)
                self._pending.append(batch.slice(offset, take))
                self._pending_rows += take
                offset += take
                if self._pending_rows >= self.batch_size:
                    self._ready.append(self._cut())
                self._cond.notify_all()

    def close(self) -> None:
        """No more input: the rest is flushed as a last (partial) chunk."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def fail(self, error: BaseException) -> None:
        """The consumer failed: wake the producer, whose next :meth:`add` raises ``error``."""
        with self._cond:
            self._failed = error
            self._cond.notify_all()

    # ------------------------------------------------------------ consumer side
    def next_chunk(self) -> Chunk | None:
        """The next chunk to flush, in order; waits for a full chunk, an interval expiry or the
        end of the input. None when the input is closed and everything was handed out."""
        with self._cond:
            while True:
                if self._ready:
                    chunk = self._ready.popleft()
                    self._cond.notify_all()
                    return chunk
                if self._pending:
                    age = time.monotonic() - self._pending_since
                    if self._closed or age >= self.interval:
                        return self._cut()
                    self._cond.wait(self.interval - age)
                    continue
                if self._closed:
                    return None
                self._cond.wait()

    def _cut(self) -> Chunk:
        chunk = Chunk(self._chunk, self._pos, self._pos + self._pending_rows, tuple(self._pending))
        self._chunk += 1
        self._pos = chunk.row_end
        self._pending = []
        self._pending_rows = 0
        return chunk
