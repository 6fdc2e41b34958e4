"""The ``sqlite`` source: rows of a SQLite table, read in the order of an increasing integer
key column, exactly once.

Offsets are ``{"next": k}``: every row with key < k is before the offset. A batch ``[start, end)``
is the rows with ``start <= key < end`` -- the start inclusive, the end exclusive -- split into
key ranges read in parallel. Reading the same range again gives the same rows (``replayable``),
as long as rows are only appended with growing keys.
"""

from __future__ import annotations

import itertools
import sqlite3
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa

from headrace.errors import HeadraceError
from headrace.options import Options
from headrace.protocols import Offset, Partition, ReadLimit, Source, SourceContext
from headrace_sqlite._options import KEY_COLUMN, NUM_PARTITIONS, PATH, TABLE

__all__ = ["KeyRange", "SqliteSource"]

_ARROW_TYPES = {"INTEGER": pa.int64(), "INT": pa.int64(), "REAL": pa.float64(), "TEXT": pa.string(), "BLOB": pa.binary()}
_CHUNK = 10_000


@dataclass(frozen=True)
class KeyRange(Partition):
    """Rows with ``lo <= key < hi``. Plain data, so it pickles (Spark ships it to executors)."""

    path: str
    table: str
    key: str
    lo: int
    hi: int


def _q(name: str) -> str:
    """A quoted SQL identifier."""
    return '"' + name.replace('"', '""') + '"'


def _connect(path: str) -> sqlite3.Connection:
    # read-only, and never create the file: a wrong path is an error, not an empty database
    return sqlite3.connect(f"file:{path}?mode=ro", uri=True, check_same_thread=False)


class SqliteSource(Source):
    """Reads a SQLite table incrementally by its integer key column. Exactly-once with an
    idempotent sink (``replayable``)."""

    replayable = True

    def __init__(self, options: Options, context: SourceContext) -> None:
        """Called once per query run, on the driver, with validated options. Connects, checks the
        table, reads its columns; reads no rows."""
        super().__init__(options, context)
        self.path = options[PATH]
        self.table = options[TABLE]
        self.key = options[KEY_COLUMN]
        self.num_partitions = options[NUM_PARTITIONS]
        self._cap: int | None = None
        self._conn: sqlite3.Connection | None = None
        try:
            self._conn = _connect(self.path)
            columns = self._conn.execute(f"PRAGMA table_info({_q(self.table)})").fetchall()
        except sqlite3.Error as e:
            raise HeadraceError(f"sqlite: cannot open {self.path}: {e}; fix: give the path of an existing SQLite file") from e
        if not columns:
            raise HeadraceError(f"sqlite: {self.path} has no table {self.table!r}; fix: create it or set the option table")
        types = {name: (decl or "").upper() for _, name, decl, *_ in columns}
        if types.get(self.key) not in ("INTEGER", "INT"):
            raise HeadraceError(f"sqlite: table {self.table!r} has no INTEGER column {self.key!r} (columns: "
                                f"{', '.join(types)}); fix: set keyColumn to its increasing integer key")  # fmt: skip
        self._schema = pa.schema([(n, _ARROW_TYPES.get(t, pa.string())) for n, t in types.items()])

    @property
    def schema(self) -> pa.Schema:
        """The table's columns as Arrow types. Called after construction, before the first batch."""
        return self._schema

    def initial_offset(self) -> Offset:
        """Before the first row. Called once, for a new checkpoint only."""
        return {"next": 0}

    def _driver(self) -> sqlite3.Connection:
        if self._conn is None:
            raise HeadraceError(f"sqlite: the source of {self.path} is closed")
        return self._conn

    def _max_key(self) -> int:
        row = self._driver().execute(f'SELECT max("{self.key}") FROM "{self.table}"').fetchone()
        return -1 if row[0] is None else int(row[0])

    def prepare_for_available_now(self) -> bool:
        """Called once for ``trigger(available_now=True)``: remember the last key present now and
        never go past it."""
        self._cap = self._max_key() + 1
        return True

    def latest_offset(self, start: Offset, limit: ReadLimit) -> Offset:
        """The end of the next batch: after the newest row (or the available-now cap), at most
        ``limit.max_rows`` rows after ``start``. Called once per trigger, on the driver."""
        begin = int(start["next"])
        end = self._max_key() + 1 if self._cap is None else self._cap
        if limit.max_rows is not None:
            row = self._driver().execute(
                f'SELECT "{self.key}" FROM "{self.table}" WHERE "{self.key}" >= ? ORDER BY "{self.key}" LIMIT 1 OFFSET ?',
                (begin, limit.max_rows),
            ).fetchone()
            if row is not None:
                end = min(end, int(row[0]))
        return {"next": max(begin, end)}

    def partitions(self, start: Offset, end: Offset) -> Sequence[Partition]:
        """``[start, end)`` split into up to ``numPartitions`` key ranges; ``[]`` when empty.
        Called once per batch, on the driver."""
        lo, hi = int(start["next"]), int(end["next"])
        if hi <= lo:
            return []
        n = min(self.num_partitions, hi - lo)
        bounds = [lo + (hi - lo) * i // n for i in range(n + 1)]
        return [KeyRange(self.path, self.table, self.key, a, b) for a, b in itertools.pairwise(bounds) if a < b]

    def read(self, partition: Partition) -> Iterator[pa.RecordBatch]:
        """The rows of one key range, in key order. Called once per partition per batch, possibly
        in a worker thread or on a pickled copy: opens its own connection."""
        assert isinstance(partition, KeyRange)
        conn = _connect(partition.path)
        try:
            cur = conn.execute(
                f'SELECT * FROM "{partition.table}" WHERE "{partition.key}" >= ? AND "{partition.key}" < ? '
                f'ORDER BY "{partition.key}"',
                (partition.lo, partition.hi),
            )
            names = [d[0] for d in cur.description]
            while rows := cur.fetchmany(_CHUNK):
                columns = list(zip(*rows, strict=True))
                yield pa.RecordBatch.from_arrays(
                    [pa.array(col, type=self._schema.field(name).type) for name, col in zip(names, columns, strict=True)],
                    schema=self._schema,
                )
        finally:
            conn.close()

    def close(self) -> None:
        """Close the driver's connection. Called once when the query stops; idempotent."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
