"""A decoder of PostgreSQL's ``pgoutput`` logical replication messages (protocol version 1).

The messages are what ``pg_logical_slot_peek_binary_changes(slot, upto_lsn, upto_nchanges,
'proto_version', '1', 'publication_names', 'pub')`` returns in its ``data`` column (and what a
walsender streams in ``XLogData``). Format: "Logical Replication Message Formats" in the
PostgreSQL manual. Values arrive in text format (the type's output function, run in the
decoding session, so ``TimeZone``/``DateStyle``/``IntervalStyle`` of that session apply).

Only what a change feed needs is decoded: Begin, Commit, Relation, Insert, Update, Delete,
Truncate; Origin, Type and logical Messages are skipped. Pure Python with ``struct``; no
I/O and no client library (see docs/decisions.md for why not pypgoutput).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

__all__ = [
    "UNCHANGED",
    "Begin",
    "Commit",
    "Change",
    "Column",
    "PgOutputError",
    "Relation",
    "Truncate",
    "decode",
    "format_lsn",
    "parse_lsn",
    "pg_time_to_datetime",
    "tuple_data",
]

_PG_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
_PG_EPOCH_US = 946_684_800_000_000  # 2000-01-01 in microseconds since 1970-01-01


class _Unchanged:
    """The marker of an unchanged TOASTed value ('u') in an update's new tuple."""

    def __repr__(self) -> str:
        return "UNCHANGED"


UNCHANGED = _Unchanged()
"""Stands for a TOASTed value the update did not change (pgoutput does not send it)."""


class PgOutputError(ValueError):
    """A message that is not valid pgoutput protocol version 1."""


def parse_lsn(text: str) -> int:
    """``'16/B374D848'`` -> the LSN as an integer."""
    hi, _, lo = str(text).partition("/")
    return (int(hi, 16) << 32) | int(lo, 16)


def format_lsn(lsn: int) -> str:
    """An integer LSN as PostgreSQL writes it, ``'16/B374D848'``."""
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def pg_time_to_datetime(us: int) -> datetime:
    """Microseconds since 2000-01-01 UTC (PostgreSQL's epoch) as an aware datetime."""
    return _PG_EPOCH + timedelta(microseconds=us)


def pg_time_to_unix_us(us: int) -> int:
    """Microseconds since PostgreSQL's epoch -> microseconds since the Unix epoch."""
    return us + _PG_EPOCH_US


@dataclass(frozen=True)
class Column:
    name: str
    type_oid: int
    typmod: int
    is_key: bool


@dataclass(frozen=True)
class Relation:
    """A table's description, sent before its first change in a session and after a change."""

    relid: int
    namespace: str
    name: str
    replica_identity: str  # d (default), n (nothing), f (full), i (index)
    columns: tuple[Column, ...]


@dataclass(frozen=True)
class Begin:
    final_lsn: int
    commit_time_us: int  # since 2000-01-01
    xid: int


@dataclass(frozen=True)
class Commit:
    commit_lsn: int
    end_lsn: int
    commit_time_us: int


@dataclass(frozen=True)
class Change:
    """An Insert ('I'), Update ('U') or Delete ('D'). ``old`` is the old tuple (kind 'K': key
    columns only, others None; 'O': the whole old row under REPLICA IDENTITY FULL), ``new`` the
    new tuple. Values are ``bytes`` (text format), ``None`` (NULL) or :data:`UNCHANGED`."""

    op: str
    relid: int
    old_kind: str | None
    old: tuple[object, ...] | None
    new: tuple[object, ...] | None


@dataclass(frozen=True)
class Truncate:
    relids: tuple[int, ...]
    cascade: bool
    restart_identity: bool


_I16 = struct.Struct("!h")
_I32 = struct.Struct("!i")
_U32 = struct.Struct("!I")
_BEGIN = struct.Struct("!qqI")
_COMMIT = struct.Struct("!bqqq")
_REL_HEAD = struct.Struct("!I")


def _cstring(data: bytes, pos: int) -> tuple[str, int]:
    end = data.index(b"\0", pos)
    return data[pos:end].decode(), end + 1


