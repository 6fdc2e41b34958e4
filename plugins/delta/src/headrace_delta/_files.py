"""Parquet data files written into a Delta table's folder, with the add actions that commit them.

The sink's direct append path: ``DataFileWriter`` encodes a batch's rows as Parquet files under
the table root while the batch arrives (in a thread of its own: pyarrow's encoder releases the
GIL), and describes each finished file as a :class:`DataFile` whose add action carries the
statistics delta-rs' own writer records (``numRecords``, ``minValues``, ``maxValues``,
``nullCount``). Nothing here is visible to readers until a Delta commit adds the files.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import decimal
import json
import logging
import math
import os
import queue
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from headrace_delta._schema import parse_partition_value
from headrace_delta._storage import TableLocation

__all__ = ["DataFile", "DataFileWriter", "Layout", "direct_schema", "read_back"]

log = logging.getLogger(__name__)

DEFAULT_TARGET_FILE_SIZE = 104_857_600
"""delta-rs' default target size of a data file (100 MiB)."""

ROW_GROUP_ROWS = 1 << 17
"""Rows buffered per partition before they are encoded as one Parquet row group."""

DICTIONARY_PAGE_LIMIT = 1 << 17
"""A column chunk's dictionary grows to this size before the column falls back to plain
encoding (pyarrow's default, 1 MiB, spends twice the CPU on columns of unique values, such as
ids, and makes larger files; low-cardinality columns stay dictionary-encoded)."""

DEFAULT_INDEXED_COLUMNS = 32
"""Delta's default ``delta.dataSkippingNumIndexedCols``: the leaf columns with statistics."""

HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"

_PARTITION_TYPES = (pa.types.is_string, pa.types.is_large_string, pa.types.is_integer, pa.types.is_boolean,
                    pa.types.is_date32)  # fmt: skip


@dataclass(frozen=True)
class Layout:
    """How a batch's files are laid out: the partition columns and which leaf columns get
    statistics (``stats_columns`` names them; else the first ``indexed_columns``). Picklable."""

    partition_by: tuple[str, ...] = ()
    indexed_columns: int = DEFAULT_INDEXED_COLUMNS
    stats_columns: tuple[str, ...] | None = None

    @classmethod
    def of_table(cls, table: Any, partition_by: Sequence[str] | None) -> Layout:
        """The layout for writing into ``table`` (a delta-rs ``DeltaTable`` or None: a new table
        partitioned by ``partition_by``)."""
        if table is None:
            return cls(tuple(partition_by or ()))
        meta = table.metadata()
        conf = meta.configuration or {}
        stats = conf.get("delta.dataSkippingStatsColumns")
        try:
            indexed = int(conf.get("delta.dataSkippingNumIndexedCols") or DEFAULT_INDEXED_COLUMNS)
        except ValueError:
            indexed = DEFAULT_INDEXED_COLUMNS
        cols = tuple(c.strip() for c in stats.split(",") if c.strip()) if stats else None
        return cls(tuple(meta.partition_columns or ()), indexed, cols)


@dataclass(frozen=True)
class DataFile:
    """One finished data file: its add action's fields. ``path`` is relative to the table root,
    not URL-encoded (delta-rs encodes it in the log); ``partition_values`` as the log
    serializes them."""

    path: str
    size: int
    partition_values: tuple[tuple[str, str | None], ...]
    modification_time: int
    num_rows: int
    stats: str

    def add_action(self) -> Any:
        """The delta-rs ``AddAction`` of this file (data change)."""
        from deltalake.transaction import AddAction

        return AddAction(self.path, self.size, dict(self.partition_values), self.modification_time, True, self.stats)


# ---------------------------------------------------------------------------------- schema
def _norm(t: pa.DataType) -> Any:
    """A type up to what a Delta table does not tell apart (string flavours, list field names)."""
    if pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return pa.string()
    if pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return pa.binary()
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_list_view(t):
        return ("list", _norm(t.value_type))
    if pa.types.is_map(t):
        return ("map", _norm(t.key_type), _norm(t.item_type))
    if pa.types.is_struct(t):
        return ("struct", tuple((f.name, _norm(f.type)) for f in t))
    return t


def _stored_as_is(t: pa.DataType) -> bool:
    """False for a timestamp Delta stores converted (it keeps microseconds, in UTC or without a
    zone), anywhere in ``t``."""
    if pa.types.is_timestamp(t):
        return bool(t.unit == "us" and t.tz in (None, "UTC"))
    return all(_stored_as_is(t.field(i).type) for i in range(t.num_fields))


