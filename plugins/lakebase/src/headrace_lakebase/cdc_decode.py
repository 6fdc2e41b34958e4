"""pgoutput messages of one table -> Arrow record batches of change rows.

Rows carry the table's columns, then ``_change_type`` (``insert``, ``update_preimage``,
``update_postimage``, ``delete``: the Delta change feed's names), ``_lsn`` (the change's WAL
position: increasing per key, so it orders a key's events) and ``_commit_timestamp``.

- Only transactions whose commit record starts in ``[start, end)`` are decoded (the batch's
  range; the slot may still hold older ones after a crash), and, while an initial snapshot is
  being handed over, only those *not* visible in the snapshot (so no change is applied twice).
- An update's unchanged TOASTed values (not sent by PostgreSQL) are filled from the old row,
  sent whole under REPLICA IDENTITY FULL; without it the decoder fails rather than write NULL.
- An update that changes the primary key becomes a delete of the old key and an insert of
  the new one, so key-based sinks never keep the old key.
- TRUNCATE fails the batch (``onTruncate=fail``) or is logged and skipped (``ignore``).
- A relation message with a column the stream's schema lacks (``ALTER TABLE ... ADD COLUMN``
  after the stream started) fails with the fix (restart: the schema is read again); a column
  of the schema missing from the relation (dropped) is NULL.
- A column whose type changed (:mod:`headrace_lakebase.cdc_types`): to one with the same Arrow
  type (``varchar(n)`` -> ``text``) nothing changes; a relation older than the stream's schema
  whose type the schema's widens (changes from before an ``ALTER COLUMN ... TYPE`` read by a
  query started after it) is decoded as the schema's type (cast); a widening while the stream
  runs fails with "restart the query" (the restarted query reads the new type and casts the
  earlier changes to it); any other change fails with the steps to reload the mirror.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from headrace.errors import HeadraceError
from headrace_lakebase.cdc_setup import TableInfo
from headrace_lakebase.cdc_types import describe_type, is_widening
from headrace_lakebase.pgoutput import (
    UNCHANGED,
    Change,
    Relation,
    Truncate,
    decode,
    format_lsn,
    pg_time_to_unix_us,
    tuple_data,
)
from headrace_lakebase.pgread import PgColumn, arrow_type, to_arrow

_BEGIN = struct.Struct("!qqI")
_COMMIT = struct.Struct("!bqqq")

__all__ = ["CDC_COLUMNS", "ChangeDecoder", "SchemaChangedError", "Snapshot", "TruncatedError", "change_schema"]

log = logging.getLogger(__name__)

CDC_COLUMNS = ("_change_type", "_lsn", "_commit_timestamp")


class SchemaChangedError(HeadraceError):
    """The table's columns changed in a way the running stream cannot represent."""


class TruncatedError(HeadraceError):
    """The table was truncated (``onTruncate=fail``)."""


def change_schema(info: TableInfo, types: Sequence[pa.DataType]) -> pa.Schema:
    """The Arrow schema of change rows: the table's columns, then the CDC columns."""
    fields = [pa.field(c.name, t) for c, t in zip(info.columns, types, strict=True)]
    fields += [pa.field("_change_type", pa.string()), pa.field("_lsn", pa.int64()),
               pa.field("_commit_timestamp", pa.timestamp("us", tz="UTC"))]  # fmt: skip
    return pa.schema(fields)


