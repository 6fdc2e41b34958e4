"""Static frames: tables read once, the one ``StaticFrame`` of headrace (``hr.read`` and the
pipelines' ``dp.read`` both make them).

``hr.read.format("delta").load(path)`` returns a :class:`StaticFrame`: lazy, read by
``to_arrow()`` (or, as the static side of a stream-static join, when the stream starts). Its
base is one of:

- a source connector (any name in the connector registry): the read builds the source without
  a checkpoint (its state in a temporary folder), asks for ``initial_offset`` and, after
  ``prepare_for_available_now``, for ``latest_offset`` with no limit until it stops moving,
  reads the partitions in parallel and closes the source; it never calls ``commit`` (a static
  read consumes nothing, e.g. it acknowledges no Pub/Sub message). Read again at every
  ``to_arrow()``;
- one of Spark's built-in file formats that no connector is named after (``parquet``,
  ``json``, ``csv``, ``arrow``): the files read by pyarrow; they take no options (an option
  given is an ``OptionsError``, as for a connector);
- a ``pyarrow.Table`` (``StaticFrame.from_arrow``);
- a table computed on first use and kept (``StaticFrame.lazy(load)``): what the declarative
  pipelines build (a dataset read as a snapshot for the whole run; in their dry run a loader
  that raises instead of reading), and what ``transform`` and static-static ``join`` return.
"""

from __future__ import annotations

import os
import tempfile
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow as pa

from headrace.errors import ConnectorNotFoundError, HeadraceError, OptionsError
from headrace.options import OptionSchema
from headrace.transforms.frame_steps import FrameSteps
from headrace.transforms.operator import BatchInfo, Operator

__all__ = ["FILE_FORMATS", "DataFrameReader", "FileRead", "LazyTable", "StaticFrame", "read", "read_source_once"]

#: Spark's built-in file formats a static read takes when no connector has the name (pyarrow's
#: readers: ``ipc``/``feather`` are the Arrow format's other names)
FILE_FORMATS = ("parquet", "json", "csv", "arrow", "ipc", "feather")
FILE_READ_OPTIONS = OptionSchema([])
"""The options of a file-format read: none (the readers' defaults; Auto Loader's options are
``format("cloudFiles")``'s)."""


class LazyTable:
    """A table computed by ``load()`` on first use and then kept: the same snapshot for every
    later read. Thread-safe (one load even when several threads ask at once)."""

    def __init__(self, load: Callable[[], pa.Table], description: str = "") -> None:
        self._load = load
        self._lock = threading.Lock()
        self._table: pa.Table | None = None
        self.description = description

    def get(self) -> pa.Table:
        """The table: loaded on the first call (raising what ``load`` raises), then kept."""
        with self._lock:
            if self._table is None:
                table = self._load()
                if not isinstance(table, pa.Table):
                    raise HeadraceError(f"{self.describe()} computed {type(table).__name__}, not a pyarrow.Table")
                self._table = table
            return self._table

    def describe(self) -> str:
        return self.description or "a computed table"


