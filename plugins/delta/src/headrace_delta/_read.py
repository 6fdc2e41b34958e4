"""Reading one data file (or one version's change feed) as Arrow batches with the table schema.

Honours partition values (from the log, not the folder names), column mapping (physical
column names in the Parquet files), deletion vectors (rows removed by the selection vector),
schema evolution (columns missing from old files are null), and the event-time range of a
batch of the initial snapshot.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from headrace.helpers.dataloss import DataLossPolicy
from headrace.helpers.storage import is_not_found
from headrace.protocols import Partition
from headrace_delta._schema import PHYSICAL_NAME
from headrace_delta._storage import TableLocation

__all__ = [
    "CDF_COLUMNS",
    "CdfTask",
    "DeltaPartition",
    "FileTask",
    "arrow_table",
    "conform",
    "event_keys",
    "read_cdf_version",
    "read_file",
]

log = logging.getLogger(__name__)

CDF_COLUMNS = pa.schema(
    [
        pa.field("_change_type", pa.string()),
        pa.field("_commit_version", pa.int64()),
        pa.field("_commit_timestamp", pa.timestamp("us", tz="UTC")),
    ]
)


@dataclass(frozen=True)
class FileTask:
    """One data file of a batch. ``deleted_rows`` are the row positions a deletion vector
    removes (sorted). ``event_range`` is ``(lo, hi)`` on the event-time key (None = open).
    ``change`` is ``(change_type, version, timestamp_ms)`` for change-feed rows of a snapshot."""

    path: str
    partition_values: tuple[tuple[str, Any], ...] = ()
    version: int = 0
    deleted_rows: tuple[int, ...] = ()
    event_range: tuple[Any, Any] | None = None
    change: tuple[str, int, int] | None = None


@dataclass(frozen=True)
class CdfTask:
    """The change feed of one commit, read through delta-rs."""

    version: int


@dataclass(frozen=True)
class DeltaPartition(Partition):
    """Part of a batch: files (and change-feed versions) read in order. Picklable."""

    items: tuple[FileTask | CdfTask, ...] = field(default=())


def arrow_table(data: Any) -> pa.Table:
    """A pyarrow Table of what delta-rs returns (an arro3 table or reader, through the Arrow C
    stream interface). Not ``pa.table(data)``: for an object it does not know, that first asks
    whether it is a pandas DataFrame, which imports pandas (about 0.25 s of every query start)."""
    if isinstance(data, pa.Table):
        return data
    return pa.RecordBatchReader.from_stream(data).read_all()


def event_keys(arr: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """Event-time values as sortable numbers: timestamps in microseconds, dates in days."""
    t = arr.type
    if pa.types.is_timestamp(t):
        return arr.cast(pa.timestamp("us", tz=t.tz)).cast(pa.int64())
    if pa.types.is_date(t):
        return arr.cast(pa.date32()).cast(pa.int32()).cast(pa.int64())
    if pa.types.is_integer(t):
        return arr.cast(pa.int64())
    if pa.types.is_floating(t) or pa.types.is_decimal(t):
        return arr.cast(pa.float64())
    raise ValueError(f"event-time column of type {t} cannot be ordered; use a timestamp, date or number column")


def _physical(f: pa.Field) -> str:
    meta = f.metadata or {}
    return meta.get(PHYSICAL_NAME.encode(), f.name.encode()).decode()


def conform(arr: pa.Array | pa.ChunkedArray, target: pa.Field) -> pa.Array | pa.ChunkedArray:
    """``arr`` with ``target``'s type: struct children matched by physical name, then cast."""
    t = target.type
    if pa.types.is_struct(t) and pa.types.is_struct(arr.type):
        if isinstance(arr, pa.ChunkedArray):
            arr = arr.combine_chunks()
        assert isinstance(arr, pa.StructArray)
        names = [arr.type.field(i).name for i in range(arr.type.num_fields)]
        children = []
        for child in t:
            phys = _physical(child)
            name = phys if phys in names else child.name
            if name in names:
                children.append(conform(arr.field(names.index(name)), child))
            else:
                children.append(pa.nulls(len(arr), child.type))
        plain = pa.struct([pa.field(c.name, c.type, nullable=c.nullable) for c in t])
        return pa.StructArray.from_arrays(children, fields=list(plain), mask=arr.is_null())
    if arr.type != t:
        return arr.cast(t)
    return arr


