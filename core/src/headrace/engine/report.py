"""A batch's progress report: built from what the engine measured, then kept, handed to the
``on_progress`` callbacks, the progress history and the listener plugins.

Called once per batch on the query's thread (micro-batches and real-time batches alike).
Everything here is per batch, never per row; the costly parts of a report (its JSON form for
the history, the listeners' work) stay small: the history only queues the record for its own
thread, and the record's dict is built once and shared by the history and the listeners.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from headrace.engine.deadletters import transform_bad_record_metrics
from headrace.errors import redact
from headrace.progress import QueryProgress
from headrace.protocols import Offset

if TYPE_CHECKING:
    from headrace.engine.run import QueryRun

__all__ = ["report_progress"]

log = logging.getLogger(__name__)


def _source_reports(run: QueryRun, starts: list[Offset], ends: list[Offset], counts: list[int]) -> list[Any]:
    srcs = []
    for desc, src, st, en, n in zip(run.source_descriptions, run.sources, starts, ends, counts, strict=True):
        try:
            metrics = dict(src.metrics(en))
        except Exception as e:  # metrics must never fail a batch
            metrics = {"error": redact(e)}
        bad = getattr(src, "bad_records", None)
        if bad is not None:
            metrics.update(bad.metrics())
        srcs.append((desc, st, en, metrics.pop("latestOffset", en), n, metrics))
    return srcs


def _sink_metrics(run: QueryRun) -> dict[str, Any]:
    sink_metrics: dict[str, Any] = {}
    get_metrics = getattr(run.sink, "metrics", None)  # duck-typed sinks may lack it
    if callable(get_metrics):
        try:
            sink_metrics = dict(get_metrics())
        except Exception as e:  # metrics must never fail a batch
            sink_metrics = {"error": redact(e)}
    sink_bad = getattr(run.sink, "bad_records", None)
    if sink_bad is not None:
        sink_metrics.update(sink_bad.metrics())
    sink_metrics.update(transform_bad_record_metrics(run))
    return sink_metrics


def report_progress(
    run: QueryRun,
    batch_id: int,
    wall: float,
    starts: list[Offset],
    ends: list[Offset],
    counts: list[int],
    out_rows: int,
    durations: dict[str, float],
    latencies: dict[str, Sequence[float]] | None = None,
    *,
    event_time: dict[str, str] | None = None,
    state_operators: list[dict[str, Any]] | None = None,
) -> QueryProgress:
    """Build batch ``batch_id``'s report (``durations`` in seconds) and hand it on: to the
    query (``QueryRun.publish``: kept in ``recent_progress``, then the ``on_progress``
    callbacks), the history, the ``headrace_query_progress`` listeners and a DEBUG log line.
    Returns it."""
    sink_metrics = _sink_metrics(run)
    skipped = sink_metrics.get("numRowsSkipped")
    if isinstance(skipped, int) and not isinstance(skipped, bool) and skipped > 0:
        # the sink already held this batch (a replay): its rows are not output again
        out_rows = max(0, out_rows - skipped)
    progress = QueryProgress.build(
        id=run.id,
        run_id=run.run_id,
        name=run.name,
        batch_id=batch_id,
        started=wall,
        durations=durations,
        previous_trigger=run.loop.last_trigger,
        sources=_source_reports(run, starts, ends, counts),
        sink=(run.spec.sink_connector, out_rows, sink_metrics),
        latencies=latencies,
        event_time=event_time,
        state_operators=state_operators,
    )
    run.loop.last_trigger = wall
    run.publish(progress)
    hook = run.hook
    history = run.history
    listeners = hook is not None and bool(hook.headrace_query_progress.get_hookimpls())
    if listeners or history is not None:
        d = progress.to_dict()
        if history is not None:
            history.append(d)
        if listeners:
            try:
                hook.headrace_query_progress(progress=d)
            except Exception as e:
                log.warning("a progress listener failed: %s", redact(e))
    if log.isEnabledFor(logging.DEBUG):
        log.debug("%s", progress.line())
    return progress
