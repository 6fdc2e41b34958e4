"""In-process tables: ``memory`` source (fed by :func:`memory_stream`) and sink (read by
:func:`memory_table`). Both live only as long as the process: for tests, notebooks, demos."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa

from headrace.connectors.foreach import concat_or_empty, table_of
from headrace.errors import HeadraceError
from headrace.options import Options
from headrace.protocols import (
    CommitMessage,
    Offset,
    Partition,
    ReadLimit,
    Sink,
    SinkContext,
    Source,
    SourceContext,
)

__all__ = ["MemorySink", "MemorySource", "MemoryStream", "memory_stream", "memory_table"]

_lock = threading.Lock()
_streams: dict[str, MemoryStream] = {}
_tables: dict[str, dict[int, pa.Table]] = {}


class MemoryStream:
    """An append-only list of Arrow tables a ``memory`` source reads; one table per offset."""

    def __init__(self, name: str, schema: pa.Schema | None = None) -> None:
        self.name = name
        self.schema = schema
        self._tables: list[pa.Table] = []
        self._lock = threading.Lock()

    def add(self, data: pa.Table | pa.RecordBatch | list[dict[str, object]]) -> int:
        """Append rows; returns the offset after them."""
        if isinstance(data, list):
            data = pa.Table.from_pylist(data, schema=self.schema)
        elif isinstance(data, pa.RecordBatch):
            data = pa.Table.from_batches([data])
        with self._lock:
            if self.schema is None:
                self.schema = data.schema
            elif data.schema != self.schema:
                data = data.cast(self.schema)
            self._tables.append(data)
            return len(self._tables)

    def __len__(self) -> int:
        return len(self._tables)

    def slice(self, start: int, end: int) -> list[pa.Table]:
        with self._lock:
            return self._tables[start:end]


def memory_stream(name: str, schema: pa.Schema | None = None) -> MemoryStream:
    """The in-memory stream called ``name`` (created on first use)."""
    with _lock:
        s = _streams.get(name)
        if s is None:
            s = _streams[name] = MemoryStream(name, schema)
        return s


def memory_table(name: str) -> pa.Table:
    """Everything the ``memory`` sink of query ``name`` holds, in batch order."""
    with _lock:
        batches = _tables.get(name)
        if batches is None:
            raise HeadraceError(f"no memory table named {name!r}; known: {', '.join(sorted(_tables)) or 'none'}")
        tables = [batches[k] for k in sorted(batches)]
    if not tables:
        return pa.table({})
    return pa.concat_tables(tables, promote_options="default")


@dataclass(frozen=True)
class _Slice(Partition):
    name: str
    start: int
    end: int


class MemorySource(Source):
    """Reads a :class:`MemoryStream`. Offsets: ``{"index": number of tables}``."""

    reads_wait = False  # the tables are in this process

    def __init__(self, options: Options, context: SourceContext) -> None:
        super().__init__(options, context)
        self.stream = memory_stream(options["name"], context.user_schema)

    @property
    def schema(self) -> pa.Schema:
        if self.stream.schema is None:
            raise HeadraceError(
                f"memory stream {self.stream.name!r} has no schema yet: add data first, or give .schema(...)"
            )
        return self.stream.schema

    def initial_offset(self) -> Offset:
        return {"index": 0}

    def latest_offset(self, start: Offset, limit: ReadLimit) -> Offset:
        end = len(self.stream)
        if limit.max_files is not None:
            end = min(end, int(start["index"]) + limit.max_files)
        return {"index": max(int(start["index"]), end)}

    def partitions(self, start: Offset, end: Offset) -> Sequence[Partition]:
        a, b = int(start["index"]), int(end["index"])
        return [_Slice(self.stream.name, a, b)] if b > a else []

    def read(self, partition: Partition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, _Slice)
        for t in memory_stream(partition.name).slice(partition.start, partition.end):
            yield from t.to_batches()


@dataclass(frozen=True)
class _Rows(CommitMessage):
    table: pa.Table

    @property
    def num_rows(self) -> int:
        return int(self.table.num_rows)


class MemorySink(Sink):
    """Keeps each batch's rows by batch id (so a replayed batch replaces, never duplicates).

    ``complete`` mode keeps only the last batch."""

    idempotent_commit = True
    supports_real_time = True
    output_modes = ("append", "update", "complete")

    def __init__(self, options: Options, context: SinkContext) -> None:
        super().__init__(options, context)
        self.name: str = options["queryName"]
        if not self.name:
            raise HeadraceError("the memory sink needs a query name: .query_name('out')")
        with _lock:
            _tables.setdefault(self.name, {})

    def write(self, batch_id: int, data: Iterator[pa.RecordBatch]) -> CommitMessage:
        return _Rows(table_of(list(data), self.context.schema))

    def commit(self, batch_id: int, messages: Sequence[CommitMessage | None]) -> None:
        table = concat_or_empty([m.table for m in messages if isinstance(m, _Rows)], self.context.schema)
        with _lock:
            store = _tables.setdefault(self.name, {})
            if self.context.output_mode == "complete":
                store.clear()
            store[batch_id] = table
