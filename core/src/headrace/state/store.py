"""``StateStore``: a stateful operator's keyed state, versioned by batch id.

An operator opens one store (:func:`open_state_store`) with its key and value schemas, then per
batch ``n``::

    store.load(n - 1)                 # state as of batch n-1 (a no-op when it is already there)
    values, found = store.get(keys)   # the rows for the keys this batch touches
    store.put(keys, values, order)    # new or changed rows (order: event time to evict by)
    store.remove(keys) / store.evict(watermark)
    store.commit(n)                   # changelog/<n> written (atomic, fsynced, checksummed)

``commit(n, wait=False)`` (what the operators do) hands the changelog's write and fsyncs to
the state I/O threads and returns at once; :meth:`StateStore.pending_write` is then a
:class:`PendingWrite` whose ``result()`` returns once version ``n`` is durable (writing it
there and then if no thread has started it). The engine calls it on the checkpoint's I/O
thread, in the job that then writes batch ``n``'s commit marker, so the changelog's fsync
overlaps the sink's write, the offsets entry's fsync and the next batch; the second
``commit`` after it, ``load``, ``flush`` and ``close`` wait for it too, so at most two
changelogs are pending per store.

Work per batch is proportional to the keys the batch touches: ``commit`` writes only the rows
put or removed in the batch; a snapshot is written once at least ``snapshot_interval``
changelogs were written since the last one (in the background for the memory backend, which
also waits until those changelogs hold half as many rows as the state, so that rewriting the
state amortises to the rows changed; as a RocksDB checkpoint for the RocksDB backend), so a
restore reads one snapshot and a bounded run of changelogs. Files older than what is needed to
restore the last ``retain`` versions are deleted.

Replaying batch ``n`` after a crash (even one after ``commit(n)``) loads version ``n-1``: files
of later versions are discarded, so the replay produces the same output as the first run.
A damaged or missing file that the restore needs is refused with ``CheckpointError`` naming it,
as is a file or folder that records another query, operator, partition, kind or version than
its place (``query_id``, ``operator_id``, ``partition``: see :mod:`headrace.state.version_files`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from headrace.checkpoint import atomic_write
from headrace.errors import CheckpointError, UnsupportedError
from headrace.state.backends import BACKENDS
from headrace.state.metadata import FORMAT_VERSION, SPEC_FIELD, check_metadata, schema_doc
from headrace.state.version_files import (
    OP_COLUMN,
    OP_PUT,
    OP_REMOVE,
    ORDER_COLUMN,
    discard_after,
    file_identity,
    layout_problem,
    list_versions,
    purge,
    read_state_file,
    remove_temporaries,
    write_state_file,
)

__all__ = ["BACKENDS", "PendingWrite", "StateStore", "WorkCounters", "open_state_store"]

log = logging.getLogger(__name__)



@dataclass
class WorkCounters:
    """Cumulative work done by a store, for tests that check the cost of a batch without
    timing it: rows looked up, written, removed, scanned (evict/scan), changelog rows written,
    and rows read back during restores and snapshots."""

    rows_looked_up: int = 0
    rows_written: int = 0
    rows_removed: int = 0
    rows_scanned: int = 0
    changelog_rows: int = 0
    restore_rows: int = 0
    snapshot_rows: int = 0
    snapshots: int = 0

    def copy(self) -> WorkCounters:
        return WorkCounters(**self.__dict__)

    def minus(self, other: WorkCounters) -> dict[str, int]:
        return {k: v - getattr(other, k) for k, v in self.__dict__.items()}


@dataclass
class _BatchStats:
    updated: int = 0
    removed: int = 0
    ops: list[pa.Table] = field(default_factory=list)


class StateStore(ABC):
    """Keyed rows (key columns -> value columns, plus an optional event-time ``order`` the
    store evicts by), versioned by batch id. Not thread-safe: one operator, one thread.

    ``key_schema``/``value_schema``: Arrow schemas of the keys and values. Keys passed to one
    ``put``/``remove`` call must be unique within that call.
    """

    backend: str = ""

    def __init__(
        self,
        path: str,
        key_schema: pa.Schema,
        value_schema: pa.Schema,
        *,
        retain: int = 100,
        snapshot_interval: int = 10,
        durable: bool = True,
        description: str = "",
        operator_spec: Mapping[str, Any] | None = None,
        query_id: str = "",
        operator_id: str = "",
        partition: int = 0,
    ) -> None:
        if snapshot_interval < 1:
            raise ValueError(f"snapshot_interval must be at least 1, not {snapshot_interval}")
        self.path = os.path.abspath(path)
        self.key_schema = key_schema
        self.value_schema = value_schema
        self.retain = max(1, int(retain))
        self.snapshot_interval = int(snapshot_interval)
        self.durable = durable
        self.description = description
        self.operator_spec = dict(operator_spec) if operator_spec is not None else None
        # what every file of this folder records (see files.py): whose state it is
        self.query_id, self.operator_id, self.partition = str(query_id), str(operator_id), int(partition)
        self._identity_since = 0  # files of versions before it may be of the earlier format (no identity)
        self.file_schema = pa.schema(
            [*key_schema, *value_schema, pa.field(ORDER_COLUMN, pa.int64()), pa.field(OP_COLUMN, pa.int8())]
        )
        self.version: int | None = None  # the version the working state is at (None: unknown)
        self._dirty = False  # changed since the last load/commit
        self.work = WorkCounters()
        self._batch = _BatchStats()
        self._snap_base = -1  # version of the newest snapshot (-1: none)
        self._due_snapshot: int | None = None  # a committed version whose snapshot is due
        self._rows_since_snap = 0  # changelog rows written since it (restores and commits)
        self._last_metrics: dict[str, Any] = {}
        self.metadata: dict[str, Any] = {}  # the state folder's metadata document
        self._pending: deque[PendingWrite] = deque()  # changelogs of commit(wait=False) not yet known durable
        self._meta_write: PendingWrite | None = None  # a new folder's metadata, until it is written
        self._make_layout()
        self._check_metadata()

    # ------------------------------------------------------------------ metadata
    def _make_layout(self) -> None:
        """Create the folder and its ``changelog``/``snapshot`` folders; a file in the place of
        one of them (or a folder in the place of ``metadata``) is refused with ``CheckpointError``."""
        for folder in (self.path, os.path.join(self.path, "changelog"), os.path.join(self.path, "snapshot")):
            try:
                os.makedirs(folder, exist_ok=True)
            except (FileExistsError, NotADirectoryError):
                raise CheckpointError(
                    f"state folder {folder} cannot be used ({layout_problem(os.path.join(folder, 'x'))}, or "
                    f"{folder} is a file); the checkpoint's layout was changed outside headrace; restore it from a "
                    "backup, or start the query over with a new checkpointLocation"
                ) from None
        meta = os.path.join(self.path, "metadata")
        if os.path.isdir(meta):
            raise CheckpointError(
                f"state metadata {meta} is a folder, not a file; the checkpoint's layout was changed outside "
                "headrace; restore it from a backup, or start the query over with a new checkpointLocation"
            )

    def _identity_doc(self) -> dict[str, Any]:
        return {"queryId": self.query_id, "operatorId": self.operator_id, "partition": self.partition}

    def _check_metadata(self) -> None:
        doc = {
            "version": FORMAT_VERSION,
            "backend": self.backend,
            "keySchema": schema_doc(self.key_schema),
            "valueSchema": schema_doc(self.value_schema),
            "operator": self.description,
            **({SPEC_FIELD: self.operator_spec} if self.operator_spec is not None else {}),
            **self._identity_doc(),
            **self._metadata_extra(),
        }
        self.metadata = check_metadata(self.path, doc, durable=self.durable, write=self._write_metadata_later)
        self._check_stored_metadata(self.metadata)
        self._check_identity(self.metadata)

    def _check_identity(self, meta: dict[str, Any]) -> None:
        """Refuse a folder whose ``metadata`` records another query, operator or partition (a
        state folder copied or swapped from elsewhere); record this store's identity in a folder
        written before identities existed, with ``identitySince``: the first version whose files
        must record theirs (files of earlier versions are of the earlier format)."""
        path = os.path.join(self.path, "metadata")
        mine = self._identity_doc()
        if "queryId" not in meta:
            since = 1 + max([*self.changelog_versions(), *self._snapshot_versions(), -1])
            meta.update(mine, identitySince=since)
            atomic_write(path, json.dumps(meta, indent=1).encode(), durable=self.durable)
            log.info("state %s: written by an earlier headrace; files from version %d on record their identity",
                     self.path, since)  # fmt: skip
        stored = {k: meta.get(k) for k in mine}
        if stored != mine:
            wrong = ", ".join(f"{k} {stored[k]!r} (this query's: {mine[k]!r})" for k in mine if stored[k] != mine[k])
            raise CheckpointError(
                f"state in {self.path} belongs to another query or operator: its metadata {path} records {wrong}; "
                "the state folder was copied or swapped from another checkpoint (or operator); put this "
                "checkpoint's own state folder back, or start the query over with a new checkpointLocation"
            )
        since = meta.get("identitySince", 0)
        if not isinstance(since, int) or isinstance(since, bool) or since < 0:
            raise CheckpointError(f"state metadata {path} is corrupt (identitySince is {since!r}, not a version); "
                                  "restore it or use a new checkpointLocation")  # fmt: skip
        self._identity_since = since

    def _check_stored_metadata(self, meta: dict[str, Any]) -> None:
        """Backend checks of the folder's stored ``metadata`` (raise ``CheckpointError``), before
        anything is written to it. Called once, when the store opens."""

    def file_identity(self, kind: str, version: int) -> dict[str, Any]:
        """What this folder's ``kind`` (``changelog`` or ``snapshot``) file of ``version`` holds
        (written into it, checked when it is read)."""
        return file_identity(self.query_id, self.operator_id, self.partition, kind, version)

    def read_file(self, path: str) -> pa.Table:
        """Read and verify one of this folder's changelogs or snapshots (``<kind>/<version>``):
        that it is whole and holds what its path says (:func:`files.read_state_file`). Called
        by restores and snapshots, on their thread."""
        kind, name = os.path.basename(os.path.dirname(path)), os.path.basename(path)
        version = int(name) if name.isdigit() else -1
        return read_state_file(path, self.file_identity(kind, version), legacy=version < self._identity_since)

    def _write_metadata_later(self, path: str, data: bytes) -> None:
        # A new folder's metadata is written (atomically, fsynced) on the state I/O threads,
        # not on the query's start path (an fsync: ~1-4 ms on a busy disk). It is the first
        # pending write: every changelog write waits for it (so no changelog, hence no commit
        # marker, exists without it), and flush/close/load wait for it like any pending write.
        durable = self.durable
        pending = PendingWrite(lambda: atomic_write(path, data, durable=durable))
        self._meta_write = pending
        self._pending.append(pending)
        _io_pool().submit(pending.run_quietly)

    def _metadata_extra(self) -> dict[str, Any]:
        """Backend fields of a new state folder's ``metadata`` (an existing folder keeps its own:
        read them from :attr:`metadata`)."""
        return {}

    # ------------------------------------------------------------------ paths
    def changelog_path(self, version: int) -> str:
        return os.path.join(self.path, "changelog", str(version))

    def snapshot_path(self, version: int) -> str:
        return os.path.join(self.path, "snapshot", str(version))

    def changelog_versions(self) -> list[int]:
        return list_versions(os.path.join(self.path, "changelog"))

    # ------------------------------------------------------------------ public API
    def load(self, version: int) -> None:
        """Make the working state the state as of ``version`` (``-1``: empty). Called by the
        operator in ``begin`` of batch ``version + 1``; free when the state is already there
        (the batch after the last commit), a restore from files otherwise (a new run, a
        replay after a crash)."""
        if version < -1:
            raise ValueError(f"state version must be -1 or more, not {version}")
        self._batch = _BatchStats()
        if not self._dirty and self.version == version:
            self._start_due_snapshot()  # the last commit's snapshot, if due: now that a batch follows
            return  # a background snapshot may still be running: it only reads committed files
        with contextlib.suppress(Exception):  # a failed write failed its batch: restored from files below
            self.flush()
        self._wait_background()
        for folder in ("changelog", "snapshot"):
            remove_temporaries(os.path.join(self.path, folder))
        t0 = time.monotonic()
        self._rows_since_snap = 0
        self._restore(version)
        self._discard_after(version)
        self._snap_base = max([s for s in self._snapshot_versions() if s <= version], default=-1)
        self.version = version
        self._dirty = False
        log.info("state %s restored to version %d in %.1f ms", self.path, version, (time.monotonic() - t0) * 1e3)

    @abstractmethod
    def get(self, keys: pa.Table) -> tuple[pa.Table, np.ndarray]:
        """The value rows of ``keys`` (nulls where a key has no row) and a boolean array telling
        which keys were found. Called once or more per batch, for the keys the batch touches."""

    def put(
        self, keys: pa.Table, values: pa.Table, order: pa.Array | np.ndarray | None = None, *, absent: bool = False
    ) -> None:
        """Insert or replace the rows of ``keys`` (unique within the call). ``order`` (int64 per
        row, e.g. a window's end in microseconds) is what :meth:`evict` compares to.
        ``absent``: the caller has looked every one of ``keys`` up with :meth:`get` since the
        last change of the state and none was found (a deduplication's new keys), so the
        backend need not read their old rows again; a wrong ``absent`` corrupts the state."""
        n = keys.num_rows
        if not n:
            return
        if values.num_rows != n:
            raise ValueError(f"put: {n} keys but {values.num_rows} value rows")
        order_arr = self._order_array(order, n)
        self._dirty = True
        if absent:
            self._known_absent(keys)
        self._put(keys, values, order_arr)
        self._log_put(keys, values, order_arr)

    def _log_put(self, keys: pa.Table, values: pa.Table, order_arr: pa.Array) -> None:
        """Count and log (for this batch's changelog) rows written by ``put`` or ``add``."""
        n = keys.num_rows
        self.work.rows_written += n
        self._batch.updated += n
        cols = [*keys.columns, *values.columns, order_arr, pa.array(np.full(n, OP_PUT, np.int8))]
        self._batch.ops.append(pa.Table.from_arrays(cols, schema=self.file_schema))

    def earliest_order(self) -> int | None:
        """A lower bound of the smallest ``order`` in the working state (what :meth:`evict`
        would reach first), or ``None`` when no row has one. Cheap (no scan); may be lower
        than the true smallest (an entry evicted or re-ordered since). Called between batches.
        This base class cannot tell: it returns the smallest int64 (an eviction may be due)."""
        return -(2**63)

    def add(self, keys: pa.Table, values: pa.Table, order: pa.Array | np.ndarray | None = None) -> pa.Table | None:
        """Add ``values`` to the rows of ``keys`` column by column, in place, and return the
        sums (value rows, as :meth:`put` writes them), when the backend can do it without a
        :meth:`get` and a :meth:`put`; ``None`` (nothing done) otherwise, and the caller gets,
        merges and puts. Called once per batch by aggregations whose partials all merge by
        addition (counts, sums). This base class does nothing."""
        return None

    def remove(self, keys: pa.Table) -> int:
        """Remove the rows of ``keys`` (unique within the call; absent keys are ignored).
        Returns how many existed."""
        if not keys.num_rows:
            return 0
        self._dirty = True
        removed = self._remove(keys)
        self._log_removal(keys, removed)
        return removed

    def evict(self, upto: int) -> pa.Table:
        """Remove every row whose ``order`` is ``<= upto`` and return them (keys and values,
        plus ``__order``). Work is proportional to the rows evicted."""
        self._dirty = True
        out = self._evict(upto)
        if out.num_rows:
            self._log_removal(out.select(self.key_schema.names), out.num_rows)
        return out

    @abstractmethod
    def scan(self) -> pa.Table:
        """Every row (keys, values, ``__order``). Reads the whole state: only complete mode
        and tests use it."""

    @abstractmethod
    def __len__(self) -> int:
        """The number of rows (keys) in the working state."""

    def commit(self, version: int, *, wait: bool = True) -> None:
        """Make this batch's changes durable as ``version``: ``changelog/<version>`` written
        atomically (fsynced, checksummed, its folder fsynced), then the backend's own
        bookkeeping, a snapshot every ``snapshot_interval`` versions and the retention
        clean-up. Called once per batch, in the operator's ``finish``, before its output is
        handed to the sink.

        With ``wait=False`` the changelog is written and fsynced on the store's writer thread:
        the working state is at ``version`` at once, and :meth:`pending_write` is the future
        that is done once ``version`` is durable (the engine waits for it before the batch's
        commit marker; the next ``commit``, ``load``, ``flush`` and ``close`` wait for it)."""
        if self.version is None or version != self.version + 1:
            raise CheckpointError(
                f"state {self.path}: commit of version {version} after version {self.version}; "
                "an operator must load version n-1 before committing n"
            )
        t0 = time.monotonic()
        while len(self._pending) > (0 if wait else 1):  # written by the engine's I/O thread, as a rule
            self._pending.popleft().result()  # its error surfaces here
        ops = self._batch.ops
        path, schema, durable = self.changelog_path(version), self.file_schema, self.durable
        meta, self._meta_write = self._meta_write, None
        identity = self.file_identity("changelog", version)

        def write() -> None:
            if meta is not None:
                meta.result()  # the folder's metadata first (normally written long before)
            write_state_file(path, schema, ops, identity=identity, durable=durable, sync_dir=True)

        if wait:
            write()
        else:
            pending = PendingWrite(write)
            self._pending.append(pending)
            _io_pool().submit(pending.run_quietly)  # started now: its fsync overlaps the offsets entry's
        logged = sum(t.num_rows for t in ops)
        self.work.changelog_rows += logged
        self._rows_since_snap += logged
        self._commit_backend(version)
        self.version = version
        self._dirty = False
        # a due snapshot starts when the next batch loads this version (or at settle()), not
        # now: a run's last batch starts none that its stop would have to wait for
        self._due_snapshot = version if self._snapshot_due(version) else None
        if version % self.snapshot_interval == 1 or self.snapshot_interval == 1:
            self._purge(version)
        self._last_metrics = {
            "numRowsTotal": len(self),
            "numRowsUpdated": self._batch.updated,
            "numRowsRemoved": self._batch.removed,
            "memoryUsedBytes": self.memory_used_bytes(),
            "commitTimeMs": int((time.monotonic() - t0) * 1000),
        }
        self._batch = _BatchStats()

    def pending_write(self) -> PendingWrite | None:
        """The last ``commit(wait=False)``'s changelog write while it may be pending (its
        ``result()`` writes it if nobody has, and returns once that version is durable, or
        raises what failed the write); None after a synchronous commit. Thread-safe: the
        engine's checkpoint I/O thread calls it before it writes the batch's commit marker."""
        return self._pending[-1] if self._pending else None

    def flush(self) -> None:
        """Make every committed version durable (writing what is still pending, in order);
        raises what failed a write (its batch is then failed, and replayed from the version
        before on restart)."""
        while self._pending:
            self._pending.popleft().result()

    def abort(self) -> None:
        """Forget this batch's uncommitted changes (the next ``load`` restores from files)."""
        if self._dirty:
            self.version = None
        self._batch = _BatchStats()

    def metrics(self) -> dict[str, Any]:
        """Spark's state operator metrics of the last committed batch."""
        return dict(self._last_metrics) or {
            "numRowsTotal": len(self),
            "numRowsUpdated": 0,
            "numRowsRemoved": 0,
            "memoryUsedBytes": self.memory_used_bytes(),
            "commitTimeMs": 0,
        }

    @abstractmethod
    def memory_used_bytes(self) -> int:
        """An estimate of the memory the working state uses."""

    def settle(self) -> None:
        """Start the snapshot the last commit made due, and wait until background work (a
        snapshot being written) is done. Never needed for correctness; benches call it to keep
        an earlier batch's deferred work out of the batches they time."""
        self._start_due_snapshot()
        self._wait_background()

    def _start_due_snapshot(self) -> None:
        """Snapshot the committed version when its commit made one due (see :meth:`commit`).
        Called when the next batch loads that version, on the operator's thread."""
        version, self._due_snapshot = self._due_snapshot, None
        if version is None or version != self.version or self._dirty:
            return
        if self._snapshot(version):
            self._snap_base = version
            self._rows_since_snap = 0

    def close(self) -> None:
        """Finish background work and release files. Idempotent. A changelog write that failed
        is logged, not raised: the engine already failed its batch (it waits for the write
        before the batch's commit marker), which is replayed from the version before."""
        try:
            self.flush()
        except Exception as e:
            log.warning("state %s: the last changelog was not written (%s); its batch is replayed on restart", self.path, e)
        self._pending.clear()
        self._wait_background()

    # ------------------------------------------------------------------ for subclasses
    @abstractmethod
    def _put(self, keys: pa.Table, values: pa.Table, order: pa.Array) -> None: ...

    def _known_absent(self, keys: pa.Table) -> None:
        """``keys`` (of the ``_put`` that follows) are not in the state (``put(absent=True)``)."""

    @abstractmethod
    def _remove(self, keys: pa.Table) -> int: ...

    @abstractmethod
    def _evict(self, upto: int) -> pa.Table: ...

    @abstractmethod
    def _restore(self, version: int) -> None:
        """Rebuild the working state as of ``version`` from files."""

    def _commit_backend(self, version: int) -> None:
        """Backend bookkeeping after the changelog is durable."""

    #: a snapshot also waits until the rows changed since the last one reach this fraction of
    #: the state's rows (0: every ``snapshot_interval`` versions); see :meth:`_snapshot_due`
    snapshot_fraction: float = 0.0

    def _snapshot_due(self, version: int) -> bool:
        """Whether to snapshot ``version``: at least ``snapshot_interval`` changelogs since the
        last snapshot (Spark's ``minDeltasForSnapshot``) and, when the backend's snapshot costs
        the state's size (``snapshot_fraction`` > 0), once the changelog rows since then reach
        that fraction of the rows in state. The second rule amortises a snapshot's cost to the
        rows changed (at most ``(1 + f) / f`` rows written per row changed) while a restore
        still reads at most one snapshot plus about ``f`` times the state in changelogs."""
        if version - self._snap_base < self.snapshot_interval:
            return False
        return self._rows_since_snap >= self.snapshot_fraction * len(self)

    def _snapshot(self, version: int) -> bool:
        """Write (or start writing) a snapshot of ``version``; False when it was not started
        (it is then tried again at the next commit)."""
        return False

    def _wait_background(self) -> None:
        """Wait for a background snapshot."""

    def _snapshot_versions(self) -> list[int]:
        return list_versions(os.path.join(self.path, "snapshot"))

    def _log_removal(self, keys: pa.Table, removed: int) -> None:
        n = keys.num_rows
        self.work.rows_removed += removed
        self._batch.removed += removed
        nulls = [pa.nulls(n, f.type) for f in self.value_schema]
        cols = [*keys.columns, *nulls, pa.nulls(n, pa.int64()), pa.array(np.full(n, OP_REMOVE, np.int8))]
        self._batch.ops.append(pa.Table.from_arrays(cols, schema=self.file_schema))

    @staticmethod
    def _order_array(order: pa.Array | np.ndarray | None, n: int) -> pa.Array:
        if order is None:
            return pa.nulls(n, pa.int64())
        if isinstance(order, pa.ChunkedArray):
            order = order.combine_chunks()
        if isinstance(order, pa.Array):
            arr = order
        elif isinstance(order, np.ndarray):
            arr = pa.array(order.astype(np.int64, copy=False))
        else:  # a sequence, None for no order
            arr = pa.array(order, pa.int64())
        if arr.type != pa.int64():
            arr = arr.cast(pa.int64())
        if len(arr) != n:
            raise ValueError(f"put: {n} keys but {len(arr)} order values")
        return arr

    def _chain(self, start: int, version: int) -> list[str]:
        """Paths of changelogs ``start+1 .. version``; raises naming the first one missing."""
        paths = []
        for v in range(start + 1, version + 1):
            p = self.changelog_path(v)
            if not os.path.exists(p):
                self.read_file(p)  # raises CheckpointError naming the file
            paths.append(p)
        return paths

    def _apply_file(self, path: str) -> int:
        """Apply one changelog's (or snapshot's) operations, in order; returns its rows."""
        table = self.read_file(path)
        self.work.restore_rows += table.num_rows
        keys_n = len(self.key_schema)
        vals_n = len(self.value_schema)
        for rb in table.to_batches():
            if not rb.num_rows:
                continue
            op = rb.column(OP_COLUMN)[0].as_py()
            keys = pa.Table.from_arrays(rb.columns[:keys_n], schema=self.key_schema)
            if op == OP_PUT:
                values = pa.Table.from_arrays(rb.columns[keys_n : keys_n + vals_n], schema=self.value_schema)
                self._put(keys, values, rb.column(ORDER_COLUMN))
            else:
                self._remove(keys)
        return int(table.num_rows)

    def _discard_after(self, version: int) -> None:
        """Delete files of versions after ``version`` (written by a run that crashed before its
        batch committed): the replay writes them again."""
        discard_after(self.path, version)

    def _purge(self, version: int) -> None:
        """Keep what restores any of the last ``retain`` versions (:func:`files.purge`)."""
        purge(self.path, version - self.retain + 1, self._snapshot_versions())


_IO_POOL: ThreadPoolExecutor | None = None
_IO_LOCK = threading.Lock()


def _io_pool() -> ThreadPoolExecutor:
    """The threads that start pending state writes as soon as they are committed (shared by
    every store of the process, created on first use)."""
    global _IO_POOL
    with _IO_LOCK:
        if _IO_POOL is None:
            _IO_POOL = ThreadPoolExecutor(2, thread_name_prefix="headrace-state-io")
        return _IO_POOL


def _forget_io_pool() -> None:  # a forked child has none of the parent's threads: new ones on first use
    global _IO_POOL
    _IO_POOL = None


os.register_at_fork(after_in_child=_forget_io_pool)


class PendingWrite:
    """A state file write that runs once, on the first thread that asks for its ``result()``
    (the engine's checkpoint I/O thread, a background snapshot, or the store itself), and
    reports its outcome to every caller after that. Thread-safe."""

    def __init__(self, write: Callable[[], Any]) -> None:
        self._write: Callable[[], Any] | None = write
        self._lock = threading.Lock()
        self._error: BaseException | None = None

    def done(self) -> bool:
        """Whether the write has run (successfully or not)."""
        return self._write is None

    def run_quietly(self) -> None:
        """Run the write if nobody has (on the state I/O threads); its outcome is reported to
        whoever calls ``result()``."""
        with contextlib.suppress(BaseException):
            self.result()

    def result(self, timeout: float | None = None) -> None:
        """Run the write if it has not run; return once it is durable, or raise what failed
        it (also to later callers). ``timeout`` is accepted for ``Future`` compatibility; a
        caller that finds the write running waits for it."""
        with self._lock:
            write, self._write = self._write, None
            if write is not None:
                try:
                    write()
                except BaseException as e:
                    self._error = e
        if self._error is not None:
            raise self._error


def open_state_store(
    backend: str,
    path: str,
    key_schema: pa.Schema,
    value_schema: pa.Schema,
    *,
    retain: int = 100,
    snapshot_interval: int = 10,
    durable: bool = True,
    description: str = "",
    operator_spec: Mapping[str, Any] | None = None,
    query_id: str = "",
    operator_id: str = "",
    partition: int = 0,
    options: Mapping[str, Any] | None = None,
) -> StateStore:
    """A state store of ``backend`` (``memory`` or ``rocksdb``, the writer option
    ``stateStore``) in ``path``. Called once per operator per query run, in ``open``.
    ``query_id`` (the checkpoint's), ``operator_id`` and ``partition`` are recorded in the
    folder and in every file it writes, and checked when they are read back. ``options``:
    the backend's tuning, parsed (``rocksdbHeldKeysMB``: the memory in MiB a RocksDB store of
    a deduplication may hold new keys in; the memory backend takes none)."""
    name = (backend or "memory").lower()
    kwargs: dict[str, Any] = {"retain": retain, "snapshot_interval": snapshot_interval, "durable": durable,
                              "description": description, "operator_spec": operator_spec, "query_id": query_id,
                              "operator_id": operator_id, "partition": partition}  # fmt: skip
    if name == "memory":
        from headrace.state.memory import MemoryStateStore

        return MemoryStateStore(path, key_schema, value_schema, **kwargs)
    if name == "rocksdb":
        from headrace.state.rocksdb import RocksDBStateStore

        held_mb = (options or {}).get("rocksdbHeldKeysMB")
        held = None if held_mb is None else int(held_mb) << 20
        return RocksDBStateStore(path, key_schema, value_schema, held_keys_bytes=held, **kwargs)
    raise UnsupportedError(f"stateStore {backend!r} is not a state store; use one of: {', '.join(BACKENDS)}")
