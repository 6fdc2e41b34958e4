"""What every stateful operator shares: opening its state store from the engine's
``OperatorContext``, loading version ``n-1`` at the start of batch ``n``, committing version
``n`` at its end, and Spark's ``stateOperators`` metrics."""

from __future__ import annotations

import os
import time
from abc import abstractmethod
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa

from headrace.errors import CheckpointError, HeadraceError, UnsupportedError
from headrace.transforms.operator import BatchInfo, Operator, OperatorContext, StateWrite

__all__ = ["OUTPUT_MODES", "StatefulOperator", "drop_late_rows"]

OUTPUT_MODES = ("append", "update", "complete")


def drop_late_rows(table: pa.Table, order_us: np.ndarray, late_us: int | None, *, valid: np.ndarray | None = None,
                   ) -> tuple[pa.Table, np.ndarray, np.ndarray | None]:  # fmt: skip
    """Spark's late-row rule, shared by every stateful operator: a row whose event-time order
    (``order_us``, epoch µs: its event time, its window's end, its own session's end) is at or
    before the watermark for late events (``late_us``, :attr:`BatchInfo.late_ms` in µs; ``None``:
    nothing is late) is dropped; a row whose event time is NULL (``valid`` False) never is.

    Returns the rows kept, their orders, and the mask of the input rows that were late, or
    ``None`` when none was (then nothing is copied). Each operator counts the late rows as Spark
    does for it (``numRowsDroppedByWatermark``: rows, groups, or distinct keys and times).
    Called per chunk (or per batch) on the consumer thread; pure (thread-safe)."""
    if late_us is None or not len(order_us):
        return table, order_us, None
    late = order_us <= late_us
    if valid is not None:
        late &= valid
    if not late.any():
        return table, order_us, None
    keep = ~late
    return table.filter(pa.array(keep)), order_us[keep], late