class Snapshot:
    """The visibility of the initial snapshot (``pg_current_snapshot()``: xmin, xmax, in-progress
    xids, all 64-bit) and the WAL position read with it. A transaction is in the snapshot when
    its xid is below xmin, or below xmax and not in progress."""

    def __init__(self, xmin: int, xmax: int, xip: Sequence[int], lsn: int) -> None:
        self.xmin, self.xmax, self.xip, self.lsn = xmin, xmax, frozenset(xip), lsn

    @classmethod
    def parse(cls, text: str, lsn: int) -> Snapshot:
        xmin, xmax, xip = text.split(":")
        return cls(int(xmin), int(xmax), [int(x) for x in xip.split(",") if x], lsn)

    @classmethod
    def from_offset(cls, d: dict[str, Any] | None) -> Snapshot | None:
        return None if not d else cls(int(d["xmin"]), int(d["xmax"]), [int(x) for x in d["xip"]], int(d["lsn"]))

    def to_offset(self) -> dict[str, Any]:
        return {"xmin": self.xmin, "xmax": self.xmax, "xip": sorted(self.xip), "lsn": self.lsn}

    def visible(self, xid32: int) -> bool:
        """Whether the transaction with 32-bit xid ``xid32`` (pgoutput's) is in the snapshot."""
        full = (self.xmax & ~0xFFFFFFFF) | xid32
        if full > self.xmax + (1 << 31):
            full -= 1 << 32
        elif full < self.xmax - (1 << 31):
            full += 1 << 32
        if full < self.xmin:
            return True
        return full < self.xmax and full not in self.xip


