"""Static frames: a source connector read once (everything available now) as a table.

``hr.read.format("delta").load(path)`` returns a :class:`StaticFrame`: lazy, read by
``to_arrow()`` (or, as the static side of a stream-static join, when the stream starts). A
read builds the source without a checkpoint (its state in a temporary folder), asks for
``initial_offset`` and, after ``prepare_for_available_now``, for ``latest_offset`` with no
limit until it stops moving, reads the partitions in parallel and closes the source; it never
calls ``commit`` (a static read consumes nothing, e.g. it acknowledges no Pub/Sub message).
"""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow as pa

from headrace.errors import HeadraceError
from headrace.transforms.frame import FrameSteps
from headrace.transforms.operator import BatchInfo, Operator

__all__ = ["DataFrameReader", "StaticFrame", "read", "read_source_once"]


def read_source_once(plan: Any, *, max_rounds: int = 10_000) -> pa.Table:
    """Everything ``plan`` (a ``SourcePlan``) has now, as one table. Called once per read."""
    from headrace.engine.reader import BatchCounts, ReadLane, read_partitions
    from headrace.helpers.crash import CrashHook
    from headrace.plugins import registry
    from headrace.protocols import ReadLimit, SourceContext

    cls = registry().get(plan.connector).load_source()
    with tempfile.TemporaryDirectory(prefix="headrace-read-") as state:
        ctx = SourceContext(query_id="static-read", run_id=str(uuid.uuid4()), source_index=0, state_path=state,
                            user_schema=plan.user_schema)  # fmt: skip
        src = cls(plan.options, ctx)
        try:
            schema = src.schema
            bounded = src.prepare_for_available_now()
            limit = ReadLimit.all_available()
            start = src.initial_offset()
            batches: list[pa.RecordBatch] = []
            pool = ReadLane(min(8, max(2, os.cpu_count() or 2)))
            try:
                for _ in range(max_rounds):
                    end = src.latest_offset(start, limit)
                    if end == start:
                        break
                    parts = [(0, p) for p in src.partitions(start, end)]
                    it = read_partitions([src], parts, None, BatchCounts([0]), batch_id=0, pool=pool, crash=CrashHook())
                    batches.extend(it)
                    start = end
                    if not bounded:  # a source that cannot fix its end: one batch of what is there now
                        break
            finally:
                pool.shutdown(wait=True, cancel_futures=True)
            return pa.Table.from_batches(batches, schema=schema) if batches else schema.empty_table()
        finally:
            src.close()


@dataclass(frozen=True)
class StaticFrame(FrameSteps):
    """A table read once: a connector's data now (``hr.read...load()``) or a ``pyarrow.Table``
    (``StaticFrame.from_arrow(t)``), with stateless steps (``select_expr``, ``where``, ...).

    Lazy: nothing is read until :meth:`to_arrow` (or the start of a stream joined with it)."""

    _base: Any  # a SourcePlan, or a pyarrow.Table
    _steps: tuple[Operator, ...] = ()
    _schema: pa.Schema | None = None

    @classmethod
    def from_arrow(cls, table: pa.Table) -> StaticFrame:
        """A static frame over an in-memory table."""
        if not isinstance(table, pa.Table):
            raise HeadraceError(f"StaticFrame.from_arrow takes a pyarrow.Table, not {type(table).__name__}")
        return cls(table, (), table.schema)

    def _with_step(self, op: Operator) -> StaticFrame:
        if op.stateful:
            raise HeadraceError(f"{op.name} is a streaming operator; a static frame takes stateless steps only")
        return replace(self, _steps=(*self._steps, op), _schema=self._next_schema(self._schema, op))

    @property
    def schema(self) -> pa.Schema:
        """The frame's schema (for a connector, its source is built to ask, no data read)."""
        if self._schema is not None:
            return self._schema
        base = self._base_schema()
        from headrace.engine.plan import PlanRunner

        out = PlanRunner(self._steps, base).output_schema
        if out is None:
            return self.to_arrow().schema
        return out

    def _base_schema(self) -> pa.Schema:
        if isinstance(self._base, pa.Table):
            return self._base.schema
        if self._base.user_schema is not None:
            return self._base.user_schema
        from headrace.plugins import registry
        from headrace.protocols import SourceContext

        cls = registry().get(self._base.connector).load_source()
        with tempfile.TemporaryDirectory(prefix="headrace-read-") as state:
            src = cls(self._base.options, SourceContext(query_id="static-read", state_path=state))
            try:
                return src.schema
            finally:
                src.close()

    def to_arrow(self) -> pa.Table:
        """Read the data now and apply the steps; returns a ``pyarrow.Table``. Each call reads
        again (a stream joined with this frame calls it once, when it starts)."""
        table = self._base if isinstance(self._base, pa.Table) else read_source_once(self._base)
        if not self._steps:
            return table
        from headrace.engine.plan import PlanRunner

        runner = PlanRunner(self._steps, table.schema)
        runner.begin(BatchInfo(0))
        out = runner.apply_prefix(table)
        if out is None:
            return runner.output_schema.empty_table() if runner.output_schema is not None else pa.table({})
        return out

    def __repr__(self) -> str:
        base = "arrow table" if isinstance(self._base, pa.Table) else self._base.describe()
        return f"StaticFrame({base}, {len(self._steps)} steps)"


@dataclass(frozen=True)
class DataFrameReader:
    """Builds a static read: ``hr.read.format(...).option(...).load(path)`` -> :class:`StaticFrame`."""

    _format: str | None = None
    _options: Mapping[str, Any] = field(default_factory=dict)
    _schema: pa.Schema | None = None

    def format(self, source: str) -> DataFrameReader:
        """The connector name (``"delta"``, ``"lakebase"``, ``"cloudFiles"``, ...)."""
        return replace(self, _format=source)

    def option(self, key: str, value: Any) -> DataFrameReader:
        from headrace.api import _merge

        return replace(self, _options=_merge(self._options, {key: value}))

    def options(self, options: Mapping[str, Any] | None = None, /, **kwargs: Any) -> DataFrameReader:
        from headrace.api import _merge

        return replace(self, _options=_merge(self._options, {**(options or {}), **kwargs}))

    def schema(self, schema: pa.Schema | str) -> DataFrameReader:
        from headrace.api import parse_schema

        return replace(self, _schema=parse_schema(schema))

    def load(self, path: str | None = None) -> StaticFrame:
        """Validate the options (raising ``OptionsError`` before any I/O) and return the
        (lazy) static frame."""
        from headrace.api import DataStreamReader

        if not self._format:
            raise HeadraceError("read needs a format: hr.read.format('delta').load(path); see `headrace connectors`")
        stream = DataStreamReader(self._format, self._options, self._schema).load(path)
        plan = stream._sources[0]
        return StaticFrame(plan, (), self._schema)

    def table(self, name: str) -> StaticFrame:
        """Table ``name`` as a lazy static frame: inside a definition a declarative pipeline
        calls (``headrace.pipelines``), a dataset of the pipeline (its Delta table, or the
        temporary view's result; the name becomes an edge of the pipeline's graph); elsewhere a
        Delta table of the local warehouse (:mod:`headrace.api.warehouse`)."""
        from headrace.api.catalog import current_catalog

        return current_catalog().static_frame(name)


read = DataFrameReader()
"""The entry point of static reads: ``hr.read.format(...)``."""