def _constant(value: Any, t: pa.DataType, n: int) -> pa.Array:
    if value is None:
        return pa.nulls(n, t)
    one = pa.array([value], type=t)
    return one.take(pa.array([0] * n, type=pa.int32())) if n else one.slice(0, 0)


def _dv_mask(deleted: Sequence[int], offset: int, n: int) -> pa.Array | None:
    lo = bisect.bisect_left(deleted, offset)
    hi = bisect.bisect_left(deleted, offset + n)
    if lo == hi:
        return None
    mask = [True] * n
    for i in deleted[lo:hi]:
        mask[i - offset] = False
    return pa.array(mask, type=pa.bool_())


def read_file(
    loc: TableLocation,
    task: FileTask,
    schema: pa.Schema,
    *,
    out_schema: pa.Schema,
    event_column: str | None,
    fail_on_data_loss: bool,
) -> Iterator[pa.RecordBatch]:
    """Yield the rows of one data file as batches of ``out_schema``.

    ``schema`` is the table's Arrow schema with column-mapping metadata; ``out_schema`` is what
    rows are emitted with (``schema`` without metadata, plus change-feed columns if asked).
    """
    path = loc.data_path(task.path)
    try:
        # INT96 timestamps (written by Spark) at microseconds, as Spark reads them: the default
        # nanoseconds cannot hold years before 1677 or after 2262 (9999-12-31 wraps around)
        pf = pq.ParquetFile(path if loc.is_local else loc.open_data(path), pre_buffer=True,
                            coerce_int96_timestamp_unit="us")  # fmt: skip
    except FileNotFoundError as e:
        _lost(loc, task, fail_on_data_loss, e)
        return
    except OSError as e:
        if "not found" in str(e).lower() or "no such file" in str(e).lower():
            _lost(loc, task, fail_on_data_loss, e)
            return
        raise
    pvs = dict(task.partition_values)
    file_names = set(pf.schema_arrow.names)
    wanted = [f for f in schema if f.name not in pvs]
    columns = [_physical(f) if _physical(f) in file_names else f.name for f in wanted]
    columns = [c for c in columns if c in file_names]
    offset = 0
    lo, hi = task.event_range if task.event_range is not None else (None, None)
    for rg in range(pf.num_row_groups):
        t = pf.read_row_group(rg, columns=columns)
        n = t.num_rows
        mask = _dv_mask(task.deleted_rows, offset, n) if task.deleted_rows else None
        offset += n
        if mask is not None:
            t = t.filter(mask)
            n = t.num_rows
        arrays: list[pa.Array | pa.ChunkedArray] = []
        for f in schema:
            if f.name in pvs:
                arrays.append(_constant(pvs[f.name], f.type, n))
                continue
            phys = _physical(f)
            name = phys if phys in t.column_names else f.name
            if name in t.column_names:
                arrays.append(conform(t.column(name), f))
            else:
                arrays.append(pa.nulls(n, f.type))
        if task.change is not None:
            ctype, version, ts_ms = task.change
            arrays.append(_constant(ctype, pa.string(), n))
            arrays.append(_constant(version, pa.int64(), n))
            arrays.append(_constant(ts_ms * 1000, pa.int64(), n).cast(pa.timestamp("us", tz="UTC")))
        out = pa.Table.from_arrays(arrays, schema=out_schema)
        if task.event_range is not None and event_column is not None:
            out = _filter_event_range(out, event_column, lo, hi)
        if out.num_rows:
            yield from out.to_batches()


