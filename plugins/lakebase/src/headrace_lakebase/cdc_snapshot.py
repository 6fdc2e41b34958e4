"""The initial snapshot of the change source: the table's rows in primary-key ranges, all read
in one REPEATABLE READ snapshot taken *after* the replication slot exists.

Hand-over (no change missed or applied twice): the slot is created first, so every transaction
committing after its start is decoded; the snapshot records ``pg_current_snapshot()`` (xmin,
xmax, in-progress xids) and the WAL position. Streamed transactions that the snapshot already
contains (by xid visibility) are skipped; all others are applied after the snapshot. The
snapshot's transaction stays open on its own connection while the snapshot is read, one key
range per micro-batch, ``snapshotChunkRows`` rows each, fetched with a server-side cursor
(bounded memory).

If the process restarts before the snapshot is complete, its transaction is gone: the remaining
ranges are read in a new snapshot, and the skip rule keeps the first one, so no change is missed;
changes committed between the two snapshots reach the sink twice (once in the rows, once
streamed), which an AUTO CDC sink with ``sequenceBy`` resolves (snapshot rows have ``_lsn`` 0).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import psycopg
import pyarrow as pa
from psycopg import sql
from psycopg.adapt import Loader

from headrace_lakebase.cdc_setup import TableInfo
from headrace_lakebase.pgread import SESSION_SETTINGS, to_arrow

__all__ = ["HeldSnapshot", "last_key", "next_boundary", "read_range", "take_snapshot"]

log = logging.getLogger(__name__)

Conn = psycopg.Connection[tuple[object, ...]]


class _RawText(Loader):
    """Text results as the server's bytes (converted column-wise to Arrow later)."""

    def load(self, data: Any) -> bytes:
        return bytes(data)


def session_setup(conn: Conn) -> None:
    """The GUCs that make every value's text exact and parseable (see pgread)."""
    for k, v in SESSION_SETTINGS.items():
        conn.execute(sql.SQL("SET {} = {}").format(sql.Identifier(k), sql.Literal(v)))


class HeldSnapshot:
    """An open REPEATABLE READ transaction on its own connection; ``text`` is its
    ``pg_current_snapshot()``. Reads are serialised by a lock."""

    def __init__(self, conn: Conn, text: str, lsn: int, time_us: int) -> None:
        self.conn, self.text, self.lsn, self.time_us = conn, text, lsn, time_us
        self.lock = threading.Lock()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.conn.close()


def take_snapshot(conn: Conn) -> HeldSnapshot:
    """Start the snapshot transaction on ``conn`` (autocommit off from here on)."""
    session_setup(conn)
    conn.autocommit = False
    conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
    row = conn.execute(
        "SELECT pg_current_snapshot()::text, pg_current_wal_lsn()::text, "
        "(extract(epoch FROM clock_timestamp()) * 1000000)::bigint"
    ).fetchone()
    assert row is not None
    from headrace_lakebase.pgoutput import parse_lsn

    return HeldSnapshot(conn, str(row[0]), parse_lsn(str(row[1])), int(row[2]))  # type: ignore[call-overload]


def _key_cond(info: TableInfo, op: str, values: Sequence[str]) -> sql.Composable:
    types = {c.name: c.type_name for c in info.columns}
    keys = sql.SQL(", ").join(sql.Identifier(k) for k in info.primary_key)
    vals = sql.SQL(", ").join(sql.SQL("%s::" + types[k]) for k in info.primary_key)  # type name from format_type
    return sql.SQL("({}) " + op + " ({})").format(keys, vals)


