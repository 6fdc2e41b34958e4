"""The initial-snapshot phase of the change source (a mixin of ``LakebaseChangeSource``):
the snapshot transaction held open while its key ranges are planned and read, replaced by a new
one when the process restarted or its connection was lost (the rule: changes committed
meanwhile may reach the sink twice, resolved by ``sequenceBy=_lsn``)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from headrace.protocols import Offset
from headrace_lakebase.cdc_partitions import SnapshotPartition
from headrace_lakebase.cdc_snapshot import HeldSnapshot, last_key, next_boundary, read_range, take_snapshot

if TYPE_CHECKING:
    from headrace_lakebase.cdc_setup import TableInfo
    from headrace_lakebase.connection import Connector

__all__ = ["SnapshotPhase"]

log = logging.getLogger(__name__)


class SnapshotPhase:
    """Snapshot-phase methods of ``LakebaseChangeSource`` (which sets the attributes below).
    ``_held`` is never pickled (``LakebaseChangeSource.__getstate__`` drops it)."""

    table: Any
    info: TableInfo
    chunk_rows: int
    snapshot_mode: str
    _schema: pa.Schema
    _types: list[Any]
    _held: HeldSnapshot | None
    _connector: Connector

    def _open_snapshot(self) -> HeldSnapshot:
        if self._held is not None:
            self._held.close()
        # through the connector: a server restarting right now is retried like any transient error
        _, held = self._connector.run(None, take_snapshot)
        self._held = held
        log.info("lakebase source: snapshot of %s opened (%s)", self.table, held.text)
        return held

    def _snapshot_for(self, text: str) -> HeldSnapshot:
        """The open snapshot named ``text``, or a new one when the process restarted since."""
        if self._held is not None and self._held.text == text:
            return self._held
        if self._held is None:
            log.warning(
                "lakebase source: the initial snapshot of %s was interrupted (restart); reading the remaining rows in "
                "a new snapshot (changes committed meanwhile may reach the sink twice, resolved by sequenceBy=_lsn)",
                self.table,
            )
            return self._open_snapshot()
        return self._held

    def _next_snapshot_offset(self, start: Offset) -> Offset:
        try:
            return self._plan_snapshot_range(start)
        except Exception as e:
            if not self._lost_snapshot(e):
                raise
            return self._plan_snapshot_range(start)  # in a new snapshot, as a restarted query does

    def _lost_snapshot(self, error: BaseException) -> bool:
        """True when ``error`` came from the connection holding the snapshot breaking (the
        server restarted, an administrator ended it): the snapshot is dropped, and the next
        call takes a new one, with the same rule as after a restart (changes committed
        meanwhile may reach the sink twice, resolved by ``sequenceBy=_lsn``)."""
        held = self._held
        if held is None or not (getattr(held.conn, "broken", False) or getattr(held.conn, "closed", False)):
            return False
        log.warning("lakebase source: the connection holding the snapshot of %s was lost (%s); taking a new one",
                    self.table, error)  # fmt: skip
        held.close()
        self._held = None
        return True

    def _plan_snapshot_range(self, start: Offset) -> Offset:
        snap = start["snap"] or {}
        held = self._snapshot_for(str(snap.get("text", "")))
        if held.text != snap.get("text"):
            # a new snapshot after a restart: keep the first one's visibility (the skip rule), note the new text
            snap = {**snap, "text": held.text}
        after = start.get("after")
        upto = next_boundary(held, self.info, after, self.chunk_rows)
        if upto is not None:
            return {**start, "after": upto, "snap": snap}
        # the last range: read the rest (up to the snapshot's last key, so that a replay outside
        # the snapshot reads no row added since), then the stream (or the end)
        nxt = "done" if self.snapshot_mode == "initial_only" else "stream"
        return {**start, "phase": nxt, "after": after, "snap": snap, "last": last_key(held, self.info, after)}

    def _read_snapshot(self, p: SnapshotPartition) -> Iterator[pa.RecordBatch]:
        if not p.empty:
            yielded = False
            try:
                held = self._snapshot_for(p.snap_text)
                with held.lock:
                    for b in read_range(held.conn, self.info, self._schema, self._types, p.after, p.upto,
                                        p.time_us or held.time_us):  # fmt: skip
                        yielded = True
                        yield b
            except Exception as e:
                if yielded or not self._lost_snapshot(e):
                    raise  # rows of the range already went out: the batch fails and is replayed
                held = self._snapshot_for(p.snap_text)
                with held.lock:
                    yield from read_range(held.conn, self.info, self._schema, self._types, p.after, p.upto,
                                          p.time_us or held.time_us)  # fmt: skip
        if p.final and self._held is not None:
            self._held.close()
            self._held = None
