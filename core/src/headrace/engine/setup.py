"""Setting a query up before its first batch: checks of the trigger and output mode, the
checkpoint opened, the sources, the operator plan, the sink and the dead-letter sinks built.
Everything that can be wrong in a query's definition is raised here, before any data is read."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from headrace.checkpoint import Checkpoint
from headrace.engine.deadletters import open_dead_letter_sinks
from headrace.engine.plan import PlanRunner, real_time_problems
from headrace.engine.watermark import EventTimeTracker
from headrace.errors import UnsupportedError, redact_url
from headrace.protocols import SinkContext, SourceContext
from headrace.transforms.operator import Operator, OperatorContext

if TYPE_CHECKING:
    from headrace.engine.query import StreamingQuery

__all__ = ["check_real_time", "operator_context", "resolve_plan", "setup_query"]


def resolve_plan(q: StreamingQuery, schema: pa.Schema, source_schemas: list[pa.Schema] | None = None) -> PlanRunner:
    """Validate the plan against the input schema (every expression run on an empty
    table; ``source_schemas``: every source's, for a plan reading several inputs), then its
    output mode and trigger. Raises before any data is read."""
    runner = PlanRunner(q._operators, schema, source_schemas)
    runner.check_output_mode(q.output_mode)
    if q.trigger.kind == "real_time":
        _refuse_real_time(runner.check_real_time(q.output_mode))
    return runner


def _refuse_real_time(problems: list[str]) -> None:
    if problems:
        raise UnsupportedError(
            "this plan cannot run with the real-time trigger: " + "; ".join(problems)
            + ". Use trigger(processing_time=...) instead"
        )


def setup_query(q: StreamingQuery) -> None:
    """Check the trigger and output mode, open the checkpoint, build the sources, the plan, the
    sink and the dead-letter sinks of ``q``. Called once per run by ``StreamingQuery.start``;
    raises configuration errors before any data is read (closing what was opened)."""
    if q.trigger.kind == "real_time":
        # the operators' own refusals first (a stream-stream join reads two sources: its own
        # reason says more than the one-source rule); they need no schema: before the
        # checkpoint is created
        _refuse_real_time(real_time_problems(q._operators, q.output_mode))
        check_real_time(q)
    if q.output_mode not in getattr(q._sink_class, "output_modes", ("append",)):
        raise UnsupportedError(
            f"sink '{q._sink_connector}' does not support output mode '{q.output_mode}'; "
            f"it supports: {', '.join(getattr(q._sink_class, 'output_modes', ('append',)))}"
        )
    user_schemas = [p.user_schema for p in q._plans if p.user_schema is not None]
    if len(user_schemas) == len(q._plans):  # validate before the checkpoint is touched
        resolve_plan(q, user_schemas[0], user_schemas)
    cp = Checkpoint(q._checkpoint_location, durable=q._fsync)
    meta = cp.open(
        name=q.name,
        sources=[{"connector": p.connector, "path": redact_url(p.path) if p.path else p.path} for p in q._plans],
        sink={"connector": q._sink_connector},
    )
    q._checkpoint = cp
    q.id = meta["id"]
    committed = bool(cp.committed_ids())
    q._history = q._new_history(cp.location)
    try:
        for i, plan in enumerate(q._plans):
            ctx = SourceContext(
                query_id=q.id,
                run_id=q.run_id,
                source_index=i,
                state_path=cp.source_state_path(i),
                user_schema=plan.user_schema,
                has_committed_batches=committed,
            )
            q._sources.append(plan.source_class(plan.options, ctx))
        runner = resolve_plan(q, q._sources[0].schema, [s.schema for s in q._sources])
        q._runner = runner  # before open(): operator contexts read it
        q._tracker = EventTimeTracker(runner.watermarks, policy=q._watermark_policy)
        schema = runner.sink_schema
        sctx = SinkContext(
            query_id=q.id,
            run_id=q.run_id,
            query_name=q.name,
            output_mode=q.output_mode,
            state_path=cp.sink_state_path(),
            schema=schema,
        )
        q._sink = q._sink_class(q._sink_options, sctx)
        runner.open(functools.partial(operator_context, q))
        open_dead_letter_sinks(q, cp)
    except BaseException:
        q._close_all()
        raise



def operator_context(q: StreamingQuery, index: int, op: Operator) -> OperatorContext:
    """The context of the plan's operator number ``index`` (its state folder, options)."""
    assert q._checkpoint is not None and q._runner is not None
    options: dict[str, Any] = {"checkpointFsync": q._fsync, "stateSnapshotInterval": q._snapshot_interval,
                               **q._runner.operator_options(index)}  # fmt: skip
    if op.stateful:
        options["lastCommittedBatch"] = max(q._checkpoint.committed_ids(), default=-1)
    return OperatorContext(
        index=index,
        query_id=q.id,
        state_path=q._checkpoint.state_path(index) if op.stateful else None,
        state_backend=q._state_store,
        retain=q._checkpoint.retain,
        output_mode=q.output_mode,
        real_time=q.trigger.kind == "real_time",
        options=options,
    )


def check_real_time(q: StreamingQuery) -> None:
    """Refuse the real-time trigger unless the source and the sink support it."""
    problems = []
    if len(q._plans) != 1:
        problems.append("it reads exactly one source")
    for p in q._plans:
        if not getattr(p.source_class, "supports_real_time", False):
            problems.append(f"source '{p.connector}' does not support it")
    if not getattr(q._sink_class, "supports_real_time", False):
        problems.append(f"sink '{q._sink_connector}' does not support it")
    if problems:
        raise UnsupportedError(
            "the real-time trigger needs a source and a sink that support it: " + "; ".join(problems)
            + ". Use trigger(processing_time=...) instead, or a real-time capable pair (e.g. kafka -> kafka)"
        )
