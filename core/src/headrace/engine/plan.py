"""Running a stream's plan (its list of operators) over each batch.

At ``start()`` the plan is resolved against the source's schema: every step's output schema
is computed (SQL is run on an empty table, so a bad expression fails before any I/O), then
the steps are split in two stages:

- the *prefix*: the stateless steps before the first stateful one, run per record batch in the
  reader threads (consecutive SQL steps fused into one DuckDB query, or compiled to Arrow
  compute); when the first stateful step has a partial stage (``Operator.partial_stage()``;
  an aggregation's: windows assigned, partial aggregates per key), it runs on the rows the
  prefix kept. In a micro-batch it runs on the consumer thread over the record batches
  gathered up to :data:`COALESCE_ROWS` rows (or :data:`COALESCE_BYTES`): one partial per
  gathering instead of one per record batch, and no combining of partials that have the
  same keys (Spark's partial aggregate likewise builds one hash map per task over all its
  rows). In a real-time batch it runs per chunk in the readers, so each chunk's updates go
  out at once. The operator gets the partial stage's output (``Operator.process_partial``;
  an aggregation merges one partial row per key into state);
- the *suffix*: from the first stateful step on, run on the consumer thread, in order:
  ``process`` per chunk, then ``finish`` per operator at the end of the batch, each
  operator's output going through the steps after it.

When a batch yields no rows, the sink still gets one empty record batch of the output schema.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from headrace.engine.reader import empty_batch
from headrace.errors import HeadraceError, UnsupportedError
from headrace.transforms.operator import BatchInfo, Operator, OperatorContext, StateWrite
from headrace.transforms.stateless import SchemaUnknown, SqlOperator
from headrace.transforms.watermark import WatermarkOperator
from headrace.transforms.watermark_filters import assign_measure_filters, downstream_filters

__all__ = ["PlanRunner", "is_aggregation"]

log = logging.getLogger(__name__)

#: record batches are gathered for an aggregation's partial stage up to this many rows ...
COALESCE_ROWS = 1 << 18
#: ... or this many bytes (the memory a gathering holds), whichever comes first
COALESCE_BYTES = 32 << 20


def is_aggregation(op: Operator) -> bool:
    """Whether ``op`` is a streaming aggregation (``group_by(...).agg``: ``Operator.aggregation``)."""
    return bool(op.aggregation)


def _counts_as_stateful(op: Operator) -> bool:
    """Whether ``op`` is a stateful operator for Spark's check of chained operators
    (``UnsupportedOperationChecker.isStatefulOperation``): aggregations, joins,
    transform_with_state, deduplications within the watermark, and deduplications with the
    event-time column among their keys."""
    if not op.stateful:
        return False
    if hasattr(op, "within_watermark") and hasattr(op, "columns"):  # drop_duplicates
        wm = getattr(op, "watermark_column", None)
        cols = getattr(op, "columns", None) or []
        return bool(getattr(op, "within_watermark", False)) or (wm is not None and (not cols or wm in cols))
    return True


def real_time_problems(operators: Sequence[Operator], mode: str) -> list[str]:
    """The reasons these operators cannot run in real-time mode (empty when they can). Needs
    no schema: the query checks it before its checkpoint is created, and the plan again."""
    problems = []
    for op in operators:
        if not getattr(op, "supports_real_time", True) or getattr(op, "within_watermark", False):
            reason = getattr(op, "real_time_reason", None)  # the reference's own words, where it has them
            problems.append(f"{op.name}: {reason}" if reason else f"{op.name} is not supported in real-time mode")
        elif is_aggregation(op) and mode != "update":
            problems.append(f"aggregations ({op.name}) run in real-time mode only with output_mode('update')")
    return problems


@dataclass
class _Step:
    index: int
    op: Operator
    schema: pa.Schema | None  # the step's input schema, None when unknown before data


class PlanRunner:
    """One query run's plan. Built at ``start()`` (validation), opened once, then driven per
    batch by the engine: ``begin`` -> (``apply_prefix`` in readers, ``run`` on the consumer)."""

    def __init__(self, operators: Sequence[Operator], input_schema: pa.Schema,
                 source_schemas: Sequence[pa.Schema] | None = None) -> None:  # fmt: skip
        # a shallow copy per run: one frame may be started by several queries at once
        self.operators = [copy.copy(op) for op in operators]
        self.input_schema = input_schema
        # a first step reading several inputs (a stream-stream join) resolves each side's own
        # steps on its sources' schemas, and runs them in the readers (see reader_transform)
        self.multi_input: Operator | None = None
        self.source_count = len(source_schemas) if source_schemas else 1
        for k, op in enumerate(self.operators):
            if getattr(op, "multi_input", False):
                if k != 0:
                    raise HeadraceError(f"{op.name} must be the first step of its plan")
                op.bind_sources(list(source_schemas or [input_schema]))  # type: ignore[attr-defined]
                self.multi_input = op
        steps: list[_Step] = []
        schema: pa.Schema | None = input_schema
        unknown_after = ""
        self.watermark_of: dict[int, WatermarkOperator] = {}  # step -> the with_watermark before it
        last_wm: WatermarkOperator | None = None
        for i, op in enumerate(self.operators):
            steps.append(_Step(i, op, schema))
            if last_wm is not None:
                self.watermark_of[i] = last_wm
            if isinstance(op, WatermarkOperator):
                last_wm = op
            if schema is None:
                if op.stateful:
                    raise HeadraceError(
                        f"{op.name} needs its input schema when the query starts, but {unknown_after} before it "
                        "does not declare what it returns; give it: map_batches(fn, schema=pyarrow.schema([...]))"
                    )
                continue
            try:
                schema = op.output_schema(schema)
            except SchemaUnknown:
                schema = None
                unknown_after = op.name
        self.output_schema: pa.Schema | None = schema
        self.sink_schema: pa.Schema | None = schema  # what the sink is told (None: unknown)
        self._assign_measure_filters(steps)
        first_stateful = next((k for k, s in enumerate(steps) if s.op.stateful), len(steps))
        self.prefix: list[Operator] = _fuse(steps[:first_stateful])
        self.suffix: list[Operator] = [s.op for s in steps[first_stateful:]]
        # the first stateful step's partial stage (an aggregation's: Spark's partial aggregate)
        self.partial_stage: Callable[[pa.Table], pa.Table] | None = (
            self.suffix[0].partial_stage() if self.suffix else None
        )
        self.stateful: list[tuple[int, Operator]] = [(s.index, s.op) for s in steps if s.op.stateful]
        self.watermarks: list[tuple[int | str, WatermarkOperator]] = [
            (s.index, s.op) for s in steps if isinstance(s.op, WatermarkOperator)
        ]
        if self.multi_input is not None:
            self.watermarks[:0] = self.multi_input.side_watermarks()  # type: ignore[attr-defined]
        self._opened = False
        self.finished = True

    def source_columns(self) -> frozenset[str] | None:
        """The source's columns the plan reads, when it reads fewer than all of them: each step
        is asked, last to first, which of its input columns make the columns the next one reads
        (``Operator.input_columns``; the last step makes every column it outputs, for the sink).
        None when some column may be read by a step that cannot say, when the plan reads
        several sources, or when it reads every column (or none). Called once per query run at
        ``start()``, for ``Source.prune_columns``."""
        if self.multi_input is not None or self.source_count != 1:
            return None
        needed: frozenset[str] | None = None
        for op in reversed(self.operators):
            needed = op.input_columns(needed)
        names = frozenset(self.input_schema.names)
        if needed is None or not needed & names or names <= needed:
            return None
        return needed & names

    def _assign_measure_filters(self, steps: Sequence[_Step]) -> None:
        """Spark evaluates some filters below a watermark, so the rows they drop do not move
        it: each ``with_watermark`` step (the sides' too) learns which
        (:mod:`headrace.transforms.watermark_filters`)."""
        chain = [(s.op, s.schema) for s in steps]
        if self.multi_input is not None:
            first = self.multi_input
            names = steps[1].schema.names if len(steps) > 1 and steps[1].schema is not None else []
            after = downstream_filters(chain[1:], names).conjuncts if names else []
            first.assign_measure_filters(after)  # type: ignore[attr-defined]
            chain = chain[1:]
        assign_measure_filters(chain)

    @property
    def has_stateful(self) -> bool:
        return bool(self.stateful)

    # ------------------------------------------------------------------ checks at start()
    def check_output_mode(self, mode: str) -> None:
        """Refuse what Spark refuses, with Spark's reasons. Called at ``start()``."""
        aggs = [op for op in self.operators if is_aggregation(op)]
        if mode == "complete" and not aggs:
            raise UnsupportedError(
                "Complete output mode not supported when there are no streaming aggregations on streaming "
                "DataFrames/Datasets; use output_mode('append') or ('update'), or add a group_by(...).agg(...)"
            )
        if mode != "append":  # chained stateful operators: Spark's check of the global watermark
            after_agg = False
            for op in self.operators:
                if after_agg and _counts_as_stateful(op):
                    raise UnsupportedError(
                        "Detected pattern of possible 'correctness' issue due to global watermark. The query "
                        "contains stateful operation which can emit rows older than the current watermark plus "
                        "allowed late record delay, which are \"late rows\" in downstream stateful operations and "
                        f"these rows can be discarded ({op.name} after an aggregation in {mode} mode); run the "
                        "query in output_mode('append'), or write the aggregation to a table and stream from it"
                    )
                after_agg = after_agg or is_aggregation(op)
        for op in self.operators:
            check = getattr(op, "check_output_mode", None)
            if callable(check):
                check(mode)

    def check_real_time(self, mode: str) -> list[str]:
        """The reasons this plan cannot run in real-time mode (empty when it can)."""
        return real_time_problems(self.operators, mode)

    # ------------------------------------------------------------------ life cycle
    def operator_options(self, index: int) -> dict[str, object]:
        """What the engine tells operator ``index`` in ``OperatorContext.options``: the event
        time column and delay of the ``with_watermark`` before it, if any."""
        wm = self.watermark_of.get(index)
        return {"watermarkColumn": wm.column, "watermarkDelayMs": wm.delay_ms} if wm is not None else {}

    def open(self, context: Callable[[int, Operator], OperatorContext]) -> None:
        """Open every operator (stateful ones open their state store). Called once per run."""
        opened: list[Operator] = []
        try:
            for i, op in enumerate(self.operators):
                op.open(context(i, op))
                opened.append(op)
        except BaseException:
            for op in opened:
                try:
                    op.close()
                except Exception as e:
                    log.warning("closing %s failed: %s", op.name, e)
            raise
        self._opened = True

    def close(self) -> None:
        if not self._opened:
            return
        self._opened = False
        for op in self.operators:
            try:
                op.close()
            except Exception as e:
                log.warning("closing %s failed: %s", op.name, e)

    def begin(self, info: BatchInfo) -> None:
        """Start a batch: every operator's ``begin`` (stateful ones load state ``n - 1``)."""
        for op in self.operators:
            op.begin(info)
        self._info = info
        self.finished = False

    # ------------------------------------------------------------------ per chunk
    def apply_prefix(self, table: pa.Table) -> pa.Table | None:
        """The stateless steps before the first stateful one, then the partial stage of the
        stateful step that comes next (:attr:`partial_stage`); called per record batch in the
        reader threads (thread-safe)."""
        out = self.apply_stateless(table)
        if out is None or self.partial_stage is None:
            return out
        return self.partial_stage(out)

    @property
    def prefix_transform(self) -> Callable[[pa.Table], pa.Table | None] | None:
        """The readers' transform of each record batch in a real-time batch (the stateless
        steps, then the partial aggregation), or None when there is nothing to apply."""
        return self.apply_prefix if self.prefix or self.partial_stage is not None else None

    def apply_stateless(self, table: pa.Table) -> pa.Table | None:
        """The stateless steps before the first stateful one (thread-safe)."""
        info = self._info
        for op in self.prefix:
            out = op.process(table, info)
            if out is None:
                return None
            table = out
        return table

    @property
    def reader_transform(self) -> Callable[[pa.Table], pa.Table | None] | list[Callable[[pa.Table], Any]] | None:
        """The readers' transform of each record batch in a micro-batch: the stateless steps
        (the partial aggregation runs in :meth:`run`, over record batches gathered), or None
        when there is nothing to apply; for a plan reading several inputs (a stream-stream
        join), one transform per source (its side's steps). Called once per batch."""
        rest = self.prefix_transform if self.partial_stage is None else self.apply_stateless if self.prefix else None
        if self.multi_input is None:
            return rest
        sides = [self.multi_input.side_transform(i) for i in range(self.source_count)]  # type: ignore[attr-defined]
        return sides if rest is None else [_then(side, rest) for side in sides]

    def _through(self, start: int, table: pa.Table | None, info: BatchInfo) -> Iterator[pa.Table]:
        if table is None or (table.num_rows == 0 and start < len(self.suffix)):
            return
        for k in range(start, len(self.suffix)):
            op = self.suffix[k]
            if k == 0 and self.partial_stage is not None:  # the chunk is the partial stage's output
                out = op.process_partial(table, info)
            else:
                out = op.process(table, info)
            if out is None or out.num_rows == 0:
                return
            table = out
        yield table

    def process_chunk(self, table: pa.Table, info: BatchInfo) -> Iterator[pa.Table]:
        """The suffix over one chunk (already through the prefix); on the consumer thread."""
        yield from self._through(0, table, info)

    def finish(self, info: BatchInfo) -> Iterator[pa.Table]:
        """End of batch: each suffix operator's ``finish`` output goes through the steps after it."""
        for k, op in enumerate(self.suffix):
            out = op.finish(info)
            if out is not None and out.num_rows:
                yield from self._through(k + 1, out, info)
        self.finished = True

    def require_finished(self, sink_name: str) -> None:
        """Raise unless the sink read the whole batch; called after ``sink.write`` returns, once
        per batch (micro-batch and real-time)."""
        if not self.finished:
            raise HeadraceError(
                f"sink '{sink_name}' returned from write() without reading the whole batch; "
                "a sink must consume every record batch it is given"
            )

    def run(self, data: Iterator[pa.RecordBatch], info: BatchInfo, *, gather: bool = False,
            after_read: Callable[[], None] | None = None) -> Generator[pa.RecordBatch, None, None]:  # fmt: skip
        """The batch as the sink sees it: the reader's record batches through the suffix, then
        the operators' end-of-batch output. With ``gather`` (micro-batches, whose readers
        applied :attr:`reader_transform`), an aggregation's partial stage runs here over the
        record batches gathered up to :data:`COALESCE_ROWS` rows or :data:`COALESCE_BYTES`;
        without, the readers applied :attr:`prefix_transform` (partials per record batch).
        ``after_read`` is called once every input row is read and through the stateless steps
        (the watermarks' event times are known), before the operators' ``finish``.
        Counts the rows handed on in ``self.rows_out``."""
        self.rows_out = 0
        yielded = False
        gathered: list[pa.RecordBatch] = []
        rows = size = 0
        gathering = gather and self.partial_stage is not None
        for b in data:
            if not self.suffix:
                self.rows_out += b.num_rows
                yielded = True
                yield b
                continue
            if gathering:
                if b.num_rows:
                    gathered.append(b)
                    rows += b.num_rows
                    size += b.nbytes
                if rows < COALESCE_ROWS and size < COALESCE_BYTES:
                    continue
                chunks, gathered, rows, size = self._partials_of(gathered), [], 0, 0
            else:
                chunks = [pa.Table.from_batches([b])]
            for chunk in chunks:
                for t in self.process_chunk(chunk, info):
                    for o in t.to_batches():
                        self.rows_out += o.num_rows
                        yielded = True
                        yield o
        for chunk in self._partials_of(gathered) if gathered else []:
            for t in self.process_chunk(chunk, info):
                for o in t.to_batches():
                    self.rows_out += o.num_rows
                    yielded = True
                    yield o
        if after_read is not None:
            after_read()
        for t in self.finish(info):
            for o in t.to_batches():
                self.rows_out += o.num_rows
                yielded = True
                yield o
        if not yielded and self.sink_schema is not None:
            yield empty_batch(self.sink_schema)

    def _partials_of(self, batches: list[pa.RecordBatch]) -> list[pa.Table]:
        """The partial aggregation of record batches gathered by :meth:`run`: of one table
        whose columns keep the batches as chunks (nothing is copied), or, for batches of
        different schemas, of each batch."""
        assert self.partial_stage is not None
        try:
            table = pa.Table.from_batches(batches)
        except pa.ArrowInvalid:
            return [self.partial_stage(pa.Table.from_batches([b])) for b in batches]
        return [self.partial_stage(table)]

    def state_writes(self) -> list[StateWrite]:
        """The stateful operators' state writes still pending after ``finish`` (see
        ``Operator.state_write``): the engine calls their ``result()`` before the marker."""
        out = []
        for _, op in self.stateful:
            f = op.state_write()
            if f is not None:
                out.append(f)
        return out

    def state_metrics(self) -> list[dict[str, object]]:
        """Spark's ``stateOperators``: one entry per stateful operator, after a batch, in Spark's
        order (the last operator of the plan first: Spark lists them from the plan's root)."""
        out = []
        for _, op in reversed(self.stateful):
            try:
                m = dict(op.metrics())
            except Exception as e:  # metrics must never fail a batch
                m = {"error": str(e)}
            m.setdefault("operatorName", op.name)
            out.append(m)
        return out


def _then(first: Callable[[pa.Table], pa.Table | None], then: Callable[[pa.Table], pa.Table | None]
          ) -> Callable[[pa.Table], pa.Table | None]:  # fmt: skip
    """``first``, then ``then`` on what it kept (a side's steps, then the plan's stateless steps)."""

    def both(table: pa.Table) -> pa.Table | None:
        out = first(table)
        return None if out is None else then(out)

    return both


def _fuse(steps: Sequence[_Step]) -> list[Operator]:
    """Consecutive SQL steps with known input schemas become one query (or one chain of Arrow
    compute calls when every step compiles, :mod:`headrace.transforms.arrow_eval`)."""
    out: list[Operator] = []
    run: list[tuple[SqlOperator, pa.Schema]] = []

    def flush() -> None:
        if run:
            op = run[0][0] if len(run) == 1 else SqlOperator.fuse(run)
            op.fast_for(run[0][1])  # compiled to Arrow now, not by the reader threads at the first chunk
            out.append(op)
        run.clear()

    for s in steps:
        if isinstance(s.op, SqlOperator) and s.schema is not None:
            run.append((s.op, s.schema))
        else:
            flush()
            out.append(s.op)
    flush()
    return out

