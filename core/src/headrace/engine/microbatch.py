"""One micro-batch, planned by :mod:`headrace.engine.planner`, run with Spark's semantics:

1. (planned) ``offsets/<n>`` handed to the checkpoint's writer; with ``available_now`` the next
   batches are planned ahead now.
2. Partitions read (``headrace.engine.reader``; in reader threads or on the query's thread,
   whichever ``headrace.engine.read_mode`` measured to be cheaper), the stream's plan applied
   (``headrace.engine.plan``: stateless steps in the reader threads, stateful ones on the
   consumer), ``sink.write``.
3. ``offsets/<n>`` durable (waited for), dead letters settled, the sources of earlier batches
   whose marker is durable committed (``headrace.engine.commits``), then
   ``sink.commit(n, messages)``.
4. ``commits/<n>`` linked to ``offsets/<n>`` (visible at once, no data to fsync; with a
   watermark, whose maxima are known only now, written whole in the background and waited for
   before the next sink commit), and ``source.commit(end)`` deferred until it is durable. The
   stateful operators' changelogs of batch ``n`` (written and fsynced on the state stores'
   threads since ``finish``) are durable before the marker: waited for here, or, for a marker
   written in the background, by its job before it writes the marker.
5. The progress report (``headrace.engine.report``).
"""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING, Any

from headrace.engine.planner import PlannedBatch
from headrace.engine.reader import BatchCounts, read_partitions
from headrace.engine.report import report_progress
from headrace.engine.watermark import late_events_ms
from headrace.errors import CheckpointError
from headrace.protocols import Partition
from headrace.transforms.operator import BatchInfo

if TYPE_CHECKING:
    from headrace.engine.query import StreamingQuery

__all__ = ["batch_info", "run_batch"]


def batch_info(q: StreamingQuery, batch_id: int, metadata: dict[str, Any], *, real_time: bool = False) -> BatchInfo:
    """Batch ``batch_id`` as its operators see it: both watermarks its ``offsets`` entry
    records (none without a watermark). Called once per batch, on the query's thread."""
    if not q._tracker.enabled:
        return BatchInfo(batch_id, None, real_time=real_time)
    cp = q._checkpoint

    def previous(n: int) -> dict[str, Any] | None:
        try:
            return cp.read_offsets(n).metadata if cp is not None else None
        except CheckpointError:  # gone (retention) or unreadable: the entry's own watermark
            return None

    late = late_events_ms(metadata, batch_id, previous)
    return BatchInfo(batch_id, int(metadata.get("batchWatermarkMs") or 0), real_time=real_time, late_watermark_ms=late)


def run_batch(q: StreamingQuery, p: PlannedBatch) -> None:
    """Run planned batch ``p`` of query ``q`` to its commit and report it. Called once per
    micro-batch (and per replayed batch) on the query's thread; raises what failed it, after
    ``sink.abort``."""
    cp, sink, runner = q._checkpoint, q._sink, q._runner
    assert cp is not None and sink is not None and runner is not None
    batch_id = p.batch_id
    info = batch_info(q, batch_id, p.metadata)
    info.timestamp_ms = int(p.wall * 1000)  # offsets/<n>'s timestamp (a replay plans with the recorded one)
    q._current_batch = batch_id
    q._status = {"message": "Processing new data", "isDataAvailable": True, "isTriggerActive": True}
    crash = q._crash
    q._planner.fill(p, q._ran)  # the next batches' entries go to the disk while this one runs

    parts: list[tuple[int, Partition]] = []
    for i, (src, st, en) in enumerate(zip(q._sources, p.starts, p.ends, strict=True)):
        if st != en:
            parts.extend((i, part) for part in src.partitions(st, en))
    counts = BatchCounts([0] * len(q._sources))
    t = time.monotonic()
    t_wal = p.t_wal
    t_commit = 0.0
    messages: list[Any] = []
    runner.begin(info)
    mode = q._read_mode
    parallel = len(parts) > 1 and mode.parallel()  # reader threads, or the query's thread alone
    read = read_partitions(q._sources, parts, runner.reader_transform, counts, batch_id=batch_id,
                           pool=q._pool if parallel else None, crash=crash)  # fmt: skip
    data = runner.run(read, info, gather=True)
    try:
        messages.append(sink.write(batch_id, data))
        runner.require_finished(q._sink_connector)
        counts.output_rows = runner.rows_out  # what the sink was handed (after any stateful operator)
        if len(parts) > 1:
            mode.record(parallel, sum(counts.input_rows), time.monotonic() - t)
        if p.wal is not None:
            tw = time.monotonic()
            p.wal.result()  # the write-ahead entry is durable before anything is committed
            t_wal += time.monotonic() - tw
        q._settle_bad_records(batch_id, counts)  # dead letters: after the WAL, before the commit
        tc = time.monotonic()
        q._wait_marker()  # the previous batch's marker is visible (a replay never goes further back)
        q._source_commits.settle()  # sources of batches whose marker is durable: committed
        t_commit = time.monotonic() - tc
        crash("before_sink_commit", batch_id)
        sink.commit(batch_id, messages)
    except BaseException:
        if p.wal is not None:
            with contextlib.suppress(Exception):
                p.wal.result()
        with contextlib.suppress(Exception):
            sink.abort(batch_id, messages or [None])
        raise
    finally:
        data.close()
        read.close()
    t_add = time.monotonic() - t - t_commit
    crash("after_sink_commit", batch_id)
    event_time = q._tracker.after_batch(info.watermark_ms)
    q._last_watermark = info.watermark_ms
    t = time.monotonic()
    state = runner.state_writes()  # the stateful operators' changelogs, still being fsynced
    if not q._tracker.enabled:
        for f in state:  # the state of batch n is durable before its marker
            f.result()
        durable = cp.publish_commit(batch_id)  # a hard link: visible now
    else:  # the body records this batch's event-time maxima: written whole, in the background,
        # after the batch's state writes (their fsyncs overlap the sink's write and this marker's)
        durable = q._marker_in_flight = cp.write_commit_async(batch_id, q._tracker.commit_info(), after=state)
    if crash.point:  # crash tests need the marker durable at the named point
        cp.flush_commits()
        durable.result()
    crash("after_commit", batch_id)
    q._source_commits.add(durable, list(p.ends))
    t_commit += time.monotonic() - t
    q._ran += 1
    total = time.monotonic() - p.t0
    report_progress(q, batch_id, p.wall, p.starts, p.ends, counts.input_rows, runner.rows_out,
              {"latestOffset": p.t_latest, "walCommit": t_wal, "addBatch": t_add,
               "commitOffsets": t_commit, "triggerExecution": total},
              event_time=event_time, state_operators=runner.state_metrics())  # fmt: skip
