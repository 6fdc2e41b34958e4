"""Planning micro-batches: the end offsets from the sources and the write-ahead entry, and
planning ahead of the running batch.

A batch is *planned* when its end offsets are known and its ``offsets/<n>`` entry is on its way
to the disk (:class:`PlannedBatch`). Normally the loop plans batch ``n`` just before running it,
and the entry's fsync overlaps the reading of the batch. With ``trigger(available_now=True)``,
where the ranges of the batches are fixed by what was there at the start and the read limits
(planning earlier gives the same ranges), the planner also plans up to :data:`LOOK_AHEAD`
batches ahead while batch ``n`` runs, so the fsyncs of their entries overlap whole batches and
one another; a batch waits for the disk only when an fsync takes longer than those batches.
It refills a few batches at a time (when half of them have run), with one hand-off to the
checkpoint's writer for all: waking a thread costs more than a batch's own work on a busy
2-core machine.

Recovery is unchanged: the entries are renamed into place in batch order, a sink commits
batch ``n`` only once ``offsets/<n>`` is durable, and after a crash every entry after the last
commit marker is replayed with exactly its recorded range and batch id (planned-ahead batches
included: nothing of them was read or committed). When the query stops, the entries planned
ahead are deleted again, from the last one back, as if they had never been planned.

A query with a watermark cannot plan ahead so far: a batch's watermark depends on the event
times of the batches before it. Its next batch is planned as soon as the running batch's rows
are read (:meth:`Planner.plan_next`), when those event times are known: the next entry's
fsync then overlaps the running batch's state merge, state commit, sink commit and report
instead of the next batch's start. Its range and watermark are the ones planning it after the
batch would give (``available_now`` fixes the ranges; the watermark folds in the event times
of the rows read, which ``finish`` does not change).

Not planned ahead: the first batch of a run (so crash tests timed from its start see the same
sequence as before), and the other triggers (planning early would change the batches of a
live stream: smaller, as less data has arrived).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from headrace.checkpoint import OffsetEntry
from headrace.protocols import Offset, ReadLimit, Source

if TYPE_CHECKING:
    from headrace.engine.commits import CommitOrder
    from headrace.engine.watermark import EventTimeTracker
    from headrace.helpers.crash import CrashHook

__all__ = ["LOOK_AHEAD", "PlannedBatch", "Planner"]

log = logging.getLogger(__name__)

# batches planned ahead of the running one (available_now only), refilled by halves: one hand-off
# to the writer per 24 batches (48 against 24, measured side by side: median batch -6%, CPU -5%,
# mean -13% at 64k rows; sources are still told within SourceCommits' max_delay)
LOOK_AHEAD = 48


@dataclass
class PlannedBatch:
    """A batch whose range is fixed and whose offsets entry is written (or being written)."""

    batch_id: int
    starts: list[Offset]
    ends: list[Offset]
    metadata: dict[str, Any]
    wall: float  # when it started (time.time()), for the report
    t0: float  # when it started (time.monotonic()), for the durations
    t_latest: float = 0.0  # seconds spent in latest_offset
    t_wal: float = 0.0  # seconds spent handing the entry over (and waiting for it in crash tests)
    wal: Future[None] | None = None  # durable offsets entry; None when replaying a recorded one


class Planner:
    """Plans the batches of one query run. Built by ``setup_query`` with the run's parts;
    every method runs on the query's thread."""

    def __init__(self, *, name: str, sources: tuple[Source, ...], tracker: EventTimeTracker, commits: CommitOrder,
                 crash: CrashHook, stop: threading.Event) -> None:  # fmt: skip
        self._name = name
        self._sources = sources
        self._tracker = tracker
        self._commits = commits
        self._crash = crash
        self._stop = stop
        self._ahead: deque[PlannedBatch] = deque()
        self._limits: list[ReadLimit] = []
        self._enabled = False
        self._next_early = False  # with a watermark: the next batch planned once this one's rows are read
        self._dry = False  # the sources had nothing more when planning ahead: stop until the loop asks

    def enable_look_ahead(self, limits: list[ReadLimit]) -> None:
        """Plan ahead from now on (with these read limits). Called once, by the loop, when the
        trigger is ``available_now`` and the plan has no watermark."""
        self._limits = limits
        self._enabled = True

    def enable_next_early(self, limits: list[ReadLimit]) -> None:
        """Plan the next batch once the running one's rows are read (:meth:`plan_next`), from
        now on (with these read limits). Called once, by the loop, when the trigger is
        ``available_now``, the plan has a watermark and every source can plan ahead."""
        self._limits = limits
        self._next_early = True

    def plan_next(self, running: PlannedBatch, ran: int, watermark_ms: int | None) -> None:
        """Plan the batch after ``running`` (whose watermark is ``watermark_ms``) now that its
        rows are read: its event times are folded into the watermark
        (``EventTimeTracker.after_batch``, which the end of the batch repeats to the same
        effect) and the next entry goes to the disk while the
        running batch merges, commits and reports. Only when enabled, after the run's first
        batch (``ran``: batches this run has finished), when nothing is planned yet and the
        sources have more. A source error here is not raised: the loop plans that batch again
        after the running one, and raises then. Called once per batch, on the query's thread."""
        if not self._next_early or ran < 1 or self._ahead or self._stop.is_set():
            return
        t0 = time.monotonic()
        try:
            ends = [s.latest_offset(st, lim) for s, st, lim in zip(self._sources, running.ends, self._limits, strict=True)]
        except Exception as e:
            log.debug("query '%s': planning the next batch early failed: %s", self._name, e)
            return
        if all(e == st for e, st in zip(ends, running.ends, strict=True)):
            return
        self._tracker.after_batch(watermark_ms)
        self._ahead.append(self.plan(running.batch_id + 1, list(running.ends), ends, t0=t0,
                                     t_latest=time.monotonic() - t0))  # fmt: skip

    def plan(self, batch_id: int, starts: list[Offset], ends: list[Offset], *, t0: float | None = None,
             t_latest: float = 0.0, metadata: dict[str, Any] | None = None, replay: bool = False,
             defer: bool = False, wall: float | None = None) -> PlannedBatch:  # fmt: skip
        """Fix batch ``batch_id`` to ``[starts, ends)``: its offsets entry is handed to the
        checkpoint's writer (unless ``replay``: it is on disk; with ``defer`` the caller hands
        it over, with others: :meth:`fill`). ``wall``: the batch's processing time (a replay
        passes the one its entry records), else now."""
        wall = time.time() if wall is None else wall
        t0 = time.monotonic() if t0 is None else t0
        if metadata is None:
            metadata = self._tracker.metadata(int(wall * 1000))
        self._crash("before_offsets", batch_id)
        t = time.monotonic()
        p = PlannedBatch(batch_id, starts, list(ends), metadata, wall, t0, t_latest)
        if replay:
            self._crash("after_offsets", batch_id)
        elif not defer:
            (p.wal,) = self._commits.write_ahead([self._entry(p)])
        p.t_wal = time.monotonic() - t
        return p

    @staticmethod
    def _entry(p: PlannedBatch) -> OffsetEntry:
        ends: list[Offset | None] = list(p.ends)
        return OffsetEntry(p.batch_id, p.starts, ends, int(p.wall * 1000), metadata=p.metadata)

    def take(self) -> PlannedBatch | None:
        """The next batch planned ahead (its clock restarted: it starts now; one planned by
        :meth:`plan_next` keeps the processing time its entry records, as a replay of it
        would), or None."""
        if not self._ahead:
            self._dry = False
            return None
        p = self._ahead.popleft()
        if not self._next_early:
            p.wall = time.time()
        p.t0 = time.monotonic()
        return p

    def fill(self, running: PlannedBatch, ran: int) -> None:
        """Plan ahead of ``running`` up to :data:`LOOK_AHEAD` batches, when enabled and after
        the run's first batch (``ran``: batches this run has finished). A source error here is
        not raised: the loop plans that batch again after the running one, and raises then."""
        if not self._enabled or self._dry or ran < 1 or self._stop.is_set() or len(self._ahead) > LOOK_AHEAD // 2:
            return  # refilled a few batches at a time: one hand-off to the writer for all of them
        last = self._ahead[-1] if self._ahead else running
        new: list[PlannedBatch] = []
        while len(self._ahead) + len(new) < LOOK_AHEAD:
            t0 = time.monotonic()
            try:
                ends = [s.latest_offset(st, lim) for s, st, lim in zip(self._sources, last.ends, self._limits, strict=True)]
            except Exception as e:
                log.debug("query '%s': planning ahead stopped: %s", self._name, e)
                self._dry = True
                break
            if all(e == st for e, st in zip(ends, last.ends, strict=True)):
                self._dry = True
                break
            last = self.plan(last.batch_id + 1, list(last.ends), ends, t0=t0, t_latest=time.monotonic() - t0, defer=True)
            new.append(last)
        if not new:
            return
        for p, wal in zip(new, self._commits.write_ahead([self._entry(p) for p in new]), strict=True):
            p.wal = wal
        self._ahead.extend(new)

    def discard(self) -> None:
        """Forget the batches planned ahead that did not run (the query stops or failed): their
        entries are deleted from the last one back, so the log never has a gap. Best effort: an
        entry left behind is replayed with its recorded range on restart, which is correct too."""
        while self._ahead:
            p = self._ahead.pop()
            if p.wal is not None:
                with contextlib.suppress(Exception):
                    p.wal.result()  # renamed (or failed) before it is deleted
            with contextlib.suppress(OSError):
                self._commits.forget_planned(p.batch_id)
