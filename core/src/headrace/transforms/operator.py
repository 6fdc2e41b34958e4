"""The interface between the engine and a stream's operators (the steps of its logical plan).

A stream's plan is a list of operators applied, in order, to every micro-batch. The engine
(``headrace.engine``) drives them; an operator never sees offsets, checkpoints' files or sinks.

Life cycle, per query run::

    schema = op.output_schema(input_schema)      # at start(), before any I/O: validation
    op.open(OperatorContext(...))                # once, after the checkpoint is open
    for each batch n (also when batch n is replayed after a crash):
        op.begin(BatchInfo(n, watermark_ms, ...))  # stateful operators load state version n-1
        op.process(table, info) -> table | None  # once per chunk of the batch, in order
        op.finish(info) -> table | None          # once, after the last chunk: emit, then
                                                 # write state version n (may be in flight)
        op.state_write() -> StateWrite | None    # result() returns once version n is durable:
                                                 # the engine calls it before batch n's marker
    op.close()

An operator may split its work in two stages, as Spark's partial and final aggregates: a
*partial stage* (``partial_stage()``: a function the engine runs on the rows before they reach
the operator, in parallel and with no state) and ``process_partial`` (the operator's own step,
given the partial stage's output instead of the rows). Both are optional: by default there is
no partial stage and ``process`` gets the rows.

Stateless operators implement only ``output_schema`` and ``process``. Stateful operators keep
their state in a store under ``<checkpoint>/state/<operator index>/``, versioned by batch id:
replaying batch n starts again from version n-1, so output is the same as the first time.

Where the engine runs them (``headrace.engine.plan``): the stateless steps before the first
stateful one run per record batch in the reader threads (so their ``process`` must be
thread-safe; ``begin`` is called before any thread starts); from the first stateful step on,
everything runs on the consumer thread. ``open`` is called on a shallow copy of the operator
made for each query run: keep per-run state in attributes set by ``open``/``begin``.

In real-time mode (``BatchInfo.real_time``) a batch lasts the whole trigger interval and its
chunks are a few rows each: stateful operators emit from ``process`` (aggregations in update
mode: the groups the chunk changed; ``drop_duplicates``: the new rows), and ``finish``, when
the interval ends, makes state version ``n`` durable before the sink commits.

A batch may have no data (``process`` never called): the engine runs one when the watermark
moved and the plan has stateful operators, so that append-mode windows can be emitted and
state evicted (Spark's no-data batch).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import pyarrow as pa

__all__ = ["BatchInfo", "Operator", "OperatorContext", "StateWrite"]


@dataclass(frozen=True)
class OperatorContext:
    """What the engine tells an operator when a query run opens it.

    ``state_path`` is the operator's own folder (``<checkpoint>/state/<index>``), created by
    the engine; ``None`` for stateless operators. ``state_backend`` is the writer option
    ``stateStore`` (``memory`` or ``rocksdb``). ``retain`` is how many state versions to keep
    (the checkpoint's retention). ``output_mode`` is the query's. ``options`` carries the
    writer options ``checkpointFsync``, ``stateSnapshotInterval`` and ``rocksdbHeldKeysMB``
    (parsed: a bool, an int of at least 1, an int of at least 0), for stateful operators ``lastCommittedBatch`` (the checkpoint's last committed
    batch id, ``-1`` for none) and, after a ``with_watermark``, its ``watermarkColumn`` and
    ``watermarkDelayMs``.
    """

    index: int
    query_id: str = ""
    state_path: str | None = None
    state_backend: str = "memory"
    retain: int = 100
    output_mode: str = "append"
    real_time: bool = False
    options: Mapping[str, Any] = field(default_factory=dict)


@dataclass
class BatchInfo:
    """One batch as operators see it, with Spark's two watermarks (since Spark 3.4), both epoch
    milliseconds (``None`` without a watermark) and both recorded in ``offsets/<n>`` so a
    replay uses the same ones:

    - ``watermark_ms``, the watermark for eviction (Spark's ``eventTimeWatermarkForEviction``):
      this batch's, computed from the batches before it; what the watermark has passed is
      emitted (append mode) and evicted from state;
    - ``late_watermark_ms``, the watermark for late events (``eventTimeWatermarkForLateEvents``):
      the previous batch's; input rows it has passed are dropped as late. ``None`` (a batch
      built without it) means the same as ``watermark_ms``: read it as :attr:`late_ms`.

    ``dropped_by_watermark`` is filled in by operators (rows older than the watermark they
    dropped)."""

    batch_id: int
    watermark_ms: int | None = None
    real_time: bool = False
    dropped_by_watermark: int = 0
    late_watermark_ms: int | None = None
    timestamp_ms: int | None = None  # the batch's processing time: offsets/<n>'s timestamp, kept on a replay

    @property
    def late_ms(self) -> int | None:
        """The watermark input rows are dropped by as late: ``late_watermark_ms``, or, when the
        batch was built without one, ``watermark_ms``."""
        return self.watermark_ms if self.late_watermark_ms is None else self.late_watermark_ms


class StateWrite(Protocol):
    """A state write the engine waits for (``concurrent.futures.Future`` fits, as does
    ``headrace.state.PendingWrite``, which runs the write on the thread that asks)."""

    def result(self, timeout: float | None = None) -> Any: ...


class Operator(ABC):
    """One step of a stream's plan. Instances are built at definition time (and validated
    there where the input schema is known), then reused by each run of the query.

    Class attributes:

    - ``stateful``: keeps state across batches (needs a checkpoint folder).
    - ``supports_real_time``: may run inside a real-time batch (processing chunks as they
      arrive and emitting without waiting for the end of the batch).
    - ``output_modes``: the query output modes it allows (Spark's rules), ``None`` for all.
    - ``aggregation``: a streaming aggregation (``group_by(...).agg``): Spark's rules for
      aggregations apply (several only chained in ``append`` mode; ``complete`` mode needs
      one; in real-time mode only with ``update``).
    """

    stateful: ClassVar[bool] = False
    supports_real_time: ClassVar[bool] = True
    output_modes: ClassVar[tuple[str, ...] | None] = None
    aggregation: ClassVar[bool] = False

    @property
    def name(self) -> str:
        """A short name for progress and errors (``select``, ``aggregate``, ...)."""
        return type(self).__name__

    @abstractmethod
    def output_schema(self, input_schema: pa.Schema) -> pa.Schema:
        """The schema of the rows this step emits. Called at ``start()``, before any data is
        read; raises ``ExpressionError`` (naming the expression) on a bad expression."""

    def input_columns(self, needed: frozenset[str] | None) -> frozenset[str] | None:
        """The input columns this step reads to make the output columns ``needed`` (``None``:
        every output column), or ``None`` when it cannot say (it may read every input column:
        the default, always correct). The engine asks each step, last to first, to tell a
        source which of its columns the query reads (``Source.prune_columns``); a step that
        answers must work on a table holding only the columns it named (and maybe others).

        Called once per query run at ``start()``, on the caller's thread, before any data is
        read; pure."""
        return None

    def open(self, context: OperatorContext) -> None:
        """Called once per query run, after the checkpoint is open and before the first
        batch. Stateful operators open their state store here."""

    def begin(self, batch: BatchInfo) -> None:
        """Called once per batch before its first chunk (also for a replayed batch, which must
        start again from the state as of batch ``batch_id - 1``)."""

    @abstractmethod
    def process(self, table: pa.Table, batch: BatchInfo) -> pa.Table | None:
        """Called once per chunk of the batch's rows, in order, on the engine's consumer
        thread. Returns the rows to pass on now (stateless steps, real-time aggregations), or
        ``None``."""

    def partial_stage(self) -> Callable[[pa.Table], pa.Table] | None:
        """The operator's partial stage, or ``None`` (this default): a function from a table of
        input rows (the output of the stateless steps before this operator) to a table the
        engine hands to :meth:`process_partial` instead of the rows to :meth:`process`; for an
        aggregation, the rows' partial aggregates per key. The engine uses it when the operator
        is the plan's first stateful step: in a micro-batch on the consumer thread, over the
        record batches gathered up to a bound (one call per gathering: its columns may have
        several chunks), in a real-time batch per chunk in the reader threads. The function
        must be thread-safe, keep no state and depend only on its input (a replay calls it
        again on the same rows). Called once per query run, at ``start()``, after
        ``output_schema``."""
        return None

    def process_partial(self, partial: pa.Table, batch: BatchInfo) -> pa.Table | None:
        """One output table of :meth:`partial_stage`, in order, on the engine's consumer
        thread, in place of :meth:`process`; returns the rows to pass on now, or ``None``.
        Called only for an operator whose ``partial_stage()`` returned a function; this
        default hands the table to :meth:`process`."""
        return self.process(partial, batch)

    def finish(self, batch: BatchInfo) -> pa.Table | None:
        """Called once after the batch's last chunk: returns the rows to emit at the end of
        the batch (aggregations), and makes state version ``batch_id`` durable."""
        return None

    def state_write(self) -> StateWrite | None:
        """After ``finish``: what makes state version ``batch_id`` durable, when ``finish``
        left the changelog's write and fsync pending (so that they run off the batch's path),
        or None. Called once per batch by the engine, which calls its ``result()`` (on the
        checkpoint's I/O thread, or its own) before it writes the batch's commit marker, never
        before the sink's write: a replay restores version ``n - 1`` and emits the same rows."""
        return None

    def metrics(self) -> Mapping[str, Any]:
        """After each batch, Spark's ``stateOperators`` entry (numRowsTotal, numRowsUpdated,
        numRowsRemoved, numRowsDroppedByWatermark, memoryUsedBytes, commitTimeMs, ...) for
        stateful operators; ``{}`` for stateless ones."""
        return {}

    def needs_batch_at(self, watermark_ms: int) -> bool:
        """Whether a batch without data, run with this (new) watermark, would emit rows or
        evict state: the engine runs such a batch when the watermark moves (Spark's
        ``shouldRunAnotherBatch``) only if some operator says so. Called between batches, on
        the query's thread, for stateful operators; this default says yes."""
        return True

    def needs_batch_at_time(self, now_ms: int) -> bool:
        """Whether a batch without data, run at processing time ``now_ms`` (epoch ms), would
        emit rows or change state (processing-time timers, expired TTLs): the engine runs one
        when the sources have no new data and some operator says so. Called between batches,
        on the query's thread, for stateful operators; this default says no."""
        return False

    def check_output_mode(self, mode: str) -> None:
        """Raise ``UnsupportedError`` with Spark's reason if this operator cannot run in the
        query's output ``mode`` (``append``/``update``/``complete``). Called at ``start()``,
        before any I/O."""

    def close(self) -> None:
        """Release the state store. Called once when the query stops; idempotent."""
