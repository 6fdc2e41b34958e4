"""Batch reads inside a pipeline: ``dp.read.table(name)`` and the lazy ``StaticFrame``.

A ``StaticFrame`` is a batch table computed on demand: nothing is read when a definition is
called (the dry run calls every definition without touching data); the first ``to_arrow()`` of
a run reads it, and that snapshot is kept for the rest of the run, so a stream-static join
sees the dimension table as it was when the stream started (seeds/004).

    dims = dp.read.table("customers")                         # another dataset of the pipeline
    facts = hr.read_stream.table("transactions")
    return dp.stream_static_join(facts, dims, on="customer_id")

The ``transforms`` work adds ``hr.read`` and stream-static joins to the core API; in a
pipeline, those resolve dataset names through the same resolver.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow as pa

from headrace.errors import HeadraceError
from headrace.pipelines._context import active_resolver

__all__ = ["NeedsData", "StaticFrame", "StaticReader", "join_tables", "read", "stream_static_join"]

_JOIN_TYPES = {
    "inner": "inner", "left": "left outer", "left_outer": "left outer", "leftouter": "left outer",
    "right": "right outer", "right_outer": "right outer", "rightouter": "right outer",
    "full": "full outer", "outer": "full outer", "full_outer": "full outer", "fullouter": "full outer",
    "left_semi": "left semi", "semi": "left semi", "leftsemi": "left semi",
    "left_anti": "left anti", "anti": "left anti", "leftanti": "left anti",
}  # fmt: skip


class NeedsData(HeadraceError):
    """Raised by ``StaticFrame.to_arrow()`` while the dry run analyses definitions (no I/O)."""


def join_tables(left: pa.Table, right: pa.Table, on: str | Sequence[str], how: str = "inner") -> pa.Table:
    """``left`` joined with ``right`` on equal ``on`` columns (Spark's ``how`` names)."""
    jt = _JOIN_TYPES.get(how.lower())
    if jt is None:
        raise HeadraceError(f"join how={how!r} is not supported; use one of {', '.join(sorted(_JOIN_TYPES))}")
    keys = [on] if isinstance(on, str) else list(on)
    for side, t in (("left", left), ("right", right)):
        missing = [k for k in keys if k not in t.column_names]
        if missing:
            raise HeadraceError(f"join on {keys}: the {side} side has no column {missing} (columns: {t.column_names})")
    return left.join(right, keys=keys, join_type=jt, coalesce_keys=True, use_threads=False)


class StaticFrame:
    """A lazily computed batch table (a snapshot per run). Build with ``dp.read``."""

    def __init__(self, load: Callable[[], pa.Table], description: str = "") -> None:
        self._load = load
        self._lock = threading.Lock()
        self._table: pa.Table | None = None
        self.description = description

    def to_arrow(self) -> pa.Table:
        """The table (read on the first call, then the same snapshot). Thread-safe."""
        with self._lock:
            if self._table is None:
                self._table = self._load()
            return self._table

    def transform(self, fn: Callable[[pa.Table], pa.Table]) -> StaticFrame:
        """A frame computed as ``fn(this frame's table)``."""
        return StaticFrame(lambda: fn(self.to_arrow()), f"{self.description}.transform")

    map_table = transform

    def where(self, condition: str | Callable[[pa.Table], Any]) -> StaticFrame:
        """Rows where the SQL ``condition`` (or ``condition(table)``, a boolean array) holds."""
        if isinstance(condition, str):
            from headrace.pipelines.expectations import to_duckdb

            sql = to_duckdb(condition, what="where()")

            def run(t: pa.Table) -> pa.Table:
                from headrace.transforms.expressions import condition_mask

                return t.filter(condition_mask(t, sql))

            return self.transform(run)
        return self.transform(lambda t: t.filter(condition(t)))

    filter = where

    def select_expr(self, *exprs: str) -> StaticFrame:
        """Columns computed by SQL expressions (``"a * 2 AS b"``), as Spark's ``selectExpr``."""
        return self.sql("SELECT " + ", ".join(exprs) + " FROM batch")

    def sql(self, query: str) -> StaticFrame:
        """A frame computed by a DuckDB ``query`` over this frame, visible as ``batch``."""
        from headrace.transforms.expressions import run_sql

        return self.transform(lambda t: run_sql(t, query))

    def join(self, other: Any, on: str | Sequence[str], how: str = "inner") -> StaticFrame:
        """This frame joined with ``other`` (a ``StaticFrame`` of either kind or a
        ``pyarrow.Table``) on equal ``on`` columns; ``how`` as in Spark."""
        if isinstance(other, StaticFrame):
            right = other
        elif isinstance(other, pa.Table):
            right = StaticFrame(lambda: other)
        else:  # the core's StaticFrame (hr.read...), or anything with to_arrow()
            right = StaticFrame(other.to_arrow, repr(other))
        return StaticFrame(lambda: join_tables(self.to_arrow(), right.to_arrow(), on, how), f"{self.description}.join")

    def count(self) -> int:
        return int(self.to_arrow().num_rows)

    def __repr__(self) -> str:
        return f"StaticFrame({self.description or '...'})"


def stream_static_join(stream: Any, static: Any, on: str | Sequence[str], how: str = "inner") -> Any:
    """Join each micro-batch of ``stream`` with ``static`` (snapshotted when the flow starts):
    Spark's stream-static join. ``how`` is ``inner`` or ``left`` (the stream's side is kept)."""
    if how.lower() not in ("inner", "left", "left_outer", "leftouter", "left_semi", "left_anti", "semi", "anti"):
        raise HeadraceError(f"a stream-static join keeps the stream on the left: how must be inner, left, left_semi or left_anti, not {how!r}")
    if isinstance(static, StaticFrame):
        frame = static
    elif isinstance(static, pa.Table):
        frame = StaticFrame(lambda: static)
    else:  # the core's StaticFrame
        frame = StaticFrame(static.to_arrow, repr(static))
    return stream.map_batches(lambda t: join_tables(t, frame.to_arrow(), on, how))


def _read_files(fmt: str, path: str, options: Mapping[str, Any]) -> pa.Table:
    fmt = fmt.lower()
    if fmt == "delta":
        from deltalake import DeltaTable

        storage = {k[len("storage."):]: str(v) for k, v in options.items() if k.lower().startswith("storage.")}
        return DeltaTable(path, storage_options=storage or None).to_pyarrow_table()
    import pyarrow.dataset as ds

    if fmt not in ("parquet", "csv", "json", "arrow", "ipc", "feather"):
        raise HeadraceError(f"dp.read.format({fmt!r}): batch reads support delta, parquet, csv, json and arrow")
    if fmt == "json":
        import os

        import pyarrow.json as pj

        files = [os.path.join(r, f) for r, _, fs in os.walk(path) for f in sorted(fs) if not f.startswith((".", "_"))] \
            if os.path.isdir(path) else [path]  # fmt: skip
        tables = [pj.read_json(f) for f in sorted(files)]
        return pa.concat_tables(tables, promote_options="permissive") if tables else pa.table({})
    return ds.dataset(path, format=fmt).to_table()


@dataclass(frozen=True)
class StaticReader:
    """``dp.read``: batch reads, of pipeline datasets (``table(name)``) or files (``format().load()``)."""

    _format: str | None = None
    _options: Mapping[str, Any] = field(default_factory=dict)

    def format(self, source: str) -> StaticReader:
        return replace(self, _format=source)

    def option(self, key: str, value: Any) -> StaticReader:
        return replace(self, _options={**self._options, key: value})

    def options(self, options: Mapping[str, Any] | None = None, /, **kwargs: Any) -> StaticReader:
        return replace(self, _options={**self._options, **(options or {}), **kwargs})

    def table(self, name: str) -> StaticFrame:
        """Another dataset of the pipeline, read as a batch (an edge of the graph). Only inside
        a definition that the pipeline runner (or dry run) calls."""
        resolver = active_resolver()
        if resolver is None:
            raise HeadraceError(
                f"dp.read.table({name!r}) reads a dataset of a declarative pipeline and works only inside a "
                "definition the pipeline calls; outside one, read the table's files: dp.read.format('delta').load(path)"
            )
        return resolver.static_table(name)

    def load(self, path: str) -> StaticFrame:
        """Files or a Delta table outside the pipeline, read when the frame is first used."""
        if not self._format:
            raise HeadraceError("dp.read needs a format: dp.read.format('delta').load(path)")
        fmt, opts = self._format, dict(self._options)
        resolver = active_resolver()
        if resolver is not None:
            path = resolver.resolve_path(path)
            if resolver.analysis:
                return StaticFrame(_needs_data(f"{fmt}:{path}"), f"{fmt}:{path}")
        return StaticFrame(lambda: _read_files(fmt, path, opts), f"{fmt}:{path}")


def _needs_data(what: str) -> Callable[[], pa.Table]:
    def load() -> pa.Table:
        raise NeedsData(f"{what} is read when the pipeline runs, not by the dry run")

    return load


read = StaticReader()
"""``dp.read``: batch reads (the counterpart of ``hr.read_stream``)."""
