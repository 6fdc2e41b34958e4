"""Deferred ``Source.commit``: each batch's sources are told once its ``commits/<n>`` is durable.

After batch ``n``'s sink commit its marker is renamed into place at once (a crash from then on
does not replay ``n``), but the fsync that makes it survive a power loss runs in the
background. ``Source.commit(end)`` (which may acknowledge messages upstream, or delete staged
data the replay of ``n`` would need) is therefore called only when that fsync is done: at a
later point of the loop, on the loop's thread, in batch order, each batch once. Spark defers
``Source.commit`` to the next batch likewise.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future

from headrace.protocols import Offset, Source

__all__ = ["SourceCommits"]


class SourceCommits:
    """The batches whose marker is on its way to the disk, and their sources' end offsets.

    ``add`` once per batch, after its marker is published; ``settle`` at every batch (commits
    what is durable, waits only when more than ``max_pending`` batches are waiting) and with
    ``wait=True`` when the loop idles, before a real-time batch and when the query ends.

    A marker becomes durable when the checkpoint's writer next fsyncs the commits folder (with
    the next offsets entries); when the oldest marker has waited ``max_delay`` seconds,
    ``settle`` asks for that fsync at once (``flush``), so a source is told at most about that
    long after its batch (plus an fsync), however the batches are planned."""

    def __init__(self, sources: Sequence[Source], max_pending: int = 6, flush: Callable[[], None] | None = None,
                 max_delay: float = 0.1) -> None:  # fmt: skip
        self._sources = sources
        self._flush = flush  # asks the writer to make the markers durable now (before waiting)
        self._max = max(1, max_pending)
        self._max_delay = max_delay
        self._flushed = 0.0  # when flush was last called (time.monotonic())
        self._pending: deque[tuple[Future[None], list[Offset], float]] = deque()

    def __len__(self) -> int:
        return len(self._pending)

    def add(self, durable: Future[None], ends: list[Offset]) -> None:
        self._pending.append((durable, ends, time.monotonic()))

    def settle(self, *, wait: bool = False) -> None:
        """``Source.commit(end)`` for every batch, oldest first, whose marker is durable; with
        ``wait`` (or while too many are waiting) wait for the markers first. Raises the error
        of a marker that could not be written (its batch is then replayed on restart)."""
        while self._pending:
            done, ends, since = self._pending[0]
            if not (wait or done.done() or len(self._pending) > self._max):
                now = time.monotonic()
                if self._flush is not None and now - max(since, self._flushed) > self._max_delay:
                    self._flushed = now
                    self._flush()
                return
            if not done.done() and self._flush is not None:
                self._flushed = time.monotonic()
                self._flush()
            self._pending.popleft()
            done.result()
            for src, end in zip(self._sources, ends, strict=True):
                src.commit(end)
