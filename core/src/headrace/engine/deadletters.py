"""The engine's side of the bad-record policy (``headrace.badrecords``): the dead-letter sinks
and the settlement of each batch's bad records.

A source or sink that applies the policy has a ``bad_records`` attribute (a ``BadRecords``).
Its origin name — ``source-<i>-<connector>`` or ``sink-<connector>`` — names its dead-letter
file, or its dead-letter sink's query id, so origins never collide.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

from headrace.engine.reader import BatchCounts
from headrace.protocols import SinkContext

if TYPE_CHECKING:
    from headrace.engine.run import QueryRun

__all__ = ["close_dead_letter_sinks", "open_dead_letter_sinks", "settle_bad_records", "transform_bad_record_metrics"]

log = logging.getLogger(__name__)


def _origins(run: QueryRun) -> list[tuple[str, Any]]:
    spec = run.spec
    out: list[tuple[str, Any]] = [
        (f"source-{i}-{p.connector}", s) for i, (p, s) in enumerate(zip(spec.plans, run.sources, strict=True))
    ]
    out.extend((f"transform-{i}", t) for i, t in enumerate(_transforms(run)))
    out.append((f"sink-{spec.sink_connector}", run.sink))
    return out


def _transforms(run: QueryRun) -> list[Any]:
    """The plan's steps that apply the policy: operators with ``bad_records`` and the
    ``map_batches`` functions (and their composed parts) that have one, in plan order."""
    out: list[Any] = []
    for op in run.spec.operators:
        fn = getattr(op, "fn", None)
        targets = [op] if fn is None else list(getattr(fn, "parts", (fn,)))
        out.extend(t for t in targets if getattr(t, "bad_records", None) is not None)
    return out


def open_dead_letter_sinks(run: QueryRun) -> None:
    """Create the sinks that ``badRecordsSink`` names, each with a query id of its own (the main
    one + its origin) so their idempotent commits never collide with the main sink's. Called
    once per query start, after the sources and sink exist; option errors raise here."""
    from headrace.badrecords import DEAD_LETTER_SCHEMA
    from headrace.plugins import registry

    for origin, owner in _origins(run):
        bad = getattr(owner, "bad_records", None)
        if bad is None or not bad.sink_format:
            continue
        spec = registry().get(bad.sink_format)
        opts = spec.sink_options.parse(bad.sink_options, connector=spec.name, role=f"dead-letter sink of {origin}")
        state = os.path.join(run.checkpoint.location, "deadletters", origin)
        os.makedirs(state, exist_ok=True)
        ctx = SinkContext(query_id=f"{run.id}-deadletters-{origin}", run_id=run.run_id, query_name=f"{run.name}-deadletters",
                          output_mode="append", state_path=state, schema=DEAD_LETTER_SCHEMA)  # fmt: skip
        bad.sink = spec.load_sink()(opts, ctx)


def settle_bad_records(run: QueryRun, batch_id: int, counts: BatchCounts) -> None:
    """Apply the bad-record policy of every source and of the sink to the batch: once the
    sink's write returned and the write-ahead entry is durable, before the sink's commit."""
    for i, (plan, src) in enumerate(zip(run.spec.plans, run.sources, strict=True)):
        bad = getattr(src, "bad_records", None)
        if bad is not None:
            bad.settle(batch_id, counts.input_rows[i], origin=f"source-{i}-{plan.connector}")
    for i, t in enumerate(_transforms(run)):
        bad = getattr(t, "bad_records", None)
        if bad is not None:  # the rows read include those the transform took out
            bad.settle(batch_id, max(0, sum(counts.input_rows) - bad.pending()), origin=f"transform-{i}")
    bad = getattr(run.sink, "bad_records", None)
    if bad is not None:
        # the rows handed to the sink include those it rejected
        bad.settle(batch_id, max(0, counts.output_rows - bad.pending()), origin=f"sink-{run.spec.sink_connector}")


def close_dead_letter_sinks(run: QueryRun) -> None:
    """Close the dead-letter sinks. Called once when the query stops."""
    for _, owner in _origins(run):
        bad = getattr(owner, "bad_records", None)
        if bad is not None and bad.sink is not None:
            try:
                bad.sink.close()
            except Exception as e:
                log.warning("closing the dead-letter sink failed: %s", e)


def transform_bad_record_metrics(run: QueryRun) -> dict[str, int]:
    """The last batch's bad-record counts of the transforms (``FromJson``...), summed, as
    ``transformBadRecords``, ``transformBadRecordsDropped``, ``transformBadRecordsDeadLettered``
    (reported with the sink's metrics: progress has no section for transforms)."""
    out: dict[str, int] = {}
    for t in _transforms(run):
        bad = getattr(t, "bad_records", None)
        if bad is None:
            continue
        for k, v in bad.metrics().items():
            key = "transform" + k.removeprefix("num")
            out[key] = out.get(key, 0) + v
    return out
