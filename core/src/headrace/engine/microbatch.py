"""One micro-batch, planned by :mod:`headrace.engine.planner`, run with Spark's semantics:

1. (planned) ``offsets/<n>`` handed to the checkpoint's writer; with ``available_now`` the next
   batches are planned ahead now.
2. Partitions read (``headrace.engine.reader``; in reader threads or on the query's thread,
   whichever ``headrace.engine.read_mode`` measured to be cheaper), the stream's plan applied
   (``headrace.engine.plan``: stateless steps in the reader threads, stateful ones on the
   consumer), ``sink.write``.
3. ``offsets/<n>`` durable (waited for), dead letters settled, the sources of earlier batches
   whose marker is durable committed, then ``sink.commit(n, messages)``.
4. ``commits/<n>`` once the batch's state writes are durable, and ``source.commit(end)``
   deferred until the marker is durable.
5. The progress report (``headrace.engine.report``).

What becomes durable when (steps 1, 3 and 4) is :class:`headrace.engine.commits.CommitOrder`'s:
its docstring states the rules.
"""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING, Any

from headrace.engine.deadletters import settle_bad_records
from headrace.engine.planner import PlannedBatch
from headrace.engine.reader import BatchCounts, read_partitions
from headrace.engine.report import report_progress
from headrace.engine.watermark import late_events_ms
from headrace.errors import CheckpointError
from headrace.protocols import Partition
from headrace.transforms.operator import BatchInfo

if TYPE_CHECKING:
    from headrace.engine.run import QueryRun

__all__ = ["batch_info", "run_batch"]


def batch_info(run: QueryRun, batch_id: int, metadata: dict[str, Any], *, real_time: bool = False) -> BatchInfo:
    """Batch ``batch_id`` as its operators see it: both watermarks its ``offsets`` entry
    records (none without a watermark). Called once per batch, on the query's thread."""
    if not run.tracker.enabled:
        return BatchInfo(batch_id, None, real_time=real_time)
    cp = run.checkpoint

    def previous(n: int) -> dict[str, Any] | None:
        try:
            return cp.read_offsets(n).metadata
        except CheckpointError:  # gone (retention) or unreadable: the entry's own watermark
            return None

    late = late_events_ms(metadata, batch_id, previous)
    return BatchInfo(batch_id, int(metadata.get("batchWatermarkMs") or 0), real_time=real_time, late_watermark_ms=late)


def run_batch(run: QueryRun, p: PlannedBatch) -> None:
    """Run planned batch ``p`` of ``run`` to its commit and report it. Called once per
    micro-batch (and per replayed batch) on the query's thread; raises what failed it, after
    ``sink.abort``."""
    sink, runner, order = run.sink, run.runner, run.commits
    batch_id = p.batch_id
    info = batch_info(run, batch_id, p.metadata)
    info.timestamp_ms = int(p.wall * 1000)  # offsets/<n>'s timestamp (a replay plans with the recorded one)
    run.status.current_batch = batch_id
    run.status.set("Processing new data", data_available=True, trigger_active=True)
    run.planner.fill(p, run.loop.batches_run)  # the next batches' entries go to the disk while this one runs

    parts: list[tuple[int, Partition]] = []
    for i, (src, st, en) in enumerate(zip(run.sources, p.starts, p.ends, strict=True)):
        if st != en:
            parts.extend((i, part) for part in src.partitions(st, en))
    counts = BatchCounts([0] * len(run.sources))
    t = time.monotonic()
    t_wal = p.t_wal
    t_commit = 0.0
    messages: list[Any] = []
    runner.begin(info)
    mode = run.read_mode
    parallel = len(parts) > 1 and mode.parallel()  # reader threads, or the query's thread alone
    read = read_partitions(run.sources, parts, runner.reader_transform, counts, batch_id=batch_id,
                           pool=run.lane if parallel else None, crash=run.crash)  # fmt: skip
    ran = run.loop.batches_run
    # with a watermark, the next batch is planned once this one's rows are read (Planner.plan_next)
    data = runner.run(read, info, gather=True, after_read=lambda: run.planner.plan_next(p, ran, info.watermark_ms))
    try:
        messages.append(sink.write(batch_id, data))
        runner.require_finished(run.spec.sink_connector)
        counts.output_rows = runner.rows_out  # what the sink was handed (after any stateful operator)
        if len(parts) > 1:
            mode.record(parallel, sum(counts.input_rows), time.monotonic() - t)
        # the write-ahead entry durable, dead letters settled, the previous marker visible
        t_wait, t_commit = order.before_sink_commit(
            batch_id, wal=p.wal, settle_dead_letters=lambda: settle_bad_records(run, batch_id, counts))
        t_wal += t_wait
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
    event_time = run.tracker.after_batch(info.watermark_ms)
    run.loop.last_watermark = info.watermark_ms
    t = time.monotonic()
    # the stateful operators' changelogs, still being fsynced, are durable before the marker
    order.commit(batch_id, runner.state_writes(), run.tracker.commit_info(), p.ends)
    t_commit += time.monotonic() - t
    run.loop.batches_run += 1
    total = time.monotonic() - p.t0
    report_progress(run, batch_id, p.wall, p.starts, p.ends, counts.input_rows, runner.rows_out,
              {"latestOffset": p.t_latest, "walCommit": t_wal, "addBatch": t_add,
               "commitOffsets": t_commit, "triggerExecution": total},
              event_time=event_time, state_operators=runner.state_metrics())  # fmt: skip
