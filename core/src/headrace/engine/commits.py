"""The commit order of a query run: when each piece of a batch becomes durable, in one place.

:class:`CommitOrder` owns the exactly-once rules (below); the loop, the micro-batch and the
real-time batch call it at the named steps and never touch the checkpoint's log themselves.
:class:`SourceCommits` is its queue of deferred ``Source.commit`` calls.

For micro-batch ``n``:

1. ``offsets/<n>`` (the write-ahead entry: the batch's range and watermarks) is handed to the
   checkpoint's writer before any of the batch is read (:meth:`CommitOrder.write_ahead`), and
   is durable before anything of the batch is committed (the sink's commit, the dead letters).
2. The batch's dead letters are settled after (1) and before the sink's commit.
3. The previous batch's ``commits/<n-1>`` is visible before ``sink.commit(n)``, so a crash
   never replays a batch before the last one the sink committed. (1) to (3):
   :meth:`CommitOrder.before_sink_commit`.
4. ``sink.commit(n, messages)``; on failure ``sink.abort`` and nothing after it.
5. The stateful operators' state versions ``n`` are durable before ``commits/<n>``
   (:meth:`CommitOrder.commit`): waited for, then the marker is linked to ``offsets/<n>``
   (visible at once); with a watermark, whose maxima the marker records, it is written whole in
   the background after the state writes, and (3) waits until it is visible (its content
   fsynced and renamed into place, as durable as a linked marker is when it appears); its
   folder's fsync, which makes it durable, only (6) waits for.
6. ``Source.commit(end)`` of batch ``n`` (which may acknowledge upstream or delete what a
   replay of ``n`` would need) only once ``commits/<n>`` is durable: on the query's thread, in
   batch order, each batch once (:class:`SourceCommits`; Spark defers ``Source.commit`` to the
   next batch likewise). :meth:`CommitOrder.settle` waits for all of them: when a trigger finds
   no new data, before a real-time batch and when the run ends.

A real-time batch ``n`` (:meth:`CommitOrder.begin_real_time`, :meth:`CommitOrder.commit_real_time`):
everything before it settled; ``offsets/<n>`` written durably with its start only, then again
with its end before the sink commits; after the sink's commit its state versions durable,
``commits/<n>`` written durably, then ``Source.commit(end)`` at once.

Planned-ahead batches that never ran have their entries deleted, last first
(:meth:`CommitOrder.forget_planned`). The crash points (``headrace.helpers.crash``) of these
steps are marked here: ``after_offsets``, ``before_sink_commit``, ``after_sink_commit``,
``after_commit``; in crash tests every entry and marker is durable when its point is reached.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from headrace.protocols import Offset, Source

if TYPE_CHECKING:
    from headrace.checkpoint import Checkpoint, OffsetEntry
    from headrace.helpers.crash import CrashHook
    from headrace.transforms.operator import StateWrite

__all__ = ["CommitOrder", "SourceCommits"]


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


class CommitOrder:
    """The durability rules of one query run (the module's docstring states them). Built by
    ``setup_query`` with the run's checkpoint, its sources (a tuple: fixed for the run) and its
    crash hook; every method runs on the query's thread."""

    def __init__(self, checkpoint: Checkpoint, sources: tuple[Source, ...], crash: CrashHook, *,
                 max_pending: int) -> None:  # fmt: skip
        self._checkpoint = checkpoint
        self._sources = sources
        self._crash = crash
        self._source_commits = SourceCommits(sources, max_pending=max_pending, flush=checkpoint.flush_commits)
        self._marker_in_flight: Future[None] | None = None  # a marker written whole, not yet visible

    # ------------------------------------------------------------------ the write-ahead entries
    def write_ahead(self, entries: Sequence[OffsetEntry]) -> list[Future[None]]:
        """Hand ``offsets/<n>`` of one batch, or of several consecutive batches planned ahead,
        to the checkpoint's writer in one hand-off (rule 1); each future is done once its
        entry is durable. Called once per planned batch (or group of batches)."""
        cp = self._checkpoint
        futures = [cp.write_offsets_async(entries[0])] if len(entries) == 1 else cp.write_offsets_many(list(entries))
        for entry, wal in zip(entries, futures, strict=True):
            if self._crash.point:  # crash tests need the entry on disk at the named point
                wal.result()
            self._crash("after_offsets", entry.batch_id)
        return futures

    @staticmethod
    def wait_write_ahead(wal: Future[None] | None) -> float:
        """Wait until the batch's ``offsets/<n>`` is durable (rule 1; ``None``: a replayed
        entry, already on disk); returns the seconds waited. Called once per micro-batch,
        after the sink's write, before its dead letters and its commit."""
        if wal is None:
            return 0.0
        t = time.monotonic()
        wal.result()
        return time.monotonic() - t

    def forget_planned(self, batch_id: int) -> None:
        """Delete the entry of a batch planned ahead that never ran (called last first)."""
        self._checkpoint.forget_planned(batch_id)

    # ------------------------------------------------------------------ a micro-batch's commit
    def before_sink_commit(self, batch_id: int, *, wal: Future[None] | None,
                           settle_dead_letters: Callable[[], None]) -> tuple[float, float]:  # fmt: skip
        """Right before ``sink.commit(batch_id)``: the batch's ``offsets/<n>`` durable (rule 1;
        ``wal`` None: already on disk), then its dead letters settled (rule 2), the previous
        batch's marker visible (rule 3) and the sources of earlier batches whose marker is
        durable committed (rule 6, without waiting). Returns the seconds spent waiting for the
        entry, and for the markers and the sources. Called once per batch (real-time too)."""
        t_wal = self.wait_write_ahead(wal)
        settle_dead_letters()
        t = time.monotonic()
        self._wait_marker()
        self._source_commits.settle()
        t_markers = time.monotonic() - t
        self._crash("before_sink_commit", batch_id)
        return t_wal, t_markers

    def commit(self, batch_id: int, state: Sequence[StateWrite], marker_body: dict[str, Any],
               ends: Sequence[Offset]) -> None:  # fmt: skip
        """After ``sink.commit(batch_id)``: the batch's ``state`` writes durable, then
        ``commits/<n>`` (rule 5: linked to ``offsets/<n>``, or, with a ``marker_body``, written
        whole in the background after the state writes), then ``Source.commit(ends)`` deferred
        until the marker is durable (rule 6). Called once per micro-batch."""
        crash = self._crash
        crash("after_sink_commit", batch_id)
        cp = self._checkpoint
        if not marker_body:
            for f in state:  # the state of batch n is durable before its marker
                f.result()
            durable = cp.publish_commit(batch_id)  # a hard link: visible now
        else:  # the body records this batch's event-time maxima: written whole, in the background,
            # after the batch's state writes (their fsyncs overlap the sink's write and this marker's)
            self._marker_in_flight, durable = cp.write_commit_async(batch_id, marker_body, after=state)
        if crash.point:  # crash tests need the marker durable at the named point
            cp.flush_commits()
            durable.result()
        crash("after_commit", batch_id)
        self._source_commits.add(durable, list(ends))

    def settle(self) -> None:
        """Wait until every finished batch's ``commits/<n>`` is durable, then ``Source.commit``
        for each, in order. Called when a trigger finds no new data, before a real-time batch
        and when the run ends; at every batch, :meth:`before_sink_commit` commits what is
        durable without waiting."""
        self._wait_marker()
        self._source_commits.settle(wait=True)

    def _wait_marker(self) -> None:
        """Wait until the last batch's marker is visible, when it was written whole in the
        background (with a watermark): renamed into place with its content fsynced, as a
        linked marker is at once; its folder's fsync, which makes it durable, is waited for
        only before its sources are told (rule 6)."""
        pending, self._marker_in_flight = self._marker_in_flight, None
        if pending is not None:
            pending.result()

    # ------------------------------------------------------------------ a real-time batch's commit
    def begin_real_time(self, entry: OffsetEntry) -> None:
        """Before real-time batch ``entry.batch_id`` reads anything: the earlier batches settled,
        then its ``offsets`` entry (its start only) written durably. Called once per real-time batch."""
        self.settle()
        self._checkpoint.write_offsets(entry)
        self._crash("after_offsets", entry.batch_id)

    def end_real_time(self, entry: OffsetEntry) -> None:
        """When real-time batch ``entry.batch_id`` ends: its ``offsets`` entry rewritten durably
        with its end, before its dead letters and its sink's commit."""
        self._checkpoint.write_offsets(entry)

    def commit_real_time(self, batch_id: int, state: Sequence[StateWrite], marker_body: dict[str, Any],
                         ends: Sequence[Offset]) -> None:  # fmt: skip
        """After real-time batch ``batch_id``'s sink commit: its state writes durable, then
        ``commits/<n>`` written durably, then ``Source.commit(ends)`` at once."""
        self._crash("after_sink_commit", batch_id)
        for f in state:
            f.result()
        self._checkpoint.write_commit(batch_id, marker_body)
        for src, end in zip(self._sources, ends, strict=True):
            src.commit(end)