class StatefulOperator(Operator):
    """Base of the aggregation and deduplication operators. Subclasses define
    ``_state_schemas()`` (key and value schemas, known after ``output_schema``) and the
    per-batch work; this class owns the store's life cycle."""

    stateful: ClassVar[bool] = True
    operator_name: ClassVar[str] = "stateful"

    def __init__(self) -> None:
        self._store: Any = None
        self._context: OperatorContext | None = None
        self._dropped = 0
        self._dropped_total = 0
        self._metrics: dict[str, Any] = {}
        self._input_schema: pa.Schema | None = None
        self._con: Any = None

    @property
    def name(self) -> str:
        return self.operator_name

    # ------------------------------------------------------------------ to implement
    @abstractmethod
    def _state_schemas(self) -> tuple[pa.Schema, pa.Schema]:
        """The (key, value) schemas of this operator's state rows. Called when the store opens."""

    def describe(self) -> str:
        return self.operator_name

    def state_spec(self) -> dict[str, Any]:
        """What this operator's state means, as a JSON object of strings, lists of strings and
        ``None``: stored in its state folder's ``metadata`` (``operatorSpec``) and compared
        when a later run opens the store, which refuses a checkpoint whose description
        differs (naming the fields that changed). Two operators must give equal descriptions
        exactly when the state one wrote is right for the other: record what decides the
        state's rows and their eviction, not output names. Called once per query run, in
        :meth:`open`, after ``output_schema`` (the query's output mode is
        :attr:`output_mode`), on the thread that opens the query."""
        return {"operator": self.operator_name}

    def check_output_mode(self, mode: str) -> None:
        """Raise ``UnsupportedError`` (with Spark's reason) when this operator cannot run in the
        query's output ``mode``. Called at ``start()``."""
        if mode not in OUTPUT_MODES:
            raise UnsupportedError(f"output mode {mode!r} is not one of {', '.join(OUTPUT_MODES)}")

    # ------------------------------------------------------------------ life cycle
    def open(self, context: OperatorContext) -> None:
        """Open the state store in ``context.state_path`` (``context.state_backend``). Called
        once per query run, after ``output_schema``."""
        from headrace.state import open_state_store

        if context.state_path is None:
            raise HeadraceError(f"{self.describe()} keeps state and needs a checkpoint folder (state_path is None)")
        if self._input_schema is None:
            raise HeadraceError(f"{self.describe()}: output_schema(input_schema) must be called before open()")
        self.check_output_mode(context.output_mode)
        key_schema, value_schema = self._state_schemas()
        self._context = context
        opts = context.options or {}
        last = opts.get("lastCommittedBatch")
        if last is not None and int(last) >= 0 and not os.path.lexists(os.path.join(context.state_path, "metadata")):
            raise CheckpointError(self._no_state_message(context, int(last)))
        self._store = open_state_store(
            context.state_backend,
            context.state_path,
            key_schema,
            value_schema,
            retain=context.retain,
            snapshot_interval=int(opts.get("stateSnapshotInterval", 10)),
            durable=bool(opts.get("checkpointFsync", True)),
            description=self.describe(),
            operator_spec=self.state_spec(),
            query_id=context.query_id,
            operator_id=f"{context.index}:{self.operator_name}",
            options={k: opts[k] for k in ("rocksdbHeldKeysMB",) if k in opts},
        )

    def _no_state_message(self, context: OperatorContext, last: int) -> str:
        """Why a query that committed batch ``last`` has no state for this operator: it was
        added, or it moved in the plan (its folder is its step's index)."""
        import json

        assert context.state_path is not None
        parent = os.path.dirname(context.state_path)
        held = []
        for name in sorted(os.listdir(parent), key=lambda n: (len(n), n)) if os.path.isdir(parent) else []:
            try:
                with open(os.path.join(parent, name, "metadata"), "rb") as f:
                    doc = json.loads(f.read())
                held.append(f"state/{name}: {doc.get('operator') if isinstance(doc, dict) else '?'}")
            except (OSError, ValueError):
                continue
        return (
            f"state folder {context.state_path} has no state, but the query already committed batch {last}: "
            f"{self.describe()} (step {context.index} of the query's plan) did not run there, so it was added to the "
            "query, or steps before it were added or removed (state is kept per step; this checkpoint holds "
            f"{', '.join(held) if held else 'no other state'}), and state cannot be carried over to the changed query. "
            "Fix: start it with a new checkpointLocation, or run the query unchanged on this checkpoint"
        )

    @property
    def store(self) -> Any:
        if self._store is None:
            raise HeadraceError(f"{self.describe()} is not open (the engine calls open() before the first batch)")
        return self._store

    @property
    def output_mode(self) -> str:
        return self._context.output_mode if self._context is not None else "append"

    def begin(self, batch: BatchInfo) -> None:
        """Load state version ``batch_id - 1`` (free when it is already loaded)."""
        self.store.load(batch.batch_id - 1)
        self._dropped = 0
        self._t_batch = time.monotonic()

    def _commit(self, batch: BatchInfo) -> None:
        self.store.commit(batch.batch_id, wait=False)  # the changelog's fsync: see state_write
        batch.dropped_by_watermark += self._dropped
        self._dropped_total += self._dropped
        m = dict(self.store.metrics())
        m["numRowsDroppedByWatermark"] = self._dropped
        self._metrics = {"operatorName": self.name, **m, "numShufflePartitions": 1,
                         "stateStore": self.store.backend}  # fmt: skip

    def state_write(self) -> StateWrite | None:
        """The write of the state version the last ``finish`` committed, while it may be
        pending (``StateStore.pending_write``)."""
        return self._store.pending_write() if self._store is not None else None

    def _run_sql(self, table: pa.Table, query: str) -> pa.Table:
        """``query`` over ``table`` (as ``batch``) on this operator's own DuckDB connection,
        created on the thread that processes batches and closed by :meth:`close`. (A
        connection kept in that thread's locals would be torn down while the interpreter
        exits, which DuckDB answers with an abort.)"""
        from headrace.transforms.expressions import ExpressionError

        con = self._con
        if con is None:
            try:
                import duckdb
            except ImportError:
                raise HeadraceError("this aggregation needs DuckDB; pip install 'headrace[sql]'") from None
            con = self._con = duckdb.connect(":memory:")
            con.execute("SET TimeZone = 'UTC'")  # as headrace.transforms.expressions, which typed the plan
        con.register("batch", table)
        try:
            return con.sql(query).to_arrow_table()
        except Exception as e:
            raise ExpressionError(f"{self.describe()}: {query!r} failed on columns {table.column_names}: {e}") from None
        finally:
            con.unregister("batch")

    def metrics(self) -> dict[str, Any]:
        """Spark's ``stateOperators`` entry for the last batch."""
        return dict(self._metrics)

    def close(self) -> None:
        """Close the state store and the DuckDB connection. Idempotent."""
        if self._con is not None:
            self._con.close()
            self._con = None
        if self._store is not None:
            self._store.close()
            self._store = None