def tuple_data(data: bytes, pos: int) -> tuple[tuple[object, ...], int]:
    """The TupleData at ``pos`` of a message: its values and the position after it."""
    return _tuple(data, pos)


def _tuple(data: bytes, pos: int) -> tuple[tuple[object, ...], int]:
    (n,) = _I16.unpack_from(data, pos)
    pos += 2
    values: list[object] = []
    append = values.append
    unpack = _I32.unpack_from
    for _ in range(n):
        kind = data[pos]
        pos += 1
        if kind == 116 or kind == 98:  # 't' text, 'b' binary
            (length,) = unpack(data, pos)
            pos += 4
            append(data[pos : pos + length])
            pos += length
        elif kind == 110:  # 'n'
            append(None)
        elif kind == 117:  # 'u'
            append(UNCHANGED)
        else:
            raise PgOutputError(f"unknown tuple column kind {chr(kind)!r} at byte {pos - 1}")
    return tuple(values), pos


def decode(data: bytes) -> Begin | Commit | Relation | Change | Truncate | None:
    """One pgoutput message; ``None`` for message types a change feed ignores (Origin, Type,
    logical decoding Message, streaming). Raises :class:`PgOutputError` on malformed input."""
    if not data:
        raise PgOutputError("empty pgoutput message")
    tag = data[0]
    try:
        if tag == 73:  # 'I'
            (relid,) = _U32.unpack_from(data, 1)
            if data[5] != 78:  # 'N'
                raise PgOutputError(f"insert without a new tuple (byte {data[5]!r})")
            new, _ = _tuple(data, 6)
            return Change("I", relid, None, None, new)
        if tag == 85:  # 'U'
            (relid,) = _U32.unpack_from(data, 1)
            pos = 5
            old_kind: str | None = None
            old: tuple[object, ...] | None = None
            if data[pos] in (75, 79):  # 'K', 'O'
                old_kind = chr(data[pos])
                old, pos = _tuple(data, pos + 1)
            if data[pos] != 78:
                raise PgOutputError(f"update without a new tuple (byte {data[pos]!r})")
            new, _ = _tuple(data, pos + 1)
            return Change("U", relid, old_kind, old, new)
        if tag == 68:  # 'D'
            (relid,) = _U32.unpack_from(data, 1)
            old_kind = chr(data[5])
            old, _ = _tuple(data, 6)
            return Change("D", relid, old_kind, old, None)
        if tag == 66:  # 'B'
            final_lsn, ts, xid = _BEGIN.unpack_from(data, 1)
            return Begin(final_lsn, ts, xid)
        if tag == 67:  # 'C'
            _flags, commit_lsn, end_lsn, ts = _COMMIT.unpack_from(data, 1)
            return Commit(commit_lsn, end_lsn, ts)
        if tag == 82:  # 'R'
            (relid,) = _REL_HEAD.unpack_from(data, 1)
            namespace, pos = _cstring(data, 5)
            name, pos = _cstring(data, pos)
            ident = chr(data[pos])
            (ncols,) = _I16.unpack_from(data, pos + 1)
            pos += 3
            cols = []
            for _ in range(ncols):
                flags = data[pos]
                cname, pos = _cstring(data, pos + 1)
                oid, typmod = struct.unpack_from("!Ii", data, pos)
                pos += 8
                cols.append(Column(cname, oid, typmod, bool(flags & 1)))
            return Relation(relid, namespace, name, ident, tuple(cols))
        if tag == 84:  # 'T'
            (n,) = _I32.unpack_from(data, 1)
            opts = data[5]
            relids = struct.unpack_from(f"!{n}I", data, 6)
            return Truncate(tuple(relids), bool(opts & 1), bool(opts & 2))
        if tag in (79, 89, 77, 83, 69, 99, 65):  # Origin, Type, Message, stream start/stop/commit/abort
            return None
    except (struct.error, IndexError, ValueError) as e:
        if isinstance(e, PgOutputError):
            raise
        raise PgOutputError(f"malformed pgoutput message {chr(tag)!r} ({len(data)} bytes): {e}") from None
    raise PgOutputError(f"unknown pgoutput message type {chr(tag)!r} (byte {tag})")