def next_boundary(snap: HeldSnapshot, info: TableInfo, after: Sequence[str] | None, rows: int) -> list[str] | None:
    """The key of the ``rows``-th row after ``after`` (as text), or None when fewer remain."""
    keys = sql.SQL(", ").join(sql.Identifier(k) for k in info.primary_key)
    text_keys = sql.SQL(", ").join(
        sql.SQL("{}::text AS {}").format(sql.Identifier(k), sql.Identifier(f"k{i}")) for i, k in enumerate(info.primary_key)
    )  # aliases: ORDER BY must see the columns, not their text
    where = _key_cond(info, ">", after) if after is not None else sql.SQL("true")
    q = sql.SQL("SELECT {} FROM {} WHERE {} ORDER BY {} LIMIT 1 OFFSET %s").format(
        text_keys, sql.Identifier(info.table.schema, info.table.table), where, keys
    )
    with snap.lock:
        row = snap.conn.execute(q, [*(after or []), rows - 1]).fetchone()
    return None if row is None else [str(v) for v in row]


def last_key(snap: HeldSnapshot, info: TableInfo, after: Sequence[str] | None) -> list[str] | None:
    """The greatest key after ``after`` in the snapshot (as text), or None when no row is left."""
    text_keys = sql.SQL(", ").join(
        sql.SQL("{}::text AS {}").format(sql.Identifier(k), sql.Identifier(f"k{i}")) for i, k in enumerate(info.primary_key)
    )
    desc = sql.SQL(", ").join(sql.SQL("{} DESC").format(sql.Identifier(k)) for k in info.primary_key)
    where = _key_cond(info, ">", after) if after is not None else sql.SQL("true")
    q = sql.SQL("SELECT {} FROM {} WHERE {} ORDER BY {} LIMIT 1").format(
        text_keys, sql.Identifier(info.table.schema, info.table.table), where, desc
    )
    with snap.lock:
        row = snap.conn.execute(q, [*(after or [])]).fetchone()
    return None if row is None else [str(v) for v in row]


def read_range(
    conn: Conn,
    info: TableInfo,
    schema: pa.Schema,
    types: Sequence[pa.DataType],
    after: Sequence[str] | None,
    upto: Sequence[str] | None,
    time_us: int,
    *,
    fetch: int = 5000,
) -> Iterator[pa.RecordBatch]:
    """Rows with ``after < key <= upto`` (open ends when None) in key order, as change rows
    (``insert``, ``_lsn`` 0, ``_commit_timestamp`` the snapshot's time), ``fetch`` rows at a time.
    ``conn`` must be inside the snapshot's transaction."""
    from psycopg.adapt import Transformer

    cols = sql.SQL(", ").join(
        sql.SQL("{}::text AS {}").format(sql.Identifier(c.name), sql.Identifier(f"c{i}")) for i, c in enumerate(info.columns)
    )  # aliases: ORDER BY must see the columns, not their text
    keys = sql.SQL(", ").join(sql.Identifier(k) for k in info.primary_key)
    conds: list[sql.Composable] = []
    params: list[Any] = []
    if after is not None:
        conds.append(_key_cond(info, ">", after))
        params += list(after)
    if upto is not None:
        conds.append(_key_cond(info, "<=", upto))
        params += list(upto)
    where = sql.SQL(" AND ").join(conds) if conds else sql.SQL("true")
    q = sql.SQL("SELECT {} FROM {} WHERE {} ORDER BY {}").format(
        cols, sql.Identifier(info.table.schema, info.table.table), where, keys
    )
    tx = Transformer(conn)
    with conn.cursor(name="headrace_snapshot") as cur:
        cur.adapters.register_loader("text", _RawText)
        cur.execute(q, params)
        while True:
            rows = cur.fetchmany(fetch)
            if not rows:
                break
            n = len(rows)
            arrays = [to_arrow([r[i] for r in rows], c, t, tx) for i, (c, t) in enumerate(zip(info.columns, types,
                                                                                                  strict=True))]  # fmt: skip
            arrays.append(pa.array(["insert"] * n, pa.string()))
            arrays.append(pa.array([0] * n, pa.int64()))
            arrays.append(pa.array([time_us] * n, pa.int64()).cast(pa.timestamp("us", tz="UTC")))
            yield pa.RecordBatch.from_arrays(arrays, schema=schema)