def direct_schema(schema: pa.Schema, partition_by: Sequence[str]) -> bool:
    """Whether rows of ``schema`` can be written as Parquet files as they are: every type is one
    a Delta table stores exactly (no conversion delta-rs would make: nanosecond or zoned
    timestamps, unsigned integers...), and each partition column is a string, integer, boolean
    or date. Called once per batch share; no I/O."""
    from deltalake import Schema as DeltaSchema

    if any(name not in schema.names for name in partition_by) or len(partition_by) >= len(schema):
        return False
    for name in partition_by:
        if not any(check(schema.field(name).type) for check in _PARTITION_TYPES):
            return False
    try:
        back = pa.schema(DeltaSchema.from_arrow(schema).to_arrow())
    except Exception:  # a type Delta has no counterpart for: the staged path reports it
        return False
    if back.names != schema.names:
        return False
    return all(_norm(a.type) == _norm(b.type) and _stored_as_is(a.type) for a, b in zip(schema, back, strict=True))


# ---------------------------------------------------------------------------------- stats
def _leaf_paths(schema: pa.Schema) -> list[tuple[tuple[str, ...], pa.DataType]]:
    out: list[tuple[tuple[str, ...], pa.DataType]] = []

    def walk(prefix: tuple[str, ...], t: pa.DataType) -> None:
        if pa.types.is_struct(t):
            for f in t:
                walk((*prefix, f.name), f.type)
        else:
            out.append((prefix, t))

    for f in schema:
        walk((f.name,), f.type)
    return out


def _stat_value(v: Any, t: pa.DataType, *, upper: bool, raw: dict[str, str]) -> Any:
    """A Parquet statistic as delta-rs writes it into the stats JSON, or None (no statistic).
    Timestamps have millisecond precision there: a maximum is rounded up, never down. A decimal
    is written as its exact digits (through a token in ``raw`` replaced after serialization)."""
    if v is None:
        return None
    if isinstance(v, bool | int | str):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, decimal.Decimal):
        if not v.is_finite():
            return None
        token = f"\x00{uuid.uuid4().hex}"
        raw[token] = str(v)
        return token
    if isinstance(v, dt.datetime):
        if upper and v.microsecond % 1000:
            v = v + dt.timedelta(microseconds=1000 - v.microsecond % 1000)
        ms = v.microsecond // 1000
        frac = f".{ms:03d}" if ms else ""
        if t.tz is not None:
            return v.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S") + frac + "Z"
        return v.strftime("%Y-%m-%d %H:%M:%S") + frac
    if isinstance(v, dt.date):
        return v.isoformat()
    return None


def _put(target: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    for p in path[:-1]:
        target = target.setdefault(p, {})
    target[path[-1]] = value


def _no_stats(t: pa.DataType) -> bool:
    """Types delta-rs records no statistics for: lists, maps, binaries."""
    return bool(pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_list_view(t)
                or pa.types.is_map(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t)
                or pa.types.is_binary_view(t) or pa.types.is_fixed_size_binary(t))  # fmt: skip


def file_stats(meta: pq.FileMetaData, schema: pa.Schema, layout: Layout) -> str:
    """The add action's ``stats`` of a written file (``meta``: its Parquet footer, ``schema``: the
    file's Arrow schema), as delta-rs writes them: per leaf column with statistics the minimum,
    maximum (none for all-null or NaN-only columns) and null count; none for lists, maps and
    binaries. Called once per finished file, on the writer's thread."""
    leaves = _leaf_paths(schema)
    if layout.stats_columns is not None:
        wanted = set(layout.stats_columns)
        leaves = [(p, t) for p, t in leaves if ".".join(p) in wanted or p[0] in wanted]
    else:
        leaves = leaves[: layout.indexed_columns]
    groups = [meta.row_group(g) for g in range(meta.num_row_groups)]
    index = {groups[0].column(i).path_in_schema: i for i in range(meta.num_columns)} if groups else {}
    mins: dict[str, Any] = {}
    maxs: dict[str, Any] = {}
    nulls: dict[str, Any] = {}
    raw: dict[str, str] = {}
    for path, t in leaves:
        col = index.get(".".join(path))
        if col is None or _no_stats(t):
            continue
        lo: Any = None
        hi: Any = None
        null_count = 0
        complete = True
        try:
            for g in groups:
                s = g.column(col).statistics
                if s is None or s.null_count is None:
                    complete = False
                    break
                null_count += s.null_count
                if s.has_min_max:
                    lo = s.min if lo is None or s.min < lo else lo
                    hi = s.max if hi is None or s.max > hi else hi
                elif s.num_values:  # values without bounds (NaN only): no bounds for the file
                    complete = False
                    break
            low, high = _stat_value(lo, t, upper=False, raw=raw), _stat_value(hi, t, upper=True, raw=raw)
        except (ValueError, OverflowError, ArithmeticError) as e:  # a bound Python cannot hold (year 10000)
            log.debug("delta: no statistics for column %s: %s", ".".join(path), e)
            continue
        if not complete:
            continue
        _put(nulls, path, null_count)
        if low is not None and high is not None:
            _put(mins, path, low)
            _put(maxs, path, high)
    text = json.dumps({"numRecords": meta.num_rows, "minValues": mins, "maxValues": maxs, "nullCount": nulls},
                      separators=(",", ":"))  # fmt: skip
    for token, digits in raw.items():
        text = text.replace(json.dumps(token), digits)
    return text


# ---------------------------------------------------------------------------------- writing
def partition_text(v: Any) -> str | None:
    """A partition value as the log serializes it (null and the empty string: null)."""
    if v is None:
        return None
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, dt.date):
        return v.isoformat()
    text = str(v)
    return text or None


