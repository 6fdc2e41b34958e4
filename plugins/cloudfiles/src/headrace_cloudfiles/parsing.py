"""Reading one file of each format into Arrow.

json, csv and parquet use pyarrow's readers (multi-threaded C++); a json or csv file they
refuse (a malformed record, a value of another type) is read again record by record so that
the bad records are rescued instead of failing the file. text and binaryFile have fixed
schemas. avro uses fastavro, imported only when an avro file is read.

``parse_file`` is called once per file per batch, where a partition is read (a worker thread or
a pickled copy of the source); ``ReaderConfig`` is picklable and travels in every partition.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import re
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.json as pjson
import pyarrow.parquet as pq

from headrace.errors import HeadraceError
from headrace_cloudfiles.storage import Store

__all__ = [
    "BINARY_FILE_SCHEMA",
    "CorruptFileError",
    "Parsed",
    "ReaderConfig",
    "TEXT_SCHEMA",
    "fixed_schema",
    "parse_file",
]

log = logging.getLogger(__name__)

TEXT_SCHEMA = pa.schema([pa.field("value", pa.string())])
BINARY_FILE_SCHEMA = pa.schema(
    [
        pa.field("path", pa.string()),
        pa.field("modificationTime", pa.timestamp("us", tz="UTC")),
        pa.field("length", pa.int64()),
        pa.field("content", pa.binary()),
    ]
)
_LINES = re.compile(r"\r\n|\r|\n")


class CorruptFileError(HeadraceError):
    """A file could not be parsed at all (not a record-level problem)."""


@dataclass(frozen=True)
class ReaderConfig:
    """The format and its reader options. Picklable; part of every partition."""

    fmt: str
    typed: bool = False
    multiline: bool = False
    header: bool = False
    sep: str = ","
    quote: str = '"'
    escape: str = "\\"
    null_value: str = ""
    whole_text: bool = False

    @property
    def key(self) -> str:
        return self.fmt.lower()


@dataclass
class Parsed:
    """What a reader got from one file: an Arrow table in the file's types (fast path), or
    Python rows with, per row, the text of a malformed record (slow path); ``extra_malformed``
    are records the fast path skipped (appended after the table's rows)."""

    table: pa.Table | None = None
    rows: list[dict[str, Any] | None] | None = None
    malformed: list[str | None] | None = None
    extra_malformed: list[str] = field(default_factory=list)


def fixed_schema(fmt: str) -> pa.Schema | None:
    """The schema of formats that have one (text, binaryFile), else None."""
    return {"text": TEXT_SCHEMA, "binaryfile": BINARY_FILE_SCHEMA}.get(fmt.lower())


def _block_size(size: int) -> int:
    return max(1 << 20, min(size + 1, 1 << 26))


def _read_all(store: Store, rel: str) -> bytes:
    with store.open(rel) as f:
        return bytes(f.read())


def _decode(data: bytes, uri: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CorruptFileError(f"{uri} is not UTF-8 text ({e})") from e


# ---------------------------------------------------------------------------------- json


def _json_rows(text: str, multiline: bool) -> tuple[list[dict[str, Any] | None], list[str | None]]:
    rows: list[dict[str, Any] | None] = []
    bad: list[str | None] = []
    if multiline:
        try:
            doc = json.loads(text)
        except json.JSONDecodeError:
            return [None], [text]
        items = doc if isinstance(doc, list) else [doc]
        for item in items:
            ok = isinstance(item, dict)
            rows.append(item if ok else None)
            bad.append(None if ok else json.dumps(item))
        return rows, bad
    for line in _LINES.split(text):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            rec = None
        if isinstance(rec, dict):
            rows.append(rec)
            bad.append(None)
        else:
            rows.append(None)
            bad.append(line)
    return rows, bad


def _open(store: Store, rel: str, data: bytes | None) -> pa.NativeFile:
    return store.open(rel) if data is None else pa.BufferReader(data)


def _parse_json(
    store: Store, rel: str, size: int, cfg: ReaderConfig, schema: pa.Schema | None, data: bytes | None = None
) -> Parsed:
    if data is not None:
        size = len(data)
    if not cfg.multiline:
        try:
            with _open(store, rel, data) as f:
                ro = pjson.ReadOptions(block_size=_block_size(size))
                if schema is not None and cfg.typed:
                    po = pjson.ParseOptions(explicit_schema=schema, unexpected_field_behavior="infer")
                    return Parsed(table=pjson.read_json(f, read_options=ro, parse_options=po))
                return Parsed(table=pjson.read_json(f, read_options=ro))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
            pass  # a malformed record or mixed types: read record by record below
    raw = _read_all(store, rel) if data is None else data
    rows, bad = _json_rows(_decode(raw, store.uri(rel)), cfg.multiline)
    return Parsed(rows=rows, malformed=bad)


# ---------------------------------------------------------------------------------- csv


def _parse_csv(
    store: Store, rel: str, size: int, cfg: ReaderConfig, schema: pa.Schema | None, data: bytes | None = None
) -> Parsed:
    if data is not None:
        size = len(data)
    bad: list[str] = []

    def on_invalid(row: Any) -> str:
        bad.append(str(row.text))
        return "skip"

    def read(types: dict[str, pa.DataType] | None) -> pa.Table:
        bad.clear()
        ro = pcsv.ReadOptions(autogenerate_column_names=not cfg.header, block_size=_block_size(size))
        po = pcsv.ParseOptions(
            delimiter=cfg.sep,
            quote_char=cfg.quote or False,
            escape_char=cfg.escape or False,
            double_quote=True,
            newlines_in_values=bool(cfg.quote),
            invalid_row_handler=on_invalid,
        )
        co = pcsv.ConvertOptions(
            column_types=types, null_values=[cfg.null_value], strings_can_be_null=True, quoted_strings_can_be_null=False
        )
        with _open(store, rel, data) as f:
            try:
                t = pcsv.read_csv(f, read_options=ro, parse_options=po, convert_options=co)
            except pa.ArrowInvalid as e:
                if "Empty CSV file" in str(e):
                    return pa.table({})
                raise
        if not cfg.header:
            t = t.rename_columns([f"_c{i}" for i in range(t.num_columns)])
        return t

    def names(types: dict[str, pa.DataType]) -> dict[str, pa.DataType]:
        if cfg.header:
            return types
        return {f"f{k[2:]}": v for k, v in types.items() if k.startswith("_c") and k[2:].isdigit()}

    strings = {f.name: pa.string() for f in schema} if schema is not None else {}
    try:
        if schema is not None and cfg.typed:
            try:
                return Parsed(table=read(names({f.name: f.type for f in schema})), extra_malformed=list(bad))
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                pass  # a value of another type: read as strings, cast column by column (rescuing)
        table = read(names(strings) if strings or not cfg.typed else None)
        if not cfg.typed:
            table = table.cast(pa.schema([pa.field(n, pa.string()) for n in table.column_names]))
        return Parsed(table=table, extra_malformed=list(bad))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, UnicodeDecodeError) as e:
        raise CorruptFileError(f"{store.uri(rel)} is not readable CSV ({e})") from e


# ---------------------------------------------------------------------------------- others


def _parse_parquet(store: Store, rel: str) -> Parsed:
    try:
        with store.open(rel, decompress=False) as f:
            return Parsed(table=pq.read_table(f))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError) as e:
        if isinstance(e, FileNotFoundError):
            raise
        raise CorruptFileError(f"{store.uri(rel)} is not a readable Parquet file ({e})") from e


