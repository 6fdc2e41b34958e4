"""Real-time batches: one long-running batch per interval, each record processed as it arrives.

``offsets/<n>`` is written with the start only (and the watermark in force, which stays fixed
for the whole batch); records go from ``source.read_real_time`` through the plan into
``sink.write`` as they arrive: stateless steps per chunk, stateful operators (aggregations in
update mode, ``drop_duplicates``) emitting per chunk too; their ``finish`` runs when the
interval ends, which makes the batch's state version durable before the sink commits. When the interval ends,
``offsets/<n>`` is rewritten with the end, then the sink commits and ``commits/<n>`` is
written. A crash before the end is written replays the batch in real-time mode from its start;
after, over the recorded range.

Latencies are kept in fixed-size reservoirs (uniform samples of every row of the interval),
so memory and the time to report stay constant whatever the rate and the interval.
"""

from __future__ import annotations

import contextlib
import math
import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from headrace.checkpoint import OffsetEntry
from headrace.engine.deadletters import settle_bad_records
from headrace.engine.microbatch import batch_info
from headrace.engine.reader import BatchCounts, apply_transform
from headrace.engine.report import report_progress
from headrace.protocols import Offset

if TYPE_CHECKING:
    from headrace.engine.run import QueryRun

__all__ = ["LatencyReservoir", "RealTimeStats", "run_real_time_batch"]


class LatencyReservoir:
    """A uniform sample of at most ``capacity`` values out of any number (Li's Algorithm L).

    ``extend(n, value_at)`` offers ``n`` values, computing only the ones it keeps: the work per
    call is O(1) plus O(kept), and the total kept is O(capacity * log(seen / capacity)).
    """

    def __init__(self, capacity: int = 4096, rng: random.Random | None = None) -> None:
        self.capacity = capacity
        self.items: list[float] = []
        self.seen = 0
        self._rng = rng or random.Random()
        self._w = 1.0
        self._next = capacity  # 0-based index (in the whole stream) of the next value to take

    def _advance(self) -> None:
        self._w *= math.exp(math.log(self._rng.random() or 1e-300) / self.capacity)
        skip = math.floor(math.log(self._rng.random() or 1e-300) / math.log1p(-self._w)) if self._w < 1 else 0
        self._next += skip + 1

    def extend(self, n: int, value_at: Callable[[int], float]) -> None:
        """Offer values ``value_at(0) .. value_at(n - 1)``; called once per chunk."""
        start = self.seen
        i = 0
        while len(self.items) < self.capacity and i < n:
            self.items.append(value_at(i))
            i += 1
            if len(self.items) == self.capacity:
                self._advance()
        while self._next < start + n and len(self.items) == self.capacity:
            self.items[self._rng.randrange(self.capacity)] = value_at(self._next - start)
            self._advance()
        self.seen = start + n


class RealTimeStats:
    """Latency samples of one real-time batch (processing, source queuing, end to end)."""

    def __init__(self, capacity: int = 4096) -> None:
        self.processing = LatencyReservoir(capacity)
        self.queuing = LatencyReservoir(capacity)
        self.e2e = LatencyReservoir(capacity)

    def add(self, t_read: float, t_done: float, rows: int, source_times: Any) -> None:
        """One chunk: read at ``t_read``, handed on at ``t_done`` (ms), per-row source times."""
        self.processing.extend(rows, lambda _i: t_done - t_read)
        n = len(source_times)
        if n:
            self.queuing.extend(n, lambda i: max(0.0, t_read - float(source_times[i])))
            self.e2e.extend(n, lambda i: max(0.0, t_done - float(source_times[i])))

    def latencies(self) -> dict[str, Sequence[float]]:
        return {"processingLatencyMs": self.processing.items, "sourceQueuingLatencyMs": self.queuing.items,
                "e2eLatencyMs": self.e2e.items}  # fmt: skip


def run_real_time_batch(
    run: QueryRun, batch_id: int, starts: list[Offset], metadata: dict[str, Any] | None = None
) -> list[Offset]:
    """Run one real-time batch of ``run`` from ``starts`` until its interval ends or it is
    stopped; returns the end offsets. Called once per interval by the engine loop (and with
    the recorded ``metadata`` when an interrupted batch is replayed). What becomes durable
    when is :class:`headrace.engine.commits.CommitOrder`'s."""
    sink, runner, tracker, order = run.sink, run.runner, run.tracker, run.commits
    src = run.sources[0]
    t0 = time.monotonic()
    wall = time.time()
    run.status.current_batch = batch_id
    run.status.set("Processing new data (real-time)", data_available=True, trigger_active=True)
    if metadata is None:
        metadata = tracker.metadata(int(wall * 1000))
    info = batch_info(run, batch_id, metadata, real_time=True)
    order.begin_real_time(OffsetEntry(batch_id, starts, [None], int(wall * 1000), real_time=True, metadata=metadata))
    stop = threading.Event()
    deadline = t0 + run.spec.trigger.interval

    def timer() -> None:
        while not stop.is_set():
            if run.stop.wait(min(0.05, max(0.0, deadline - time.monotonic()))) or time.monotonic() >= deadline:
                stop.set()

    threading.Thread(target=timer, daemon=True, name="headrace-rt-timer").start()
    stats = RealTimeStats()
    last: list[Offset] = [starts[0]]
    counts = [0]
    out_rows = [0]
    crash = run.crash

    def chunks() -> Iterator[pa.RecordBatch]:
        for chunk in src.read_real_time(starts[0], stop):
            t_read = time.time() * 1000
            counts[0] += chunk.data.num_rows
            yield from apply_transform(runner.prefix_transform, chunk.data)
            t_done = time.time() * 1000  # the plan's output of this chunk has been written
            stats.add(t_read, t_done, chunk.data.num_rows, chunk.source_times_ms)
            last[0] = chunk.offset
            if counts[0] >= 2:
                crash("mid_write", batch_id)

    messages: list[Any] = []
    runner.begin(info)
    flow = runner.run(chunks(), info)
    try:
        messages.append(sink.write(batch_id, flow))
        runner.require_finished(run.spec.sink_connector)
        stop.set()
        end = last[0]
        out_rows[0] = runner.rows_out
        order.end_real_time(OffsetEntry(batch_id, starts, [end], int(wall * 1000), real_time=True, metadata=metadata))
        order.before_sink_commit(batch_id, wal=None, settle_dead_letters=lambda: settle_bad_records(
            run, batch_id, BatchCounts(counts, out_rows[0])))  # fmt: skip
        sink.commit(batch_id, messages)
    except BaseException:
        stop.set()
        with contextlib.suppress(Exception):
            sink.abort(batch_id, messages or [None])
        raise
    finally:
        flow.close()
    event_time = tracker.after_batch(info.watermark_ms)
    run.loop.last_watermark = info.watermark_ms
    order.commit_real_time(batch_id, runner.state_writes(), tracker.commit_info(), [end])
    total = time.monotonic() - t0
    report_progress(run, batch_id, wall, starts, [end], counts, out_rows[0], {"triggerExecution": total, "addBatch": total},
              latencies=stats.latencies(), event_time=event_time, state_operators=runner.state_metrics())  # fmt: skip
    return [end]