class _OpenFile:
    def __init__(self, loc: TableLocation, folder: str, schema: pa.Schema, number: int) -> None:
        name = f"part-{number:05d}-{uuid.uuid4()}-c000.snappy.parquet"
        self.rel = f"{folder}/{name}" if folder else name
        self.loc = loc
        if loc.is_local:
            os.makedirs(os.path.dirname(loc.path(self.rel)), exist_ok=True)
        self.stream = loc.fs().open_output_stream(loc.path(self.rel))
        self.writer = pq.ParquetWriter(self.stream, schema, compression="snappy", write_statistics=True,
                                       store_schema=True, dictionary_pagesize_limit=DICTIONARY_PAGE_LIMIT)  # fmt: skip

    def size(self) -> int:
        return int(self.stream.tell())


class DataFileWriter:
    """Writes one batch share's rows as Parquet data files under a table's root.

    Made by ``DeltaSink.write`` once per share; ``add`` is called for each record batch on the
    caller's thread, which hands it to the writer's own thread (a bounded queue of
    ``QUEUE_DEPTH`` batches: memory stays a few batches); ``finish`` returns the finished
    files, ``discard`` deletes whatever was written. Files are named ``part-<n>-<uuid>``: a
    replay never writes over an earlier attempt's file.
    """

    QUEUE_DEPTH = 4

    def __init__(self, loc: TableLocation, schema: pa.Schema, layout: Layout, target_file_size: int | None) -> None:
        self.loc = loc
        self.schema = schema
        self.layout = layout
        self.target = int(target_file_size or DEFAULT_TARGET_FILE_SIZE)
        self.file_schema = pa.schema([f for f in schema if f.name not in layout.partition_by])
        self.files: list[DataFile] = []
        self._written: list[str] = []  # every file opened, finished or not (for discard)
        self._open: dict[tuple[Any, ...], _OpenFile] = {}
        self._buffers: dict[tuple[Any, ...], list[pa.Table]] = {}
        self._buffered: dict[tuple[Any, ...], int] = {}
        self._number = 0
        self._queue: queue.Queue[pa.RecordBatch | None] = queue.Queue(self.QUEUE_DEPTH)
        self._error: BaseException | None = None
        self._discarded = False
        self._thread = threading.Thread(target=self._run, name="headrace-delta-writer", daemon=True)
        self._thread.start()

    # ---------------------------------------------------------------- caller's thread
    def add(self, batch: pa.RecordBatch) -> None:
        """Queue ``batch`` for encoding (waits while ``QUEUE_DEPTH`` batches are queued); raises
        what failed the writer's thread."""
        if self._error is not None:
            raise self._error
        self._queue.put(batch)

    def finish(self) -> list[DataFile]:
        """Encode what is left, close every file and return them (in the order finished)."""
        self._queue.put(None)
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self.files

    def discard(self) -> None:
        """Stop the writer's thread and delete every file it opened. Best effort; idempotent."""
        self._discarded = True
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()
        for f in self._open.values():
            with contextlib.suppress(Exception):
                f.writer.close()
            with contextlib.suppress(Exception):
                f.stream.close()
        self._open.clear()
        delete_files(self.loc, self._written)
        self._written.clear()

    # ---------------------------------------------------------------- writer's thread
    def _run(self) -> None:
        # after a failure or a discard it keeps taking batches (dropping them) until the end
        # marker, so that the caller's put never waits on a queue nobody empties
        while True:
            item = self._queue.get()
            if item is None:
                break
            if self._error is None and not self._discarded:
                try:
                    self._take(item)
                except BaseException as e:  # handed to the caller's thread
                    self._error = e
        if self._error is None and not self._discarded:
            try:
                for key in list(self._buffers):
                    self._flush(key)
                for key in list(self._open):
                    self._close(key)
            except BaseException as e:
                self._error = e

    def _take(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        table = pa.Table.from_batches([batch])
        if not self.layout.partition_by:
            self._buffer((), table)
            return
        cols = list(self.layout.partition_by)
        order = pc.sort_indices(table.select(cols), sort_keys=[(c, "ascending", "at_end") for c in cols])
        table = table.take(order)
        groups = table.select(cols).group_by(cols, use_threads=False).aggregate([([], "count_all")])
        start = 0
        keys = groups.select(cols).to_pylist()
        for key, n in zip(keys, groups.column("count_all").to_pylist(), strict=True):
            self._buffer(tuple(key[c] for c in cols), table.slice(start, n))
            start += n

    def _buffer(self, key: tuple[Any, ...], table: pa.Table) -> None:
        self._buffers.setdefault(key, []).append(table.drop_columns(list(self.layout.partition_by)))
        self._buffered[key] = self._buffered.get(key, 0) + table.num_rows
        if self._buffered[key] >= ROW_GROUP_ROWS:
            self._flush(key)

    def _flush(self, key: tuple[Any, ...]) -> None:
        parts = self._buffers.pop(key, [])
        self._buffered.pop(key, None)
        if not parts:
            return
        data = pa.concat_tables(parts)
        if data.schema != self.file_schema:
            data = data.cast(self.file_schema)
        f = self._open.get(key)
        if f is None:
            folder = "/".join(f"{quote(c, safe='')}={_escape(partition_text(v))}" for c, v in zip(self.layout.partition_by, key, strict=True))
            f = self._open[key] = _OpenFile(self.loc, folder, self.file_schema, self._number)
            self._number += 1
            self._written.append(f.rel)
        f.writer.write_table(data, row_group_size=max(data.num_rows, 1))
        if f.size() >= self.target:
            self._close(key)

    def _close(self, key: tuple[Any, ...]) -> None:
        f = self._open.pop(key)
        f.writer.close()
        size = f.size()
        f.stream.close()
        meta = f.writer.writer.metadata  # the footer just written
        values = tuple((c, partition_text(v)) for c, v in zip(self.layout.partition_by, key, strict=True))
        self.files.append(DataFile(f.rel, size, values, int(time.time() * 1000), meta.num_rows,
                                   file_stats(meta, self.file_schema, self.layout)))  # fmt: skip


def _escape(text: str | None) -> str:
    """A partition value as a folder name (Hive's null folder; everything else percent-encoded)."""
    return HIVE_NULL if text is None else quote(text, safe="")


def delete_files(loc: TableLocation, rels: Sequence[str]) -> None:
    """Delete data files (paths relative to the root, not URL-encoded). Best effort."""
    fs = loc.fs()
    for rel in rels:
        try:
            fs.delete_file(loc.path(rel))
        except Exception as e:  # gone already, or the store refuses: VACUUM removes it later
            log.debug("delta: deleting unreferenced data file %s failed: %s", rel, e)


def read_back(loc: TableLocation, files: Sequence[DataFile], schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """The rows of ``files`` (written with ``schema``'s columns minus the partition columns) as
    record batches of ``schema``, the partition columns restored from the files' values. For the
    commit that cannot add the files as they are (a schema change, a new layout)."""
    for f in files:
        values = dict(f.partition_values)
        table = pq.read_table(loc.fs().open_input_file(loc.path(f.path)))
        cols = []
        for field in schema:
            if field.name in values:
                v = parse_partition_value(values[field.name], field.type)
                cols.append(pa.array([v] * table.num_rows, field.type))
            else:
                cols.append(table.column(field.name).cast(field.type))
        yield from pa.Table.from_arrays(cols, schema=schema).to_batches()
