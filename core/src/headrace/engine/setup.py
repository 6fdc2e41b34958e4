"""Setting a query up before its first batch: checks of the trigger and output mode, the
checkpoint opened, the sources, the operator plan, the sink and the dead-letter sinks built,
and the run's other parts (planner, commit order, read lane, history) made: one
:class:`~headrace.engine.run.QueryRun`. Everything that can be wrong in a query's definition
is raised here, before any data is read."""

from __future__ import annotations

import dataclasses
import logging
import shutil
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from headrace.checkpoint import Checkpoint
from headrace.engine.commits import CommitOrder
from headrace.engine.deadletters import open_dead_letter_sinks
from headrace.engine.plan import PlanRunner, real_time_problems
from headrace.engine.planner import LOOK_AHEAD, Planner
from headrace.engine.read_mode import ReadMode
from headrace.engine.reader import ReadLane
from headrace.engine.run import QueryRun, QuerySpec, RunStatus, close_parts
from headrace.engine.watermark import EventTimeTracker
from headrace.errors import UnsupportedError, redact_url
from headrace.helpers.crash import CrashHook
from headrace.history import ProgressHistory
from headrace.protocols import Sink, SinkContext, Source, SourceContext
from headrace.transforms.operator import Operator, OperatorContext

if TYPE_CHECKING:
    from headrace.progress import QueryProgress

__all__ = ["check_real_time", "operator_context", "resolve_plan", "setup_query"]

log = logging.getLogger(__name__)


def resolve_plan(spec: QuerySpec, schema: pa.Schema, source_schemas: list[pa.Schema] | None = None) -> PlanRunner:
    """Validate the plan against the input schema (every expression run on an empty
    table; ``source_schemas``: every source's, for a plan reading several inputs), then its
    output mode and trigger. Raises before any data is read."""
    runner = PlanRunner(spec.operators, schema, source_schemas)
    runner.check_output_mode(spec.output_mode)
    if spec.trigger.kind == "real_time":
        _refuse_real_time(runner.check_real_time(spec.output_mode))
    return runner


def _refuse_real_time(problems: list[str]) -> None:
    if problems:
        raise UnsupportedError(
            "this plan cannot run with the real-time trigger: " + "; ".join(problems)
            + ". Use trigger(processing_time=...) instead"
        )


def check_definition(spec: QuerySpec) -> None:
    """What can be refused from the definition alone (trigger, output mode, a declared
    schema), before the checkpoint is created or touched."""
    if spec.trigger.kind == "real_time":
        # the operators' own refusals first (a stream-stream join reads two sources: its own
        # reason says more than the one-source rule); they need no schema: before the
        # checkpoint is created
        _refuse_real_time(real_time_problems(spec.operators, spec.output_mode))
        check_real_time(spec)
    if spec.output_mode not in getattr(spec.sink_class, "output_modes", ("append",)):
        raise UnsupportedError(
            f"sink '{spec.sink_connector}' does not support output mode '{spec.output_mode}'; "
            f"it supports: {', '.join(getattr(spec.sink_class, 'output_modes', ('append',)))}"
        )
    user_schemas = [p.user_schema for p in spec.plans if p.user_schema is not None]
    if len(user_schemas) == len(spec.plans):  # validate before the checkpoint is touched
        resolve_plan(spec, user_schemas[0], user_schemas)