class _Counting:
    """A file-like reader that counts the bytes read (avro inference stops after a prefix)."""

    def __init__(self, f: pa.NativeFile) -> None:
        self.f = f
        self.n = 0

    def read(self, n: int = -1) -> bytes:
        b = self.f.read() if n is None or n < 0 else self.f.read(n)
        self.n += len(b)
        return bytes(b)


def _parse_avro(store: Store, rel: str, limit: int | None = None) -> Parsed:
    """Every record, or (``limit``) the records of the blocks that start in the first ``limit``
    bytes (schema inference: the header and a few blocks are read, not the whole file)."""
    try:
        import fastavro
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise HeadraceError("cloudFiles.format=avro needs fastavro; fix: pip install 'headrace-cloudfiles[avro]'") from e
    import io

    try:
        if limit is None:
            rows: list[dict[str, Any] | None] = [dict(r) for r in fastavro.reader(io.BytesIO(_read_all(store, rel)))]  # type: ignore[arg-type]
        else:
            rows = []
            with store.open_stream(rel) as f:
                counting = _Counting(f)
                for r in fastavro.reader(counting):  # type: ignore[arg-type]
                    rows.append(dict(r))  # type: ignore[arg-type]
                    if counting.n >= limit:
                        break
    except FileNotFoundError:
        raise
    except Exception as e:
        raise CorruptFileError(f"{store.uri(rel)} is not a readable Avro file ({type(e).__name__}: {e})") from e
    return Parsed(rows=rows, malformed=[None] * len(rows))


def _parse_text(store: Store, rel: str, cfg: ReaderConfig) -> Parsed:
    text = _decode(_read_all(store, rel), store.uri(rel))
    if cfg.whole_text:
        lines = [text]
    else:
        lines = _LINES.split(text)
        if lines and lines[-1] == "":
            lines.pop()
    return Parsed(table=pa.table({"value": pa.array(lines, pa.string())}))


def _parse_binary(store: Store, rel: str, mtime_ms: int) -> Parsed:
    data = _read_all_raw(store, rel)
    return Parsed(
        table=pa.Table.from_pydict(
            {
                "path": [store.uri(rel)],
                "modificationTime": [dt.datetime.fromtimestamp(mtime_ms / 1000, tz=dt.UTC)],
                "length": [len(data)],
                "content": [data],
            },
            schema=BINARY_FILE_SCHEMA,
        )
    )


def _read_all_raw(store: Store, rel: str) -> bytes:
    with store.open(rel, decompress=False) as f:
        return bytes(f.read())


def parse_file(store: Store, rel: str, size: int, mtime_ms: int, cfg: ReaderConfig, schema: pa.Schema | None) -> Parsed:
    """Read one file. ``schema`` (data columns) lets typed readers parse straight into it.

    Raises FileNotFoundError when the file is gone and :class:`CorruptFileError` when it
    cannot be parsed at all; record-level problems come back as malformed rows.
    """
    k = cfg.key
    if size == 0 and k not in ("binaryfile", "text"):
        return Parsed(table=pa.table({}))
    if k == "json":
        return _parse_json(store, rel, size, cfg, schema)
    if k == "csv":
        return _parse_csv(store, rel, size, cfg, schema)
    if k == "parquet":
        return _parse_parquet(store, rel)
    if k == "avro":
        return _parse_avro(store, rel)
    if k == "text":
        return _parse_text(store, rel, cfg)
    if k == "binaryfile":
        return _parse_binary(store, rel, mtime_ms)
    raise HeadraceError(f"cloudFiles.format {cfg.fmt!r} is not supported")

