"""Running one flow: building its streaming query (or recomputing its materialized view).

A streaming flow is an ordinary headrace query: the definition's stream, the expectations as
a batch transform, and the delta sink on the target table (or the sink's connector), with the
flow's own checkpoint under the storage root. The delta sink commits each batch with an app
transaction keyed by the checkpoint's query id, and pipeline tables are read with the
(replayable) delta source, so every streaming table is exactly-once across crashes.
A materialized view is recomputed from batch reads and replaces its table in one Delta commit.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa

from headrace.errors import HeadraceError
from headrace.options import Options
from headrace.pipelines._context import resolving
from headrace.pipelines.elements import MATERIALIZED_VIEW, SINK, STREAMING_TABLE, Flow
from headrace.pipelines.events import EventLog
from headrace.pipelines.expectations import ExpectationRunner
from headrace.pipelines.graph import DataflowGraph
from headrace.pipelines.resolver import STREAM, Resolver

__all__ = ["FlowSetup", "compute_materialized_view", "setup_stream_flow"]

log = logging.getLogger(__name__)


class WaitingForUpstream(HeadraceError):
    """A flow reads a pipeline table that has no data (no Delta table) yet."""


@dataclass
class FlowSetup:
    """A streaming flow ready to start."""

    flow: Flow
    writer: Any
    path: str | None
    expectations: ExpectationRunner


def _with_schema_locations(frame: Any, graph: DataflowGraph, flow: Flow) -> Any:
    """cloudFiles sources without a schemaLocation get one the pipeline manages (reset with
    the flow's checkpoint on full refresh), as Databricks pipelines do."""
    plans = []
    for i, plan in enumerate(frame._sources):
        opts: Options = plan.options
        if plan.connector.lower() == "cloudfiles" and plan.user_schema is None and "cloudFiles.schemaLocation" in opts \
                and not opts.is_set("cloudFiles.schemaLocation"):  # fmt: skip
            values = dict(opts._values)
            values[opts._key("cloudFiles.schemaLocation")] = graph.storage.schema_location(flow.name, i)
            given = set(opts._given) | {"cloudfiles.schemalocation"}
            plan = replace(plan, options=Options(values, given, opts._passthrough))
        plans.append(plan)
    return replace(frame, _sources=tuple(plans))


def _trigger(graph: DataflowGraph, flow: Flow, continuous: bool) -> dict[str, Any]:
    if not continuous:
        return {"available_now": True}
    conf = {**graph.configuration, **flow.spark_conf}
    lower = {k.lower(): v for k, v in conf.items()}
    interval = lower.get("pipelines.trigger.interval")
    if str(lower.get("pipelines.trigger", "")).lower() in ("realtime", "real_time"):
        return {"real_time": interval or "5 minutes"}
    return {"processing_time": interval or "1 second"}


def setup_stream_flow(
    graph: DataflowGraph,
    flow: Flow,
    *,
    continuous: bool,
    on_batch: Callable[[Flow, Any, ExpectationRunner], None],
) -> FlowSetup:
    """Call the definition (with the runtime resolver) and build its writer. Raises
    WaitingForUpstream when a table it streams from does not exist yet."""
    import headrace as hr

    storage = graph.storage
    target = graph.lookup(flow.target)
    assert target is not None
    kind = graph.kind_of(target)
    r = Resolver(graph, analysis=False)
    if flow.kind == "auto_cdc":
        assert flow.auto_cdc is not None
        with resolving(r):
            frame = hr.read_stream.table(flow.auto_cdc.source)
    else:
        frame = r.call(flow)
    persisted = {ds.name for ds in graph.datasets if graph.kind_of(ds) in (STREAMING_TABLE, MATERIALIZED_VIEW)}
    missing = sorted(n for n, how in r.reads.items() if STREAM in how and n in persisted and not storage.exists(n))
    if missing:
        raise WaitingForUpstream(f"{', '.join(missing)} has no data yet")
    frame = _with_schema_locations(frame, graph, flow)
    exps = ExpectationRunner(target.name, flow.all_expectations(target))
    if exps.expectations:
        frame = frame.map_batches(exps.apply)
    w = frame.write_stream
    checkpoint = storage.checkpoint(target.name, flow.name)
    path: str | None
    if kind == SINK:
        w = w.format(str(target.format)).options(dict(target.options))
        path = None
    else:
        w = w.format("delta").options(storage.delta_options())
        if flow.auto_cdc is not None:
            w = w.options(flow.auto_cdc.sink_options())
        if target.partition_cols:
            w = w.partition_by(*target.partition_cols)
        path = storage.table_path(target.name)
    if flow.kind == "update":
        from headrace.plugins import registry

        modes = getattr(registry().get(str(target.format)).load_sink(), "output_modes", ("append",))
        w = w.output_mode("update" if "update" in modes else "append")
    w = w.option("checkpointLocation", checkpoint).query_name(flow.name).trigger(**_trigger(graph, flow, continuous))
    w = w.on_progress(lambda p: on_batch(flow, p, exps))
    return FlowSetup(flow, w, path, exps)


def compute_materialized_view(graph: DataflowGraph, flow: Flow, events: EventLog | None = None) -> dict[str, Any]:
    """Recompute a materialized view and replace its table (one Delta commit). Returns its
    metrics (``num_output_rows`` and the expectations' counts). Raises WaitingForUpstream
    when an input table has no data yet."""
    storage = graph.storage
    target = graph.lookup(flow.target)
    assert target is not None
    r = Resolver(graph, analysis=False)
    out = r.call(flow)
    persisted = {ds.name for ds in graph.datasets if graph.kind_of(ds) in (STREAMING_TABLE, MATERIALIZED_VIEW)}
    missing = sorted(n for n in r.reads if n in persisted and not storage.exists(n))
    if missing:
        raise WaitingForUpstream(f"{', '.join(missing)} has no data yet")
    table = out if isinstance(out, pa.Table) else out.to_arrow() if callable(getattr(out, "to_arrow", None)) else out
    if not isinstance(table, pa.Table):
        raise HeadraceError(f"materialized view {target.name!r}: the query returned {type(table).__name__}, not a table")
    exps = ExpectationRunner(target.name, flow.all_expectations(target))
    table = exps.apply(table)
    storage.overwrite(target.name, table, list(target.partition_cols) if target.partition_cols else None)
    return {"num_output_rows": table.num_rows, "data_quality": exps.take()}