def setup_query(spec: QuerySpec, *, run_id: str, stop: threading.Event, status: RunStatus,
                publish: Callable[[QueryProgress], None]) -> QueryRun:  # fmt: skip
    """Check the definition, open the checkpoint, build the sources, the plan, the sink and the
    dead-letter sinks, and return the run made of them. Called once per run by
    ``StreamingQuery.start``, on the caller's thread; raises configuration errors before any
    data is read (closing what was opened). ``stop`` is the query's stop event, ``status``
    what the run tells the query, ``publish`` where each batch's report goes. The progress
    history is started last (a history that cannot be written is left out, with a warning)."""
    from headrace.plugins import registry

    check_definition(spec)
    cp = Checkpoint(spec.checkpoint_location, durable=spec.checkpoint_fsync)
    meta = cp.open(
        name=spec.name,
        sources=[{"connector": p.connector, "path": redact_url(p.path) if p.path else p.path} for p in spec.plans],
        sink={"connector": spec.sink_connector},
    )
    query_id = meta["id"]
    committed = bool(cp.committed_ids())
    sources: list[Source] = []
    sink: Sink | None = None
    runner: PlanRunner | None = None
    run: QueryRun | None = None
    try:
        for i, plan in enumerate(spec.plans):
            ctx = SourceContext(
                query_id=query_id,
                run_id=run_id,
                source_index=i,
                state_path=cp.source_state_path(i),
                user_schema=plan.user_schema,
                has_committed_batches=committed,
            )
            sources.append(plan.source_class(plan.options, ctx))
        runner = resolve_plan(spec, sources[0].schema, [s.schema for s in sources])
        read = runner.source_columns()
        if read is not None and callable(getattr(sources[0], "prune_columns", None)):
            sources[0].prune_columns(read)  # the source may leave the other columns out of its batches
        tracker = EventTimeTracker(runner.watermarks, policy=spec.watermark_policy)
        sctx = SinkContext(
            query_id=query_id,
            run_id=run_id,
            query_name=spec.name,
            output_mode=spec.output_mode,
            state_path=cp.sink_state_path(),
            schema=runner.sink_schema,
        )
        sink = spec.sink_class(spec.sink_options, sctx)
        opened = runner
        runner.open(lambda index, op: operator_context(spec, query_id, cp, opened, index, op))
        crash = CrashHook.from_env()
        source_tuple = tuple(sources)
        commits = CommitOrder(cp, source_tuple, crash, max_pending=LOOK_AHEAD + 2)
        run = QueryRun(
            spec=spec,
            id=query_id,
            run_id=run_id,
            checkpoint=cp,
            sources=source_tuple,
            sink=sink,
            runner=runner,
            tracker=tracker,
            commits=commits,
            planner=Planner(name=spec.name, sources=source_tuple, tracker=tracker, commits=commits, crash=crash, stop=stop),
            lane=ReadLane(spec.read_parallelism),
            read_mode=ReadMode.for_sources(source_tuple),
            crash=crash,
            hook=registry().hook,
            history=ProgressHistory(cp.location, keep=spec.keep_progress),
            stop=stop,
            status=status,
            publish=publish,
            source_descriptions=tuple(p.describe() for p in spec.plans),
        )
        open_dead_letter_sinks(run)
    except BaseException:
        if run is not None:
            run.close()
        else:
            if runner is not None:
                runner.close()
            close_parts(sources, sink)
            cp.close()
            if spec.temp_checkpoint:
                shutil.rmtree(spec.checkpoint_location, ignore_errors=True)
        raise
    assert run.history is not None
    try:
        run.history.start(id=run.id, run_id=run.run_id, name=spec.name)
    except OSError as e:  # the history is for people; it never stops a query
        log.warning("query '%s': progress history disabled: %s", spec.name, e)
        run = dataclasses.replace(run, history=None)
    return run


def operator_context(spec: QuerySpec, query_id: str, cp: Checkpoint, runner: PlanRunner, index: int,
                     op: Operator) -> OperatorContext:  # fmt: skip
    """The context of the plan's operator number ``index`` (its state folder, options)."""
    options: dict[str, Any] = {"checkpointFsync": spec.checkpoint_fsync,
                               "stateSnapshotInterval": spec.state_snapshot_interval,
                               "rocksdbHeldKeysMB": spec.rocksdb_held_keys_mb,
                               **runner.operator_options(index)}  # fmt: skip
    if op.stateful:
        options["lastCommittedBatch"] = max(cp.committed_ids(), default=-1)
    return OperatorContext(
        index=index,
        query_id=query_id,
        state_path=cp.state_path(index) if op.stateful else None,
        state_backend=spec.state_store,
        retain=cp.retain,
        output_mode=spec.output_mode,
        real_time=spec.trigger.kind == "real_time",
        options=options,
    )


def check_real_time(spec: QuerySpec) -> None:
    """Refuse the real-time trigger unless the source and the sink support it."""
    problems = []
    if len(spec.plans) != 1:
        problems.append("it reads exactly one source")
    for p in spec.plans:
        if not getattr(p.source_class, "supports_real_time", False):
            problems.append(f"source '{p.connector}' does not support it")
    if not getattr(spec.sink_class, "supports_real_time", False):
        problems.append(f"sink '{spec.sink_connector}' does not support it")
    if problems:
        raise UnsupportedError(
            "the real-time trigger needs a source and a sink that support it: " + "; ".join(problems)
            + ". Use trigger(processing_time=...) instead, or a real-time capable pair (e.g. kafka -> kafka)"
        )