class ChangeDecoder:
    """Decodes one batch's messages (``feed``) into Arrow batches (``take``). Not thread-safe;
    one per read."""

    def __init__(
        self,
        info: TableInfo,
        schema: pa.Schema,
        types: Sequence[pa.DataType],
        transformer: Any,
        *,
        start: int,
        end: int | None,
        snapshot: Snapshot | None,
        on_truncate: str,
        slot: str = "",
    ) -> None:
        self.info = info
        self.schema = schema
        self.types = list(types)
        self.columns: list[PgColumn] = list(info.columns)
        self.names = [c.name for c in info.columns]
        self.key_idx = [self.names.index(k) for k in info.primary_key]
        self.transformer = transformer
        self.start, self.end = start, end
        self.snapshot = snapshot
        self.on_truncate = on_truncate
        self.slot = slot
        self.relid = info.relid
        self._map: list[tuple[int, int]] | None = None  # (relation index, schema index)
        self._width = 0
        self._in_tx = False
        self._skip = False
        self._ts = 0
        self._rows: list[tuple[object, ...]] = []
        self._nulls: tuple[object, ...] = (None,) * len(self.names)
        self._key_pos: list[int] = []
        self._identity = False  # the relation's columns are the schema's, in order
        self.changes = 0
        self.last_commit_end = 0
        self.last_commit_time_us = 0
        self.skipped_in_snapshot = 0

    # ------------------------------------------------------------------ messages
    @property
    def pending(self) -> int:
        return len(self._rows)

    def feed(self, lsn: int, data: bytes) -> None:
        """One message (``lsn`` the row's WAL position from the peek)."""
        tag = data[0]
        # Insert, the common case, decoded inline
        if tag == 73 and not self._skip and int.from_bytes(data[1:5], "big") == self.relid and self._map is not None:
            self._row(tuple_data(data, 6)[0], "insert", lsn)
            return
        if tag == 66:  # Begin: Int64 final LSN, Int64 commit time, Int32 xid
            final, ts, xid = _BEGIN.unpack_from(data, 1)
            self._in_tx = True
            in_range = final >= self.start and (self.end is None or final < self.end)
            self._skip = not in_range
            if in_range and self.snapshot is not None and final < self.snapshot.lsn and self.snapshot.visible(xid):
                self._skip = True
                self.skipped_in_snapshot += 1
            self._ts = pg_time_to_unix_us(ts)
            return
        if tag == 67:  # Commit: Int8 flags, Int64 commit LSN, Int64 end LSN, Int64 commit time
            if not self._skip:
                _flags, _commit, end_lsn, ts = _COMMIT.unpack_from(data, 1)
                self.last_commit_end = end_lsn
                self.last_commit_time_us = pg_time_to_unix_us(ts)
            self._in_tx = False
            self._skip = False
            return
        # Update with a full old row (REPLICA IDENTITY FULL), decoded inline
        if (tag == 85 and data[5] == 79 and not self._skip and self._map is not None
                and int.from_bytes(data[1:5], "big") == self.relid):  # fmt: skip
            old, pos = tuple_data(data, 6)
            if data[pos] == 78:  # 'N'
                self._update(lsn, old, tuple_data(data, pos + 1)[0])
                return
        msg = decode(data)
        if isinstance(msg, Change):
            if not self._skip and msg.relid == self.relid:
                self._change(lsn, msg)
        elif isinstance(msg, Relation) and msg.relid == self.relid:
            self._relation(msg, lsn)
        elif isinstance(msg, Truncate) and not self._skip and self.relid in msg.relids:
            if self.on_truncate == "fail":
                raise TruncatedError(
                    f"lakebase source: {self.info.table} was truncated (transaction at LSN {format_lsn(lsn)}): every "
                    "row was removed at once, which a change feed cannot express row by row. Fix: reload the "
                    "mirror (delete the checkpoint and the target, drop the slot, start again with "
                    "snapshotMode=initial), or set onTruncate=ignore to skip truncates"
                )
            log.warning("lakebase source: %s truncated at LSN %s; ignored (onTruncate=ignore)", self.info.table,
                        format_lsn(lsn))  # fmt: skip

    def _relation(self, rel: Relation, lsn: int = 0) -> None:
        by_name = {c.name: i for i, c in enumerate(self.columns)}
        mapping: list[tuple[int, int]] = []
        for i, col in enumerate(rel.columns):
            j = by_name.get(col.name)
            if j is None:
                raise SchemaChangedError(
                    f"lakebase source: {self.info.table} has a column {col.name!r} the stream's schema does not have "
                    "(added after the query started). Fix: restart the query; it reads the table's columns again "
                    "and earlier rows get NULL in the new column (a Delta target needs mergeSchema=true)"
                )
            self._check_type(col.name, col.type_oid, col.typmod, j, lsn)
            mapping.append((i, j))
        missing = [c.name for c in self.columns if c.name not in {x.name for x in rel.columns}]
        if missing:
            log.warning("lakebase source: columns %s of %s are not in the change stream any more (dropped?): NULL",
                        ", ".join(missing), self.info.table)  # fmt: skip
        self._map = mapping
        self._width = len(rel.columns)
        self._key_pos = [i for i, j in mapping if j in self.key_idx]
        self._identity = len(mapping) == len(self.names) and all(i == j for i, j in mapping)

    def _same_base(self, oid: int, col: PgColumn) -> bool:
        return col.oid == oid or col.elem_oid != 0  # arrays of domains: trust the catalog read at start

    def _check_type(self, name: str, oid: int, typmod: int, j: int, lsn: int) -> None:
        """The relation's type of column ``j`` against the stream's (see the module docstring)."""
        mine = self.columns[j]
        if self._same_base(oid, mine) and (typmod == mine.typmod or oid != 1700):  # numeric: typmod is the type
            return
        if arrow_type(PgColumn(name, oid, typmod, 0, "")) == self.types[j]:
            return  # varchar(n) -> text, json -> jsonb...: the same values in the stream
        if is_widening(oid, typmod, mine.oid, mine.typmod):
            log.info("lakebase source: changes of %s before column %s became %s are cast to it", self.info.table,
                     name, mine.type_name)  # fmt: skip
            return
        old, new = mine.type_name, describe_type(oid, typmod)
        if is_widening(mine.oid, mine.typmod, oid, typmod):
            raise SchemaChangedError(
                f"lakebase source: column {name} of {self.info.table} was widened from {old} to {new} (changes from "
                f"LSN {format_lsn(lsn)} on have the new type; the stream's schema has the old one). Fix: restart the "
                f"query: it reads the new type and casts the earlier changes to it. The mirror's column must widen "
                f"too: a Delta target does with mergeSchema=true; a PostgreSQL target needs ALTER TABLE <mirror> "
                f"ALTER COLUMN {name} TYPE {new} before the restart"
            )
        slot = f"'{self.slot}'" if self.slot else "'<slotName>'"
        raise SchemaChangedError(
            f"lakebase source: column {name} of {self.info.table} changed type from {old} to {new} at LSN "
            f"{format_lsn(lsn)}, which is not a widening (only smallint/integer -> bigint, real -> double precision, "
            f"varchar(n) -> text and numeric precision up are cast): changes of both types cannot be one column of "
            f"the mirror. Fix: reload the mirror: stop the query, run SELECT pg_drop_replication_slot({slot}), "
            f"delete the query's checkpoint and the mirror (a Delta target's folder, or DROP TABLE for a "
            f"PostgreSQL target), then start the query again (snapshotMode=initial reads the table with the new type)"
        )

    # ------------------------------------------------------------------ rows
    def _row(self, values: tuple[object, ...] | None, kind: str, lsn: int) -> None:
        if values is None:
            values = self._nulls
        elif not self._identity:
            mapped: list[object] = [None] * len(self.names)
            for i, j in self._map or ():
                mapped[j] = values[i]
            values = tuple(mapped)
        self._rows.append((*values, kind, lsn, self._ts))  # one tuple per row, transposed by take()
        self.changes += 1

    def _change(self, lsn: int, ch: Change) -> None:
        if self._map is None:
            raise HeadraceError(f"lakebase source: a change of {self.info.table} arrived before its relation message")
        if ch.op == "I":
            self._row(ch.new, "insert", lsn)
        elif ch.op == "D":
            old = ch.old
            if ch.old_kind == "K":
                old = self._key_only(old)
            self._row(old, "delete", lsn)
        else:
            new = ch.new
            assert new is not None
            old = ch.old
            if ch.old_kind == "K":
                old = self._key_only(old)
            if ch.old_kind == "O" and old is not None:
                self._update(lsn, old, new)
                return
            if UNCHANGED in new:
                cols = [self.columns[j].name for i, j in (self._map or []) if new[i] is UNCHANGED]
                raise HeadraceError(
                    f"lakebase source: an update of {self.info.table} at LSN {format_lsn(lsn)} did not send the "
                    f"unchanged TOASTed value(s) of {', '.join(cols)} and no old row image holds them; fix: "
                    f"ALTER TABLE {self.info.table} REPLICA IDENTITY FULL (changes after it are complete)"
                )
            if old is not None and self.key_idx and self._key_changed(old, new):
                self._row(old, "delete", lsn)
                self._row(new, "insert", lsn)
                return
            self._row(old if old is not None else self._key_only(new), "update_preimage", lsn)
            self._row(new, "update_postimage", lsn)

    def _update(self, lsn: int, old: tuple[object, ...], new: tuple[object, ...]) -> None:
        """An update with the whole old row (REPLICA IDENTITY FULL)."""
        if UNCHANGED in new:
            new = tuple(o if v is UNCHANGED else v for v, o in zip(new, old, strict=True))
        if self._key_pos and self._key_changed(old, new):
            self._row(old, "delete", lsn)
            self._row(new, "insert", lsn)
            return
        self._row(old, "update_preimage", lsn)
        self._row(new, "update_postimage", lsn)

    def _key_only(self, values: tuple[object, ...] | None) -> tuple[object, ...] | None:
        """A key-only old tuple: non-key columns are NULL (sent as 'n' by pgoutput already)."""
        if values is None:
            return None
        keys = {i for i, j in (self._map or []) if j in self.key_idx}
        return tuple(v if i in keys else None for i, v in enumerate(values))

    def _key_changed(self, old: tuple[object, ...], new: tuple[object, ...]) -> bool:
        assert self._map is not None
        return any(old[i] != new[i] for i in self._key_pos)

    # ------------------------------------------------------------------ output
    def take(self) -> pa.RecordBatch | None:
        """The rows decoded since the last call as one record batch (None when there are none)."""
        n = len(self._rows)
        if n == 0:
            return None
        cols = list(zip(*self._rows, strict=True))
        kinds, lsns, tss = cols[-3:]
        cols = cols[:-3]
        arrays = [to_arrow(vals, col, t, self.transformer) for vals, col, t in zip(cols, self.columns, self.types,
                                                                                   strict=True)]  # fmt: skip
        arrays.append(pa.array(kinds, pa.string()))
        arrays.append(pa.array(lsns, pa.int64()))
        arrays.append(pa.array(tss, pa.int64()).cast(pa.timestamp("us", tz="UTC")))
        self._rows = []
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)