@dataclass(frozen=True)
class FileRead:
    """Files of one of :data:`FILE_FORMATS` under ``path`` (a file or a folder), read by pyarrow."""

    format: str
    path: str

    def read(self) -> pa.Table:
        """Every file's rows now. Called once per ``to_arrow()``."""
        import pyarrow.dataset as ds

        fmt = {"arrow": "ipc", "feather": "ipc"}.get(self.format, self.format)
        if fmt == "json":  # pyarrow.dataset has no JSON format: one table per file (files sorted by name)
            import pyarrow.json as pj

            files = sorted(os.path.join(r, f) for r, _, fs in os.walk(self.path) for f in fs
                           if not f.startswith((".", "_"))) if os.path.isdir(self.path) else [self.path]  # fmt: skip
            tables = [pj.read_json(f) for f in files]
            return pa.concat_tables(tables, promote_options="permissive") if tables else pa.table({})
        return ds.dataset(self.path, format=fmt).to_table()

    def schema(self) -> pa.Schema:
        """The files' schema (the footers for parquet and Arrow; JSON and CSV are read)."""
        if self.format in ("parquet", "arrow", "ipc", "feather"):
            import pyarrow.dataset as ds

            return ds.dataset(self.path, format={"parquet": "parquet"}.get(self.format, "ipc")).schema
        return self.read().schema

    def describe(self) -> str:
        return f"{self.format} files at {self.path}"


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
    """A table read once: a connector's data now (``hr.read...load()``), files, a
    ``pyarrow.Table`` (``StaticFrame.from_arrow(t)``) or a table computed on first use
    (``StaticFrame.lazy(load)``), with stateless steps (``select_expr``, ``where``, ...).

    Lazy: nothing is read until :meth:`to_arrow` (or the start of a stream joined with it)."""

    _base: Any  # a SourcePlan, a FileRead, a LazyTable or a pyarrow.Table
    _steps: tuple[Operator, ...] = ()
    _schema: pa.Schema | None = None

    @classmethod
    def from_arrow(cls, table: pa.Table) -> StaticFrame:
        """A static frame over an in-memory table."""
        if not isinstance(table, pa.Table):
            raise HeadraceError(f"StaticFrame.from_arrow takes a pyarrow.Table, not {type(table).__name__}")
        return cls(table, (), table.schema)

    @classmethod
    def lazy(cls, load: Callable[[], pa.Table], description: str = "") -> StaticFrame:
        """A static frame whose table ``load()`` computes on the first :meth:`to_arrow` (on the
        thread asking), kept for every later read of this frame and of the frames made from
        it: a snapshot. Its schema is the table's (asking for it loads the table)."""
        return cls(LazyTable(load, description))

    def cached(self) -> StaticFrame:
        """This frame read once, on first use, and then kept (a snapshot for a pipeline's run)."""
        if isinstance(self._base, LazyTable | pa.Table) and not self._steps:
            return self
        return StaticFrame.lazy(self.to_arrow, repr(self))

    def transform(self, fn: Callable[[pa.Table], pa.Table]) -> StaticFrame:
        """A frame computed as ``fn(this frame's table)``, on first use, then kept."""
        return StaticFrame.lazy(lambda: fn(self.to_arrow()), f"{self!r}.transform")

    map_table = transform

    def join(self, other: StaticFrame | pa.Table, on: str | Sequence[str], how: str = "inner") -> StaticFrame:
        """This frame joined with ``other`` (a static frame or a ``pyarrow.Table``) on equal
        ``on`` columns, any of Spark's join types (``inner``, ``left``, ``right``, ``full``,
        ``left_semi``, ``left_anti`` and their other spellings); computed on first use, then
        kept. ``how`` is checked now. A stream joins a static frame with ``StreamFrame.join``."""
        from headrace.transforms.join import join_tables, join_type

        join_type(how)
        if not isinstance(other, StaticFrame | pa.Table):
            raise HeadraceError(f"join() of a static frame takes a StaticFrame or a pyarrow.Table, not {type(other).__name__}")
        right = other if isinstance(other, StaticFrame) else StaticFrame.from_arrow(other)
        return StaticFrame.lazy(lambda: join_tables(self.to_arrow(), right.to_arrow(), on, how), f"{self!r}.join")

    def where(self, condition: Any) -> StaticFrame:
        """Keep the rows where the SQL ``condition`` is true (as a stream's ``where``); a function
        of the table returning a boolean array is taken too (as :meth:`filter`)."""
        if callable(condition) and not isinstance(condition, str):
            from headrace.functions import Column

            if not isinstance(condition, Column):
                return self.filter(condition)
        return super().where(condition)

    def count(self) -> int:
        """The number of rows (reads the frame)."""
        return int(self.to_arrow().num_rows)

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
        if isinstance(self._base, LazyTable):
            return self._base.get().schema
        if isinstance(self._base, FileRead):
            return self._base.schema()
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
        table = self._read_base()
        if not self._steps:
            return table
        from headrace.engine.plan import PlanRunner

        runner = PlanRunner(self._steps, table.schema)
        runner.begin(BatchInfo(0))
        out = runner.apply_prefix(table)
        if out is None:
            return runner.output_schema.empty_table() if runner.output_schema is not None else pa.table({})
        return out

    def _read_base(self) -> pa.Table:
        base = self._base
        if isinstance(base, pa.Table):
            return base
        if isinstance(base, LazyTable):
            return base.get()
        if isinstance(base, FileRead):
            return base.read()
        return read_source_once(base)

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
        fmt = self._format.lower()
        if fmt in FILE_FORMATS and not _is_connector(fmt):
            try:
                FILE_READ_OPTIONS.parse(self._options, connector=fmt, role="source")
            except OptionsError as e:
                raise OptionsError(fmt, "source", e.problems, hint=(
                    f"'{fmt}' files are read with pyarrow's defaults and take no options; for Auto Loader's options "
                    f"read them with format('cloudFiles').option('cloudFiles.format', '{fmt}')")) from None  # fmt: skip
            if path is None:
                raise HeadraceError(f"read.format({self._format!r}).load(path) needs the path of the files")
            frame = StaticFrame(FileRead(fmt, path))
            if self._schema is not None:  # the files' columns cast to the schema given, as Spark
                schema = self._schema
                return frame.transform(lambda t: t.select(schema.names).cast(schema))
            return frame
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


def _is_connector(name: str) -> bool:
    """Whether the registry has a connector called ``name`` (it takes precedence over a file format)."""
    from headrace.plugins import registry

    try:
        registry().get(name)
    except ConnectorNotFoundError:
        return False
    return True


read = DataFrameReader()
"""The entry point of static reads: ``hr.read.format(...)``."""