def _filter_event_range(t: pa.Table, column: str, lo: Any, hi: Any) -> pa.Table:
    keys = event_keys(t.column(column))
    cond = None
    if lo is not None:
        cond = pc.greater_equal(keys, lo)
    if hi is not None:
        c2 = pc.less(keys, hi)
        cond = c2 if cond is None else pc.and_(cond, c2)
        cond = pc.fill_null(cond, False)  # null event times belong to the last range
    elif cond is not None:
        cond = pc.or_kleene(cond, pc.is_null(keys))
    return t if cond is None else t.filter(cond)


def _lost(loc: TableLocation, task: FileTask, fail: bool, e: BaseException) -> None:
    DataLossPolicy(fail, "delta", fix="restart from a new checkpoint (optionally with startingVersion), or set "
                   "failOnDataLoss=false to skip missing files").lost(
        f"DELTA_FILE_NOT_FOUND_DETAILED: data file {task.path} of Delta table {loc.uri} (added in version "
        f"{task.version}) is missing; it was probably removed by VACUUM or by hand ({e})",
        skip="skipping it", cause=e,
    )  # fmt: skip


def read_cdf_version(
    loc: TableLocation, version: int, schema: pa.Schema, out_schema: pa.Schema, *, fail_on_data_loss: bool
) -> Iterator[pa.RecordBatch]:
    """The change feed of one commit, through delta-rs' ``load_cdf``, sorted deterministically:
    by change type first (deletes, pre-images, post-images, inserts: a commit without change data
    files reports a rewritten row as the delete of its old value and the insert of its new one,
    and the insert is what the commit left), then by every sortable column, so that the stream
    order of one key's events in a commit is the order in which they happened."""
    from deltalake import DeltaTable

    try:
        dt = DeltaTable(loc.uri, version=version, storage_options=loc.storage_options)
        table = arrow_table(dt.load_cdf(starting_version=version, ending_version=version))
    except Exception as e:
        if is_not_found(e):
            DataLossPolicy(fail_on_data_loss, "delta", fix="restart from a new checkpoint, or set failOnDataLoss=false "
                           "to skip it").lost(
                f"DELTA_FILE_NOT_FOUND_DETAILED: the change data of version {version} of Delta table {loc.uri} is "
                f"missing ({e})", skip="skipping it", cause=e,
            )  # fmt: skip
            return
        raise
    if table.num_rows == 0:
        return
    arrays = []
    for f in out_schema:
        if f.name in table.column_names:
            col = table.column(f.name)
            if f.name == "_commit_timestamp" and pa.types.is_timestamp(col.type) and col.type.tz is None:
                col = col.cast(pa.timestamp("us")).cast(pa.int64()).cast(f.type)
            elif f.name == "_change_type":
                col = col.cast(pa.string())
            else:
                src = schema.field(f.name) if f.name in schema.names else f
                col = conform(col, src) if src.type == f.type else col.cast(f.type)
            arrays.append(col)
        else:
            arrays.append(pa.nulls(table.num_rows, f.type))
    out = pa.Table.from_arrays(arrays, schema=out_schema)
    sortable = [
        n for n in out.column_names
        if not (pa.types.is_nested(out.schema.field(n).type) or pa.types.is_binary(out.schema.field(n).type))
    ]  # fmt: skip
    if "_change_type" in out.column_names:
        import pyarrow.compute as pc

        rank = pc.index_in(out.column("_change_type"), value_set=pa.array(_CHANGE_ORDER))
        ranked = out.append_column(_RANK, rank)
        out = out.take(pc.sort_indices(ranked, [(_RANK, "ascending"), *((n, "ascending") for n in sortable)]))
    else:
        out = out.sort_by([(n, "ascending") for n in sortable])
    yield from out.to_batches()


_RANK = "__headrace_change_rank"
_CHANGE_ORDER = ["delete", "update_preimage", "update_postimage", "insert"]
