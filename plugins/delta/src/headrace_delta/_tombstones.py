"""Delete tombstones of the delta sink's AUTO CDC SCD type 1 mode (with ``sequenceBy``).

A delete removes the key's row, so an older event of the key arriving in a later batch (out of
order) would bring it back. The sink keeps each deleted key with the sequence of its newest
delete in a headrace state store (:mod:`headrace.state`, memory backend) in its checkpoint
folder (in a temporary folder, without fsync, when the sink has no checkpoint)::

    <sink folder>/tombstones/from-<b>/     the store: metadata, changelog/<v>, snapshot/<v>
        key columns -> __headrace_seq; the store's eviction order: the delete's wall-clock
        time in microseconds

The store's version ``v`` is batch ``b + v``: ``b`` is the first batch with events the store
saw (a query may turn tombstones on after it started, and a store's versions start at 0); it
is in the folder's name, written once with the folder. A rollback to ``b`` or before
(``checkpoint reset``) starts the store over: none of its tombstones are older.
Per batch ``n``, in the sink's commit, before the MERGE:

1. ``load(n-1)``: free when the store is there already (the batch after the last one); a
   restore (one snapshot and the changelogs since) on a new run or a replay. Later versions,
   written by a run that crashed before its MERGE, are discarded, so a replay of ``n`` sees
   exactly the tombstones of the batches before ``n``.
2. ``get`` of the batch's keys: an upsert strictly older than its key's tombstone is dropped,
   a delete not newer than it is dropped.
3. ``evict`` of the tombstones older than ``tombstoneRetention`` (by wall clock; after the
   check, so a replay checks against the same ones).
4. ``put`` of the batch's remaining deletes (newer than any earlier tombstone of their key).
5. ``commit(n - b)``: the batch's changelog written atomically and fsynced, so batch ``n``'s
   tombstones are durable before its MERGE commits.

Work per batch grows with the batch's keys (plus the tombstones expiring), never with the
tombstones kept: the store's snapshot (the state's size) is written in the background once
the changelogs since the last one hold half as many rows as the state. Memory: the
tombstones within the retention, once (the memory backend's columns and key index). A batch
without events still commits an empty version (the versions have no gaps); so does a batch
skipped because its transaction is in the table, unless its version exists (committed before
that MERGE: a replay after a crash). A damaged store is refused with ``CheckpointError`` naming the file.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from headrace.errors import CheckpointError
from headrace.helpers.auto_cdc import DELETE, SEQ, AutoCdcError

__all__ = ["FOLDER", "TombstoneStore"]

log = logging.getLogger(__name__)

FOLDER = "tombstones"
_STORE = re.compile(r"from-(\d+)")
_RETAIN = 100  # store versions restorable (a replay needs one; `checkpoint reset` may roll back more)


class TombstoneStore:
    """The tombstones of one sink. ``folder``: the sink's checkpoint folder (None: a temporary
    folder, removed by :meth:`close`). ``clock``: wall-clock seconds (tests age tombstones with
    it). Built with the sink (no I/O); the store opens at the first batch with events. Not
    thread-safe: used by the sink's commit, once per batch, on the driver."""

    def __init__(self, folder: str | None, retention: float, *, clock: Callable[[], float] = time.time) -> None:
        self.root = os.path.join(folder, FOLDER) if folder else None
        self.retention = retention
        self.clock = clock
        self.durable = folder is not None
        self.store: Any = None  # headrace.state.StateStore, once open
        self._base = 0
        self._temp: str | None = None

    # ------------------------------------------------------------------ per batch
    def apply(self, latest: pa.Table, keys: Sequence[str], batch_id: int) -> pa.Table:
        """Drop from ``latest`` (one event per key, :func:`last_per_key` output) the events that
        a tombstone of an earlier batch makes obsolete; record the remaining deletes as batch
        ``batch_id``'s tombstones (durably, before the caller's MERGE). Returns the events to
        apply. Called once per batch by the sink's commit (again for a replayed batch)."""
        keys = list(keys)
        store = self._open(latest.schema, keys, batch_id)
        self._load(batch_id)
        key_table = pa.Table.from_arrays([latest.column(k) for k in keys], schema=store.key_schema)
        if latest.num_rows and len(store):
            stored, found = store.get(key_table)
            if found.any():
                seq, tseq = latest.column(SEQ), stored.column(SEQ)
                is_del = pc.fill_null(latest.column(DELETE), False)
                obsolete = pc.fill_null(pc.if_else(is_del, pc.less_equal(seq, tseq), pc.less(seq, tseq)), False)
                keep = pc.invert(obsolete)
                latest, key_table = latest.filter(keep), key_table.filter(keep)
        now = self.clock()
        expired = store.evict(int((now - self.retention) * 1e6))
        if expired.num_rows:
            log.debug("delta tombstones: %d expired (older than %.0f s)", expired.num_rows, self.retention)
        if latest.num_rows:
            is_del = pc.fill_null(latest.column(DELETE), False)
            if pc.any(is_del).as_py():
                dk = key_table.filter(is_del)
                values = pa.Table.from_arrays([latest.column(SEQ).filter(is_del)], schema=store.value_schema)
                store.put(dk, values, np.full(dk.num_rows, int(now * 1e6), dtype=np.int64))
        store.commit(batch_id - self._base)
        return latest

    def advance(self, batch_id: int, keys: Sequence[str], prepared: pa.Schema | None) -> None:
        """Commit batch ``batch_id`` without events (expired tombstones evicted), so that the
        store's versions have no gap. ``prepared``: the schema of the batch's events as
        :func:`headrace.helpers.auto_cdc.prepare` makes them (None: unknown). Called by the
        sink's commit for a batch with no events (and by :meth:`skipped`)."""
        if self.store is None and self._existing_base() is None:
            return  # no tombstones yet: the store starts at the first batch with events
        if self.store is None and prepared is None:
            raise CheckpointError(
                f"delta: batch {batch_id} has no events and no schema, and the tombstone store in {self.root} "
                "needs the key and sequence types to open; run the query with a known schema"
            )
        if self.store is not None:
            schema = pa.schema([*self.store.key_schema, *self.store.value_schema, pa.field(DELETE, pa.bool_())])
        else:
            assert prepared is not None
            schema = prepared
        self.apply(schema.empty_table(), keys, batch_id)

    def skipped(self, batch_id: int, keys: Sequence[str], prepared: pa.Schema | None) -> None:
        """Batch ``batch_id``'s MERGE is already in the table (its transaction is in the log):
        its version was committed before that MERGE, unless the batch never reached the store
        (``txnAppId``/``txnVersion`` set by the user skip whole batches): then commit it
        without events, so that the versions have no gap. Called by the sink's commit for a
        skipped batch: a listing of the store's changelog folder, or an empty commit."""
        base = self._base if self.store is not None else self._existing_base()
        if base is None or batch_id < base:
            return  # nothing recorded for it: the next batch with events starts (over) there
        if self.store is not None and self.store.version == batch_id - base:
            return
        if self.store is None:
            if prepared is None:
                return  # cannot open: the next batch refuses a gap, if there is one
            self._open(prepared, list(keys), batch_id, keep=True)
        if batch_id - base in self.store.changelog_versions():
            return  # committed before its MERGE (a replay after a crash): the next batch loads it
        self.advance(batch_id, keys, prepared)

    def scan(self) -> pa.Table:
        """Every tombstone (keys, ``__headrace_seq``, ``__order``: the delete's wall-clock time
        in microseconds). Reads the whole store: tests and debugging only."""
        return self.store.scan() if self.store is not None else pa.table({})

    def close(self) -> None:
        """Finish the store's background work; remove a temporary folder. Idempotent. Called
        by the sink's close."""
        if self.store is not None:
            self.store.close()
            self.store = None
        if self._temp is not None:
            shutil.rmtree(self._temp, ignore_errors=True)
            self._temp = None

    # ------------------------------------------------------------------ store life cycle
    def _folder(self) -> str:
        if self.root is not None:
            return self.root
        if self._temp is None:
            self._temp = tempfile.mkdtemp(prefix="headrace-delta-tombstones-")
        return self._temp

    def _existing_base(self) -> int | None:
        """The first batch of the store in the folder, or None when there is none. Raises when
        the folder holds more than one store (never written so: damaged)."""
        folder = self._folder()
        try:
            names = os.listdir(folder)
        except FileNotFoundError:
            return None
        bases = sorted(int(m.group(1)) for n in names if (m := _STORE.fullmatch(n)))
        if len(bases) > 1:
            raise CheckpointError(
                f"delta: the tombstone folder {folder} holds several stores ({', '.join(f'from-{b}' for b in bases)}); "
                "it was changed outside headrace: restore it from a backup, or delete the folder to start "
                "without tombstones (events older than a recorded delete may then bring rows back)"
            )
        return bases[0] if bases else None

    def _open(self, schema: pa.Schema, keys: list[str], batch_id: int, keep: bool = False) -> Any:
        """The store, opened for batch ``batch_id``; started over when that batch is its first
        one or before (``keep``: never, the caller only looks)."""
        key_schema = pa.schema([pa.field(k, schema.field(k).type) for k in keys])
        value_schema = pa.schema([pa.field(SEQ, schema.field(SEQ).type)])
        store = self.store
        if store is not None:
            if not (store.key_schema.equals(key_schema) and store.value_schema.equals(value_schema)):
                raise AutoCdcError(
                    f"delta: the tombstones in {store.path} have keys {store.key_schema} and sequence "
                    f"{store.value_schema.field(SEQ).type}, and batch {batch_id}'s events {key_schema} and "
                    f"{value_schema.field(SEQ).type}; the keys or sequenceBy changed: delete {self._folder()} to "
                    "start without tombstones"
                )
            if batch_id > self._base or keep:
                return store
            store.close()  # rolled back to the store's first batch or before: none of it applies
            self.store = None
        base = self._existing_base()
        folder = self._folder()
        if base is not None and batch_id <= base and not keep:
            shutil.rmtree(os.path.join(folder, f"from-{base}"))
            base = None
        if base is None:
            base = batch_id
        from headrace.helpers.durable import open_state_store

        path = os.path.join(folder, f"from-{base}")
        try:
            self.store = open_state_store("memory", path, key_schema, value_schema, retain=_RETAIN,
                                          durable=self.durable, description="delta AUTO CDC tombstones")  # fmt: skip
        except CheckpointError as e:
            raise CheckpointError(
                f"delta: the tombstone store {path} cannot be opened for keys {key_schema.names} "
                f"(sequence {value_schema.field(SEQ).type}): {e}. If keys or sequenceBy changed, delete {folder} "
                "to start without tombstones"
            ) from None
        self._base = base
        return self.store

    def _load(self, batch_id: int) -> None:
        try:
            self.store.load(batch_id - 1 - self._base)
        except CheckpointError as e:
            raise CheckpointError(
                f"delta: the tombstones as of batch {batch_id - 1} cannot be restored from {self.store.path}: {e}. "
                "If tombstoneRetention was 0 for some batches of this query, their tombstones are missing: "
                f"delete {self._folder()} to start without tombstones"
            ) from None
