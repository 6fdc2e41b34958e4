"""Delete tombstones of the delta sink's AUTO CDC SCD type 1 mode (with ``sequenceBy``).

A delete removes the key's row, so an older event of the key arriving in a later batch (out of
order) would bring it back. The sink keeps the deleted keys with the sequence of their delete
in one Arrow IPC file in its checkpoint folder (``<checkpoint>/sinks/.../tombstones.arrow``;
in memory when the sink has no checkpoint)::

    <key columns>, __headrace_seq, __headrace_batch (int64), __headrace_deleted_at (float64, epoch s)

Batch ``n``'s events are checked against the tombstones of batches before ``n`` (a replay of
``n`` after a crash sees the same ones, so it drops the same events): an upsert strictly older
than its key's tombstone is dropped, a delete not newer than it is dropped. Before the MERGE,
the file is replaced atomically (write, fsync, rename) by: the earlier batches' tombstones,
the highest per key, without those older than ``tombstoneRetention`` (by wall clock), plus
batch ``n``'s deletes. Memory: the tombstones within the retention, read once per batch.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from headrace.transforms.auto_cdc import DELETE, SEQ, AutoCdcError, last_per_key

__all__ = ["BATCH", "DELETED_AT", "TombstoneFile"]

BATCH = "__headrace_batch"
DELETED_AT = "__headrace_deleted_at"
_IDX = "__headrace_idx"
_TSEQ = "__headrace_tomb_seq"
FILE_NAME = "tombstones.arrow"


class TombstoneFile:
    """The tombstones of one sink. ``folder`` None: kept in memory (no checkpoint). Not
    thread-safe: used by the sink's commit, once per batch, on the driver."""

    def __init__(self, folder: str | None, retention: float) -> None:
        self.path = os.path.join(folder, FILE_NAME) if folder else None
        self.retention = retention
        self._memory: pa.Table | None = None

    def load(self) -> pa.Table | None:
        if self.path is None:
            return self._memory
        if not os.path.exists(self.path):
            return None
        with pa.memory_map(self.path) as src:
            return pa.ipc.open_file(src).read_all()

    def save(self, table: pa.Table) -> None:
        if self.path is None:
            self._memory = table
            return
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        tmp = self.path + ".tmp"
        with open(tmp, "wb") as f:
            with pa.ipc.new_file(f, table.schema) as w:
                w.write_table(table)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        with contextlib.suppress(OSError):  # the rename durable (not on every platform)
            fd = os.open(os.path.dirname(self.path), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def apply(self, latest: pa.Table, keys: Sequence[str], batch_id: int) -> pa.Table:
        """Drop from ``latest`` (one event per key, :func:`last_per_key` output) the events that
        a tombstone of an earlier batch makes obsolete; record the remaining deletes as batch
        ``batch_id``'s tombstones (durably, before the caller's MERGE). Returns the events to
        apply. Called once per batch by the sink's commit."""
        keys = list(keys)
        stored = self.load()
        earlier = None
        if stored is not None and stored.num_rows:
            if [stored.schema.field(k).type for k in keys] != [latest.schema.field(k).type for k in keys] or (
                stored.schema.field(SEQ).type != latest.schema.field(SEQ).type
            ):
                raise AutoCdcError(
                    f"the tombstones in {self.path} have key/sequence types {stored.schema} that differ from the "
                    f"stream's; the keys or sequenceBy changed: delete the file to start without tombstones"
                )
            earlier = stored.filter(pc.less(stored[BATCH], batch_id))
            if earlier.num_rows:
                latest = _drop_obsolete(latest, earlier, keys)
        deletes = latest.filter(pc.fill_null(latest[DELETE], False)).select([*keys, SEQ])
        now = time.time()
        new = deletes.append_column(BATCH, pa.array(np.full(deletes.num_rows, batch_id, dtype=np.int64))).append_column(
            DELETED_AT, pa.array(np.full(deletes.num_rows, now, dtype=np.float64))
        )
        kept = _compact(earlier, keys, now - self.retention) if earlier is not None and earlier.num_rows else None
        if kept is not None or new.num_rows or stored is not None:
            self.save(pa.concat_tables([kept, new]) if kept is not None else new)
        return latest


def _drop_obsolete(latest: pa.Table, tombs: pa.Table, keys: list[str]) -> pa.Table:
    best = tombs.group_by(keys, use_threads=False).aggregate([(SEQ, "max")]).rename_columns([*keys, _TSEQ])
    idx = latest.select(keys).append_column(_IDX, pa.array(np.arange(latest.num_rows, dtype=np.int64)))
    joined = idx.join(best, keys, join_type="left outer", use_threads=False)
    seq = latest[SEQ].take(joined[_IDX])
    is_del = pc.fill_null(latest[DELETE].take(joined[_IDX]), False)
    tseq = joined[_TSEQ]
    obsolete = pc.fill_null(pc.if_else(is_del, pc.less_equal(seq, tseq), pc.less(seq, tseq)), False)
    keep = np.sort(joined[_IDX].filter(pc.invert(obsolete)).to_numpy())
    return latest.take(pa.array(keep))


def _compact(tombs: pa.Table, keys: list[str], expire_before: float) -> pa.Table | None:
    """The highest tombstone per key, without those recorded before ``expire_before``."""
    fresh = tombs.filter(pc.greater_equal(tombs[DELETED_AT], expire_before))
    if not fresh.num_rows:
        return None
    flagged = fresh.append_column(DELETE, pa.array(np.ones(fresh.num_rows, dtype=bool)))
    return last_per_key(flagged, keys).drop_columns([DELETE])
