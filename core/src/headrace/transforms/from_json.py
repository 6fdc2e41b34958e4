"""``FromJson``: decode a JSON column into typed columns, under the shared bad-record policy.

::

    from headrace.transforms.from_json import FromJson

    events = (hr.read_stream.format("kafka").options(...).load()
                .map_batches(FromJson("value", "id BIGINT, amount DOUBLE, ts TIMESTAMP",
                                      badRecordsPolicy="deadLetter", badRecordsPath="/data/dlq")))

A record whose text is not a JSON object, or whose fields do not convert to the schema's
types, is a bad record (``headrace.badrecords``): with ``badRecordsPolicy`` fail (the default)
the batch fails naming it; drop / deadLetter take it out of the rows, counted, or dead-lettered
exactly once with the batch, with its location — ``topic/partition@offset`` for Kafka rows,
``stream/shardId@sequenceNumber`` for Kinesis, ``messageId <id>`` for Pub/Sub — so the way a stream applies
a schema to the bytes of a message broker is this transform. Fields the schema lacks are
ignored; a missing field is null.
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from headrace.badrecords import BAD_RECORD_OPTIONS, BadRecord, BadRecords
from headrace.errors import HeadraceError

__all__ = ["FromJson"]

# columns that say where a row came from, by source (kafka, kinesis, pub/sub): the first set
# present names a bad record's location
_LOCATIONS = (("topic", "partition", "offset"), ("stream", "shardId", "sequenceNumber"), ("messageId",))


class FromJson:
    """A ``map_batches`` function: parse ``column`` (string or binary JSON) with ``schema`` (a
    ``pyarrow.Schema`` or DDL string) and append the fields as columns (``keep`` the source
    column or drop it). Bad-record options as keyword arguments (``badRecordsPolicy``,
    ``badRecordsPath``, ``badRecordsSink``, ``maxBadRecords``, ...), checked here.

    Called by the engine once per record batch, in the reading threads (thread-safe). The
    engine settles its bad records with the batch (its ``bad_records`` attribute).
    """

    def __init__(self, column: str, schema: pa.Schema | str, *, keep: bool = False, **options: Any) -> None:
        if isinstance(schema, str):
            from headrace.sql_types import ddl_to_schema

            schema = ddl_to_schema(schema)
        self.column = column
        self.schema = schema
        self.keep = keep
        opts = BAD_RECORD_OPTIONS.parse(options, connector="from_json", role="transform")
        self.bad_records = BadRecords.from_options(opts, what=f"from_json({column})") or BadRecords("fail", what=f"from_json({column})")

    def __repr__(self) -> str:
        return f"FromJson({self.column!r}, {self.schema.to_string(show_schema_metadata=False)!r}, policy={self.bad_records.policy})"

    def input_columns(self, needed: frozenset[str] | None) -> frozenset[str] | None:
        """The columns read to make ``needed`` (None: every column, then None): the JSON column,
        the columns that locate a bad record (``topic``/``partition``/``offset``, ...), and the
        needed ones this does not parse. Called once per query run at ``start()`` (the engine's
        ``Operator.input_columns``, so a source builds only these); pure."""
        if needed is None:
            return None
        parsed = frozenset(self.schema.names)
        return (needed - parsed) | {self.column} | {c for cols in _LOCATIONS for c in cols}

    def __call__(self, table: pa.Table) -> pa.Table:
        if self.column not in table.column_names:
            raise HeadraceError(
                f"from_json: the data has no column {self.column!r} (columns: {', '.join(table.column_names)}); "
                "give the column that holds the JSON text"
            )
        col = table.column(self.column)
        parsed = self._fast(col)
        if parsed is None:
            if pa.types.is_binary(col.type) or pa.types.is_large_binary(col.type):
                texts = [None if v is None else v.decode("utf-8", "replace") for v in col.to_pylist()]
            else:
                texts = col.to_pylist()
            parsed, keep = self._slow(table, texts)
            if not all(keep):
                mask = pa.array(keep)
                table = table.filter(mask)
        out = table if self.keep else table.drop_columns([self.column])
        for f in self.schema:
            if f.name in out.column_names:
                out = out.drop_columns([f.name])
            out = out.append_column(f, parsed.column(f.name))
        return out

    def _fast(self, col: pa.ChunkedArray) -> pa.Table | None:
        """Every record parses and converts: one pyarrow JSON read of the records' bytes
        joined by newlines (built by numpy from the column's buffers, no Python object per
        record); None otherwise (a NULL, blank or multi-line record, invalid UTF-8, a record
        that does not convert)."""
        from pyarrow import json as pj

        n = len(col)
        if not n or col.null_count:
            return None
        arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
        try:
            text = arr.cast(pa.large_string())  # checks UTF-8
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return None
        if not _all_start_with_brace(text) and pc.any(pc.equal(pc.utf8_length(pc.utf8_trim_whitespace(text)), 0)).as_py():
            return None  # a blank record
        data = _newline_joined(text)
        if _count_newlines(data) != n:  # a record holds a newline (each got exactly one appended)
            return None
        # one parse block (1 MiB) is parsed on one thread: pyarrow's pool only adds hand-offs then
        threads = data.size > _BLOCK
        try:
            got = pj.read_json(pa.BufferReader(data), read_options=pj.ReadOptions(use_threads=threads, block_size=_BLOCK),
                               parse_options=pj.ParseOptions(explicit_schema=self.schema,
                                                             unexpected_field_behavior="ignore"))  # fmt: skip
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
            return None
        if got.num_rows != n:
            return None
        return got.select(self.schema.names).cast(self.schema)

    def _slow(self, table: pa.Table, texts: list[Any]) -> tuple[pa.Table, list[bool]]:
        """Record by record: the good ones converted, the bad ones reported."""
        where = _locations(table)
        good: list[dict[str, Any]] = []
        keep: list[bool] = []
        bad: list[BadRecord] = []
        for i, text in enumerate(texts):
            if text is None:
                good.append({})
                keep.append(True)
                continue
            try:
                doc = json.loads(text)
            except json.JSONDecodeError as e:
                bad.append(BadRecord(where(i), f"malformed JSON ({e.msg} at {e.pos})", text))
                keep.append(False)
                continue
            if not isinstance(doc, dict):
                bad.append(BadRecord(where(i), f"not a JSON object but {type(doc).__name__}", text))
                keep.append(False)
                continue
            problem = self._convert_problem(doc)
            if problem:
                bad.append(BadRecord(where(i), problem, text))
                keep.append(False)
                continue
            good.append(doc)
            keep.append(True)
        self.bad_records.add(bad)  # raises for badRecordsPolicy=fail
        arrays = [pa.array([d.get(f.name) for d in good], f.type) for f in self.schema]
        return pa.Table.from_arrays(arrays, schema=self.schema), keep

    def _convert_problem(self, doc: dict[str, Any]) -> str | None:
        for f in self.schema:
            v = doc.get(f.name)
            if v is None:
                continue
            try:
                pa.array([v], f.type)
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
                try:  # JSON has no timestamps or decimals: strings that cast are fine
                    pc.cast(pa.array([v]), f.type)
                    doc[f.name] = pc.cast(pa.array([v]), f.type)[0].as_py()
                except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
                    return f"value does not convert: {f.name}={v!r} is not {f.type}"
        return None


def _locations(table: pa.Table) -> Any:
    names = set(table.column_names)
    for cols in _LOCATIONS:
        if set(cols) <= names:
            v = [table.column(c).to_pylist() for c in cols]
            if len(cols) == 3:  # topic/partition@offset, stream/shardId@sequenceNumber
                return lambda i: f"{v[0][i]}/{v[1][i]}@{v[2][i]}"
            return lambda i: f"messageId {v[0][i]}"
    return lambda i: f"row {i} of a batch"


_BLOCK = 1 << 20  # pyarrow.json's default block size


def _all_start_with_brace(text: pa.LargeStringArray) -> bool:
    """Every value's first byte is ``{`` (then none is blank): one gather over the offsets."""
    import numpy as np

    n = len(text)
    offsets = np.frombuffer(text.buffers()[1], np.int64)[text.offset : text.offset + n + 1]
    data = text.buffers()[2]
    if data is None or bool((offsets[1:] == offsets[:-1]).any()):
        return False
    first = np.frombuffer(data, np.uint8)[offsets[:-1]]
    return bool((first == ord("{")).all())


def _count_newlines(data: pa.Buffer) -> int:
    """How many newline bytes ``data`` holds (one vectorised pass, no copy of the data)."""
    import numpy as np

    return int(np.count_nonzero(np.frombuffer(data, np.uint8) == 10))


def _newline_joined(text: pa.LargeStringArray) -> pa.Buffer:
    """The values of ``text`` (no nulls) each followed by a newline, as one buffer: Arrow's
    ``binary_join_element_wise`` appends the newline to every value, and the result's data
    buffer is the joined text (no Python object per record)."""
    import numpy as np

    nl, empty = pa.scalar("\n", pa.large_string()), pa.scalar("", pa.large_string())
    joined = pc.binary_join_element_wise(text, nl, empty)
    n = len(joined)
    offsets = np.frombuffer(joined.buffers()[1], np.int64)[joined.offset : joined.offset + n + 1]
    data = joined.buffers()[2]
    assert data is not None
    return data[int(offsets[0]) : int(offsets[-1])]
