"""The micro-batch loop of a query: replay what a crash left, then plan and run batches as the
trigger says (``headrace.engine.planner`` plans, ``headrace.engine.microbatch`` runs,
``headrace.engine.real_time`` runs real-time batches)."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from headrace.engine.microbatch import run_batch
from headrace.engine.real_time import run_real_time_batch
from headrace.errors import HeadraceError
from headrace.protocols import Offset, ReadLimit

if TYPE_CHECKING:
    from headrace.engine.run import QueryRun

__all__ = ["needs_no_data_batch", "run_loop"]

log = logging.getLogger(__name__)


def run_loop(run: QueryRun) -> int | None:
    """Replay the batches a crash (or a reset) left uncommitted, then run batches as the trigger
    says until it is done or the query is stopped; returns the last batch id run. Called once
    per run, on the query's thread."""
    cp, tracker, planner, sources, status = run.checkpoint, run.tracker, run.planner, run.sources, run.status
    trigger = run.spec.trigger
    pending = cp.pending()
    entry, committed = cp.latest()
    run.loop.last_watermark = tracker.watermark_ms
    if entry is None:
        batch_id = 0
        current: list[Offset] = [s.initial_offset() for s in sources]
    elif committed:
        if any(e is None for e in entry.ends):
            raise HeadraceError(f"checkpoint batch {entry.batch_id} is committed without an end offset")
        tracker.restore(entry.metadata, cp.read_commit(entry.batch_id) or {})
        run.loop.last_watermark = entry.metadata.get("batchWatermarkMs", tracker.watermark_ms)
        batch_id = entry.batch_id + 1
        current = [dict(e) for e in entry.ends if e is not None]
    else:
        # uncommitted batches (the one a crash interrupted, or those `checkpoint reset` rolled
        # back) are replayed first, each with exactly its recorded range, batch id and watermark
        for k, entry in enumerate(pending):
            if run.stop.is_set():
                return None
            log.info("query '%s': replaying uncommitted batch %d", run.name, entry.batch_id)
            tracker.restore(entry.metadata)
            if entry.real_time and any(e is None for e in entry.ends):
                if k != len(pending) - 1:
                    raise HeadraceError(f"checkpoint batch {entry.batch_id} has no end offset but later batches do")
                run_real_time_batch(run, entry.batch_id, list(entry.starts), entry.metadata)
            else:
                ends = [e for e in entry.ends if e is not None]
                run_batch(run, planner.plan(entry.batch_id, list(entry.starts), ends, replay=True,
                                            metadata=entry.metadata, wall=entry.timestamp_ms / 1000))  # fmt: skip
        latest, _ = cp.latest()
        assert latest is not None and entry is not None
        batch_id = entry.batch_id + 1
        current = [dict(e) for e in latest.ends if e is not None]
        if trigger.kind == "once":
            return entry.batch_id

    kind = trigger.kind
    limits = [s.default_read_limit() for s in sources]
    if kind == "once":
        limits = [ReadLimit.all_available() for _ in sources]
    elif kind == "available_now":
        prepared = [s.prepare_for_available_now() for s in sources]
        if not all(prepared):
            limits = [ReadLimit.all_available() for _ in sources]
            kind = "once"
    if kind == "available_now" and all(getattr(s, "supports_planning_ahead", False) for s in sources):
        if tracker.enabled:  # a batch's watermark needs the batch before it read: one batch ahead
            planner.enable_next_early(limits)
        else:
            planner.enable_look_ahead(limits)

    last_batch: int | None = None
    while not run.stop.is_set():
        if kind == "real_time":
            current = run_real_time_batch(run, batch_id, current)
            last_batch = batch_id
            batch_id += 1
            continue
        planned = planner.take()
        if planned is None:
            t0 = time.monotonic()
            status.set("Getting offsets from sources", data_available=False, trigger_active=True)
            ends = [s.latest_offset(st, lim) for s, st, lim in zip(sources, current, limits, strict=True)]
            t_latest = time.monotonic() - t0
            if all(e == st for e, st in zip(ends, current, strict=True)):
                if needs_no_data_batch(run):
                    run_batch(run, planner.plan(batch_id, current, current, t0=t0, t_latest=t_latest))
                    last_batch = batch_id
                    batch_id += 1
                    continue
                run.commits.settle()
                status.set("Waiting for data to arrive", data_available=False, trigger_active=False)
                status.idle_checks += 1
                if kind in ("once", "available_now"):
                    break
                run.stop.wait(trigger.interval if kind == "processing_time" else 0.01)
                continue
            planned = planner.plan(batch_id, current, ends, t0=t0, t_latest=t_latest)
        run_batch(run, planned)
        last_batch = planned.batch_id
        batch_id = planned.batch_id + 1
        current = planned.ends
        t0 = planned.t0
        if kind == "once":
            break
        if kind == "processing_time":
            remaining = trigger.interval - (time.monotonic() - t0)
            if remaining > 0:
                status.set("Waiting for next trigger", data_available=True, trigger_active=False)
                run.stop.wait(remaining)
    return last_batch


def needs_no_data_batch(run: QueryRun) -> bool:
    """Whether the watermark moved past the one the last batch ran with, in a plan with
    stateful operators, and one of them would then emit or evict in a batch without data
    (``Operator.needs_batch_at``: a batch that would change nothing is not run; its watermark
    goes with the next batch, and the last commit marker already records it); or, whatever
    the watermark, when an operator has processing-time work due now
    (``Operator.needs_batch_at_time``: timers, TTLs)."""
    runner, tracker = run.runner, run.tracker
    if not runner.has_stateful:
        return False
    now_ms = int(time.time() * 1000)
    if any(op.needs_batch_at_time(now_ms) for _, op in runner.stateful):
        return True  # processing-time timers or TTLs due (transform_with_state)
    if not (tracker.enabled and tracker.watermark_ms != run.loop.last_watermark):
        return False
    wm = tracker.watermark_ms
    return wm is not None and any(op.needs_batch_at(wm) for _, op in runner.stateful)
