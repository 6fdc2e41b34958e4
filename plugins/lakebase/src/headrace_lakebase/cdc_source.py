"""``LakebaseChangeSource``: a PostgreSQL table's changes through logical replication (pgoutput).

Offsets (JSON in the checkpoint)::

    {"phase": "snapshot" | "stream" | "done",
     "lsn": 23456789,        # stream: transactions whose commit record starts before this are done
     "after": ["42"] | None, # snapshot: rows with key <= after are read (key values as text)
     "last": ["97"] | None,  # past the snapshot: its last key (None: no row after "after"), so a
                             # replay of the last range reads that range and no row added since
     "snap": {...} | None}   # the initial snapshot's visibility, until the stream passes it

A batch reads ``[start, end)`` with ``pg_logical_slot_peek_binary_changes`` (nothing is
consumed); the slot is advanced with ``pg_replication_slot_advance`` only in ``commit(end)``,
after the batch is committed, so a replay reads the same changes. ``latest_offset`` peeks at
most ``maxChangesPerTrigger`` changes and keeps them for the batch's ``read`` (one decoding
pass per batch); a replay or a pickled copy peeks again.

The snapshot phase is in :mod:`headrace_lakebase.cdc_snapshot_phase`, the partitions and the
end of a stream batch in :mod:`headrace_lakebase.cdc_partitions` (their names are importable
from here as before).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, ClassVar

import pyarrow as pa

from headrace.options import Options
from headrace.protocols import Offset, Partition, ReadLimit, RealTimeChunk, Source, SourceContext
from headrace_lakebase._options import CONNECT_TIMEOUT, DBTABLE, MAX_RETRIES
from headrace_lakebase.cdc_decode import ChangeDecoder, Snapshot, change_schema
from headrace_lakebase.cdc_partitions import SnapshotPartition, StreamPartition, plan_partitions, stream_end
from headrace_lakebase.cdc_setup import (
    TableInfo,
    check_table,
    check_wal_level,
    describe_table,
    ensure_publication,
    ensure_slot,
    slot_state,
)
from headrace_lakebase.cdc_slot import advance_slot, peek
from headrace_lakebase.cdc_snapshot import HeldSnapshot, session_setup
from headrace_lakebase.cdc_snapshot_phase import SnapshotPhase
from headrace_lakebase.connection import Conn, Connector, params_from_options
from headrace_lakebase.pgoutput import parse_lsn
from headrace_lakebase.pgread import arrow_type

__all__ = ["LakebaseChangeSource", "SnapshotPartition", "StreamPartition"]

log = logging.getLogger(__name__)

_BATCH_ROWS = 8192


def _default_name(info_table: Any) -> str:
    return f"headrace_{info_table.schema}_{info_table.table}"[:63]


class LakebaseChangeSource(SnapshotPhase, Source):
    """The ``lakebase`` / ``postgresql`` change source. See the module docstring and the README.

    Exactly-once with an idempotent sink: offsets are LSNs, reads are peeks, the slot advances
    after the commit. Built once per query run on the driver; connects to read the table's
    description (schema) and checks the settings, but creates nothing until ``initial_offset``
    or the first batch.
    """

    replayable: ClassVar[bool] = True
    supports_real_time: ClassVar[bool] = True

    def __init__(self, options: Options, context: SourceContext) -> None:
        super().__init__(options, context)
        self.table = options[DBTABLE]
        self.slot: str = options["slotName"] or _default_name(self.table)
        self.publication: str = options["publicationName"] or _default_name(self.table)
        self.snapshot_mode: str = options["snapshotMode"]
        self.max_changes: int = options["maxChangesPerTrigger"]
        self.chunk_rows: int = options["snapshotChunkRows"]
        self.on_truncate: str = options["onTruncate"]
        self.poll: float = options["pollInterval"]
        self._connector = self._make_connector()
        self._conn: Conn | None = None
        self._lock = threading.RLock()
        self._held: HeldSnapshot | None = None
        self._cache: tuple[int, int, list[tuple[int, bytes]]] | None = None
        self._available_now: int | None = None
        self._more_after: bool = False
        self._last_commit_us = 0
        self._database = ""
        self._conn, (self.info, self._database) = self._connector.run(None, self._describe)
        self._types = [arrow_type(c) for c in self.info.columns]
        self._schema = change_schema(self.info, self._types)

    def _make_connector(self) -> Connector:
        options = self.options
        return Connector(
            lambda: params_from_options(options),
            max_retries=options[MAX_RETRIES],
            connect_timeout=options[CONNECT_TIMEOUT],
            what=f"reading changes of {self.table}",
        )

    def __repr__(self) -> str:
        return f"LakebaseChangeSource(dbtable={self.table}, slot={self.slot}, publication={self.publication})"

    def _describe(self, conn: Conn) -> tuple[TableInfo, str]:
        session_setup(conn)
        info = describe_table(conn, self.table)
        check_table(info, needs_key=self.snapshot_mode != "never")
        if self.snapshot_mode != "initial_only":
            check_wal_level(conn)
        db = conn.execute("SELECT current_database()").fetchone()
        return info, str(db[0]) if db else ""

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.update(_conn=None, _held=None, _cache=None, _lock=None, _connector=None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.RLock()
        self._connector = self._make_connector()

    @property
    def schema(self) -> pa.Schema:
        """The table's columns (Arrow types per pgread) plus ``_change_type``, ``_lsn``,
        ``_commit_timestamp``. Read from the catalog when the source is built."""
        return self._schema

    # ------------------------------------------------------------------ connections
    def _run(self, work: Any) -> Any:
        with self._lock:
            self._conn, out = self._connector.run(self._conn, work, on_reconnect=session_setup)
            return out

    def _ensure_replication(self, conn: Conn) -> int:
        ensure_publication(conn, self.publication, self.info)
        state = ensure_slot(conn, self.slot, self._database)
        return state.confirmed_flush

    # ------------------------------------------------------------------ offsets
    def initial_offset(self) -> Offset:
        """Create the publication and the slot when absent, then (snapshotMode initial /
        initial_only) open the snapshot transaction. Called once, for a new checkpoint."""
        lsn = 0
        if self.snapshot_mode != "initial_only":
            lsn = self._run(self._ensure_replication)
        if self.snapshot_mode == "never":
            return {"phase": "stream", "lsn": lsn, "after": None, "snap": None}
        held = self._open_snapshot()
        snap = Snapshot.parse(held.text, held.lsn)
        return {"phase": "snapshot", "lsn": lsn, "after": None, "snap": {**snap.to_offset(), "text": held.text,
                                                                         "time": held.time_us}}  # fmt: skip

    def default_read_limit(self) -> ReadLimit:
        """``maxChangesPerTrigger`` as a row limit. Called once per run."""
        return ReadLimit(max_rows=self.max_changes)

    def prepare_for_available_now(self) -> bool:
        """Record the WAL position now: no batch goes past it, and every transaction committed
        before this call is read. Called once per available-now run, on the driver.

        A commit acknowledged under ``synchronous_commit=off`` may not be flushed yet, and
        logical decoding reads only flushed WAL (the WAL writer flushes a last partial page only
        every ``wal_writer_delay``), so the position is taken after a synchronous commit that
        wrote WAL, which flushes the WAL of every earlier commit: a transactional logical
        decoding message (prefix ``headrace.available_now``, empty; pgoutput, without its
        ``messages`` option, sends nothing for it) committed with ``SET LOCAL
        synchronous_commit = on``. The position is then the flushed end of the WAL."""
        if self.snapshot_mode == "initial_only":
            return True

        def mark(conn: Conn) -> Any:
            with conn.transaction():
                conn.execute("SET LOCAL synchronous_commit = on")
                conn.execute("SELECT pg_logical_emit_message(true, 'headrace.available_now', '')")
            return conn.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()

        row = self._run(mark)
        self._available_now = parse_lsn(str(row[0]))
        return True

    def latest_offset(self, start: Offset, limit: ReadLimit) -> Offset:
        """Snapshot phase: the end of the next key range. Stream phase: the end of the last
        whole transaction among the next ``limit.max_rows`` messages (changes plus one begin and
        one commit per transaction; at least one transaction), peeked now and kept for the
        batch's read. Called once per trigger."""
        phase = start["phase"]
        if phase == "done":
            return start
        if phase == "snapshot":
            return self._next_snapshot_offset(start)
        return self._next_stream_offset(start, limit)

    def _next_stream_offset(self, start: Offset, limit: ReadLimit) -> Offset:
        pos = int(start["lsn"])
        rows = self._peek(pos, None, limit.max_rows or self.max_changes, advance_to=pos)
        end = stream_end(rows, pos, self._available_now)
        self._more_after = len(rows) >= (limit.max_rows or self.max_changes)
        out = dict(start)
        out["lsn"] = end
        snap = start.get("snap")
        if snap and end >= int(snap["lsn"]):
            out["snap"] = None  # the stream passed the snapshot: no later transaction is in it
        if end == pos:
            return start
        self._cache = (pos, end, rows)
        return out

    # ------------------------------------------------------------------ peeking
    def _peek(self, start: int, upto_lsn: int | None, upto_n: int | None, *, advance_to: int | None) -> list[tuple[int, bytes]]:
        """The slot's messages (lsn, data), checked to still hold ``start``; the slot first
        advanced to ``advance_to`` (a committed position) when behind it."""

        def work(conn: Conn) -> list[tuple[int, bytes]]:
            return peek(conn, self.slot, self.publication, self.table, self._database, start, upto_lsn, upto_n,
                        advance_to=advance_to)  # fmt: skip

        with self._lock:
            if self._conn is None or self._conn.closed or self._conn.broken:
                self._conn = None
            self._conn, out = self._connector.run(self._conn, work, on_reconnect=session_setup)
            return out

    # ------------------------------------------------------------------ batches
    def partitions(self, start: Offset, end: Offset) -> Sequence[Partition]:
        """A key range of the snapshot and/or an LSN range of changes. Snapshot rows carry the
        first snapshot's time as ``_commit_timestamp`` (the same on a replay)."""
        return plan_partitions(start, end)

    def read(self, partition: Partition) -> Iterator[pa.RecordBatch]:
        """The partition's change rows, ``8192`` at most per record batch. Called once per batch."""
        if isinstance(partition, SnapshotPartition):
            yield from self._read_snapshot(partition)
            return
        assert isinstance(partition, StreamPartition)
        cache = self._cache
        if cache is not None and cache[0] == partition.start and cache[1] == partition.end:
            rows = cache[2]
        else:
            rows = self._peek(partition.start, partition.end, None, advance_to=None)
        self._cache = None
        yield from self._decode(rows, partition.start, partition.end, partition.snap)

    def _decode(self, rows: Sequence[tuple[int, bytes]], start: int, end: int | None,
                snap: dict[str, Any] | None) -> Iterator[pa.RecordBatch]:  # fmt: skip
        from psycopg.adapt import Transformer

        with self._lock:
            conn = self._conn
        dec = ChangeDecoder(self.info, self._schema, self._types, Transformer(conn), start=start, end=end,
                            snapshot=Snapshot.from_offset(snap), on_truncate=self.on_truncate,
                            slot=self.slot)  # fmt: skip
        for lsn, data in rows:
            dec.feed(lsn, data)
            if dec.pending >= _BATCH_ROWS and data[0] == 67:
                b = dec.take()
                if b is not None:
                    yield b
        b = dec.take()
        if b is not None:
            yield b
        if dec.last_commit_time_us:
            self._last_commit_us = dec.last_commit_time_us

    # ------------------------------------------------------------------ real time
    def read_real_time(self, start: Offset, stop: Any) -> Iterator[RealTimeChunk]:
        """Changes as they commit, one chunk per peek, from ``start`` until ``stop`` is set
        (the snapshot first, range by range, when it is not finished). Called once per
        real-time batch."""
        pos = dict(start)
        while not stop.is_set():
            if pos["phase"] == "done":
                stop.wait(self.poll)
                continue
            nxt = self.latest_offset(pos, ReadLimit(max_rows=self.max_changes))
            if nxt == pos:
                stop.wait(self.poll)
                continue
            yielded = False
            for p in self.partitions(pos, nxt):
                for b in self.read(p):
                    yielded = True
                    times = b.column("_commit_timestamp").cast(pa.int64()).to_numpy(zero_copy_only=False) / 1000.0
                    yield RealTimeChunk(b, nxt, [float(t) for t in times])
            if not yielded:
                yield RealTimeChunk(_empty(self._schema), nxt)
            pos = nxt

    # ------------------------------------------------------------------ commit / metrics
    def commit(self, end: Offset) -> None:
        """The batch up to ``end`` is committed: advance the slot there (frees WAL). Called once
        per batch after the commit, on the driver."""
        if end["phase"] == "snapshot" or self.snapshot_mode == "initial_only":
            return
        lsn = int(end["lsn"])

        def advance(conn: Conn) -> None:
            state = slot_state(conn, self.slot)
            if state is not None and state.confirmed_flush < lsn:
                advance_slot(conn, self.slot, lsn)

        self._run(advance)

    def metrics(self, latest: Offset) -> Mapping[str, Any]:
        """``lagBytes`` (WAL written after the batch's end), ``lagSeconds`` (how old the
        batch's last commit is when more changes wait), the phase and slot. Once per batch."""
        out: dict[str, Any] = {"phase": latest.get("phase"), "slotName": self.slot}
        if latest.get("phase") != "stream":
            return out
        row = self._run(lambda c: c.execute("SELECT pg_current_wal_lsn()::text").fetchone())
        current = parse_lsn(str(row[0]))
        out["lagBytes"] = max(0, current - int(latest["lsn"]))
        lag = 0.0
        if self._more_after and self._last_commit_us:
            lag = max(0.0, time.time() - self._last_commit_us / 1e6)
        out["lagSeconds"] = round(lag, 3)
        return out

    def close(self) -> None:
        """Close the connections and the snapshot transaction (the slot stays). Idempotent."""
        if self._held is not None:
            self._held.close()
            self._held = None
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()


def _empty(schema: pa.Schema) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([pa.array([], f.type) for f in schema], schema=schema)

