"""One micro-batch's fetch: pullers, the ack-deadline lease, and the hand-off of chunks to staging.

``numFetchPartitions`` fetch partitions, each with ``PULLS_IN_FLIGHT`` pull requests at once (one
thread each), pull into one :class:`~headrace_pubsub._schema.Columns` per partition. The source's
thread takes what has gathered (:meth:`FetchRun.take`) whenever ``stage_rows`` messages are
waiting, stages it as one segment and acknowledges it, while the pullers go on: staging overlaps
pulling, and messages are held unacknowledged only from their pull until their chunk is durable.

A redelivered message (its id staged before, or pulled earlier in this fetch) is not taken; its
ack id is kept and acknowledged once everything of this fetch is staged (acknowledging it earlier
could acknowledge a message whose first copy is not durable yet). A message published after the
available-now cut-off ends the fetch and is handed back (nack).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

from google.api_core import exceptions as gexc

from headrace.helpers.admission import AdmissionBudget
from headrace.protocols import ReadLimit
from headrace_pubsub._schema import Columns

if TYPE_CHECKING:
    from headrace_pubsub.source import PubSubSource

__all__ = ["ACK_CHUNK", "MAX_PULL", "PULLS_IN_FLIGHT", "FetchRun", "Lease"]

log = logging.getLogger(__name__)

MAX_PULL = 1000  # messages per Pull request (server maximum)
ACK_CHUNK = 1000  # ack ids per Acknowledge / ModifyAckDeadline request (request size limit 512 KiB)
PULLS_IN_FLIGHT = 3  # pull requests at once per fetch partition: pulls travel while one is handled (bench/pubsub.py: 3 > 2)
_IDLE_POLL = 0.02  # seconds between pulls while the subscription has nothing to deliver


class Lease:
    """Extends the ack deadline of held messages while they are pulled and staged.

    A thread wakes every third of the subscription's ack deadline and pushes the deadline of
    every held ack id out by that deadline again, so nothing expires however slow the fetch.
    Ack ids leave the lease once their chunk is staged (they are acknowledged then)."""

    def __init__(self, extend: Callable[[Sequence[str], int], None], deadline_s: int) -> None:
        self._extend = extend
        self._deadline = deadline_s
        self._ids: dict[str, None] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.extensions = 0
        self.interval = max(0.1, deadline_s / 3)
        self._thread = threading.Thread(target=self._run, name="headrace-pubsub-lease", daemon=True)
        self._thread.start()

    def add(self, ack_ids: Sequence[str]) -> None:
        with self._lock:
            self._ids.update(dict.fromkeys(ack_ids))

    def remove(self, ack_ids: Sequence[str]) -> None:
        with self._lock:
            for a in ack_ids:
                self._ids.pop(a, None)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            with self._lock:
                ids = list(self._ids)
            for i in range(0, len(ids), ACK_CHUNK):
                if self._stop.is_set():
                    return
                try:
                    self._extend(ids[i : i + ACK_CHUNK], self._deadline)
                    self.extensions += 1
                except gexc.GoogleAPICallError as e:  # the ack decides; dedup covers an expiry
                    log.warning("pubsub: extending ack deadlines failed: %s", e)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


class _Partition:
    """One fetch partition: its row cap and what it gathered since the last take."""

    def __init__(self, max_records: int) -> None:
        self.budget = AdmissionBudget(ReadLimit(max_rows=max_records))
        self.columns = Columns()


class FetchRun:
    """The pullers of one ``latest_offset`` call and what they gathered. Started on construction;
    :meth:`take` hands chunks to the caller until the fetch ends; :meth:`stop` ends it early."""

    def __init__(self, source: PubSubSource, limit: ReadLimit, pool: Callable[[int], ThreadPoolExecutor]) -> None:
        src = self.source = source
        max_bytes = min(b for b in (limit.max_bytes, src.max_bytes) if b) if (limit.max_bytes or src.max_bytes) else None
        self.budget = AdmissionBudget(ReadLimit(max_rows=limit.max_rows, max_bytes=max_bytes))
        self.t0 = time.monotonic()
        self.deadline = self.t0 + src.max_fetch_period
        self.cutoff = src._cutoff_ms
        self.lease = Lease(src._modify_deadline, src.ack_deadline)
        self.partitions = [_Partition(src.max_records) for _ in range(src.num_fetch_partitions)]
        self.duplicates: list[str] = []  # ack ids of redelivered messages
        self.late: list[str] = []  # ack ids published after the available-now cut-off
        self.pulls = 0
        self.fetched = 0
        self.bytes = 0
        self.fetch_ms = 0
        self._cond = threading.Condition(src._seen_lock)
        with self._cond:
            src._pending_fetch_ids.clear()  # ids pulled by this fetch and not staged yet
        self._waiting = 0  # rows gathered and not taken yet
        self._error: BaseException | None = None
        self._stopped = False
        # under a byte cap one pull at a time per partition: each pull is sized by the bytes left,
        # and pulls in flight together would each overshoot the (soft) cap by themselves
        n = src.num_fetch_partitions * (PULLS_IN_FLIGHT if max_bytes is None else 1)
        self._active = n
        self._last_delivery = self.t0  # when a pull last brought messages (any puller)
        self._ended_idle = False  # the last puller ended because nothing came for fetchIdleTimeout
        executor = pool(n)
        self._futures: list[Future[None]] = [executor.submit(self._puller, self.partitions[i % len(self.partitions)])
                                             for i in range(n)]  # fmt: skip

    # ------------------------------------------------------------------ the caller's side
    def take(self, rows: int) -> list[Columns] | None:
        """Block until ``rows`` messages are waiting or the fetch has ended; then hand over what
        every partition gathered (one ``Columns`` each, maybe empty), or None when the fetch has
        ended with nothing left. Raises what a puller raised."""
        with self._cond:
            while self._error is None and self._active and self._waiting < rows:
                self._cond.wait()
            if self._error is not None:
                raise self._error
            if not self._waiting:
                return None
            out = []
            for p in self.partitions:
                out.append(p.columns)
                p.columns = Columns()
            self._waiting = 0
            return out

    @property
    def drained(self) -> bool:
        """The fetch ended because the subscription delivered nothing, to any puller, for
        ``fetchIdleTimeout`` (its last puller stopped for that, not for a limit, the deadline, a
        late message or :meth:`stop`). Read after :meth:`stop`."""
        return self._ended_idle

    def stop(self) -> None:
        """End the pullers (after their pull in flight) and the lease; idempotent."""
        with self._cond:
            self._stopped = True
        for f in self._futures:
            f.exception()  # waits; a puller's error was recorded in self._error
        self.lease.stop()

    # ------------------------------------------------------------------ the pullers
    def _puller(self, part: _Partition) -> None:
        idle = False
        try:
            idle = self._pull_until_done(part)
        except BaseException as e:  # handed to the caller's take()
            with self._cond:
                if self._error is None:
                    self._error = e
        finally:
            with self._cond:
                self._active -= 1
                if not self._active:
                    now = time.monotonic()
                    self.fetch_ms = int((now - self.t0) * 1000)
                    self._ended_idle = idle and now - self._last_delivery >= self.source.fetch_idle
                self._cond.notify_all()

    def _pull_until_done(self, part: _Partition) -> bool:
        """Pull into ``part`` until a limit, the deadline, :meth:`stop` or fetchIdleTimeout of
        empty pulls (then True)."""
        src, budget, cutoff = self.source, self.budget, self.cutoff
        idle_until = time.monotonic() + src.fetch_idle
        while not (budget.closed or self._stopped or self._error is not None):
            now = time.monotonic()
            if now >= self.deadline:
                return False
            want = part.budget.reserve(MAX_PULL)
            if want <= 0:
                return False
            got = budget.reserve(budget.estimate(want))
            if got <= 0:
                part.budget.give_back(want)
                return False
            part.budget.give_back(want - got)
            received = src._pull(got)
            budget.give_back(got - len(received))
            part.budget.give_back(got - len(received))
            if not received:
                with self._cond:
                    self.pulls += 1
                now = time.monotonic()
                if now >= idle_until:
                    return True
                time.sleep(min(_IDLE_POLL, idle_until - now, max(0.0, self.deadline - now)))
                continue
            idle_until = time.monotonic() + src.fetch_idle
            taken: list[str] = []
            with self._cond:
                self.pulls += 1
                self._last_delivery = time.monotonic()
                seen, pending, cols = src._seen, src._pending_fetch_ids, part.columns
                before = cols.bytes
                for r in received:
                    m = r.message
                    pt = m.publish_time
                    ms = pt.seconds * 1000 + pt.nanos // 1_000_000
                    if cutoff is not None and ms > cutoff:
                        self.late.append(r.ack_id)
                        budget.close()
                        continue
                    mid = m.message_id
                    if mid in seen or mid in pending:
                        self.duplicates.append(r.ack_id)
                        continue
                    pending.add(mid)
                    cols.add(r, mid, ms)
                    taken.append(r.ack_id)
                size = cols.bytes - before
                self.fetched += len(taken)
                self.bytes += size
                self._waiting += len(taken)
                self.lease.add(taken)  # before the stager can take (and un-lease) them
                self._cond.notify_all()
            part.budget.give_back(len(received) - len(taken))
            if not budget.add_bytes(size, len(taken)):
                budget.close()  # the byte budget is spent: every puller stops
                return False
        return False
