"""Inferring the data columns of a stream from a sample of its files (``cloudFiles`` schema inference).

``infer_data_schema`` is called once per stream, on the driver, when no schema is stored under
``schemaLocation`` yet; it reads a bounded part of each sampled file (``read_prefix``,
``inference_bytes``) and merges the columns found (``merge_fields``, also used by schema evolution).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from headrace_cloudfiles.conform import _infer_type
from headrace_cloudfiles.parsing import (
    CorruptFileError,
    Parsed,
    ReaderConfig,
    _parse_avro,
    _parse_csv,
    _parse_json,
    parse_file,
)
from headrace_cloudfiles.storage import Store

__all__ = ["infer_data_schema", "inference_bytes", "merge_fields", "read_prefix"]

log = logging.getLogger(__name__)



def _widen(a: pa.DataType, b: pa.DataType) -> pa.DataType:
    if a == b or pa.types.is_null(b):
        return a
    if pa.types.is_null(a):
        return b
    try:
        return pa.unify_schemas([pa.schema([("x", a)]), pa.schema([("x", b)])], promote_options="permissive").field(0).type
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        return pa.string()


def merge_fields(base: Sequence[pa.Field], more: Sequence[pa.Field]) -> list[pa.Field]:
    """``base`` then the fields of ``more`` it lacks; a name in both gets the wider type
    (string when they do not unify)."""
    out = {f.name: f for f in base}
    for f in more:
        out[f.name] = f if f.name not in out else pa.field(f.name, _widen(out[f.name].type, f.type))
    return list(out.values())


def _fields_of(parsed: Parsed) -> list[pa.Field]:
    if parsed.table is not None:
        return list(parsed.table.schema)
    rows = [r for r in parsed.rows or () if r is not None]
    names: dict[str, None] = {}
    for r in rows:
        names.update(dict.fromkeys(r))
    return [pa.field(n, _infer_type([r.get(n) for r in rows])) for n in names]


def _prefix_format(cfg: ReaderConfig) -> bool:
    return cfg.key == "csv" or (cfg.key == "json" and not cfg.multiline)


def inference_bytes(cfg: ReaderConfig, size: int, prefix_bytes: int) -> int:
    """About how many bytes schema inference reads from a file of ``size`` bytes (what
    ``schemaInference.sampleSize.numBytes`` bounds): a prefix of json lines, csv and avro files
    and the footer of parquet files; multiLine json is read whole."""
    if cfg.key == "json" and cfg.multiline:
        return size
    return min(size, prefix_bytes)


def read_prefix(store: Store, rel: str, limit: int) -> tuple[bytes, bool]:
    """The first ``limit`` (decompressed) bytes of a file, cut after its last complete line, and
    whether that is the whole file. A first line longer than ``limit`` is read to its end."""
    with store.open_stream(rel) as f:
        data = bytes(f.read(limit))
        if len(data) < limit or not f.read(1):
            return data, True
        cut = max(data.rfind(b"\n"), data.rfind(b"\r"))
        if cut >= 0:
            return data[: cut + 1], False
        chunks = [data]
        while True:  # no line end yet: read on to the end of the first line
            more = bytes(f.read(limit))
            if not more:
                return b"".join(chunks), True
            ends = [i for i in (more.find(b"\n"), more.find(b"\r")) if i >= 0]
            if ends:
                chunks.append(more[: min(ends) + 1])
                return b"".join(chunks), False
            chunks.append(more)


def _parquet_fields(store: Store, rel: str) -> list[pa.Field]:
    try:
        with store.open(rel, decompress=False) as f:
            return list(pq.read_schema(f))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError) as e:
        if isinstance(e, FileNotFoundError):
            raise
        raise CorruptFileError(f"{store.uri(rel)} is not a readable Parquet file ({e})") from e


def _sample_fields(
    store: Store, rel: str, size: int, mtime: int, cfg: ReaderConfig, prefix_bytes: int | None
) -> list[pa.Field]:
    k = cfg.key
    if prefix_bytes is None or size == 0:
        return _fields_of(parse_file(store, rel, size, mtime, cfg, None))
    if k == "parquet":
        return _parquet_fields(store, rel)
    if k == "avro":
        return _fields_of(_parse_avro(store, rel, prefix_bytes))
    if not _prefix_format(cfg):
        return _fields_of(parse_file(store, rel, size, mtime, cfg, None))
    data, whole = read_prefix(store, rel, prefix_bytes)
    parse = _parse_json if k == "json" else _parse_csv
    try:
        return _fields_of(parse(store, rel, len(data), cfg, None, data))
    except CorruptFileError:
        if whole:
            raise
        # e.g. a quoted csv value with line breaks cut by the prefix: read the whole file
        return _fields_of(parse_file(store, rel, size, mtime, cfg, None))


def infer_data_schema(
    store: Store,
    files: Sequence[tuple[str, int, int]],
    cfg: ReaderConfig,
    *,
    ignore_corrupt: bool,
    prefix_bytes: int | None = None,
) -> pa.Schema:
    """The data columns of a sample of ``(rel, size, mtime_ms)`` files, merged in order.

    With ``prefix_bytes``, only a bounded part of each file is read: the first ``prefix_bytes``
    of json lines and csv files cut at a line end, the blocks of avro files starting in them, the
    footer of parquet files (multiLine json is read whole). Columns that first appear later in a
    file are then found by schema evolution (or rescued). json and csv columns are strings unless
    ``cfg.typed``; all-null columns are strings.
    """
    fields: list[pa.Field] = []
    for rel, size, mtime in files:
        try:
            more = _sample_fields(store, rel, size, mtime, cfg, prefix_bytes)
        except FileNotFoundError:
            continue
        except CorruptFileError:
            if ignore_corrupt:
                continue
            raise
        fields = merge_fields(fields, more)
    out = []
    for f in fields:
        t = f.type
        if pa.types.is_null(t) or (cfg.key in ("json", "csv") and not cfg.typed) or pa.types.is_large_string(t):
            t = pa.string()
        out.append(pa.field(f.name, t))
    return pa.schema(out)
