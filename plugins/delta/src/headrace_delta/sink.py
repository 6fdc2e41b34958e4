"""``DeltaSink``: exactly-once appends (or complete rewrites) of a Delta table.

Appends (as Spark's Delta sink): ``write`` encodes the batch's rows as Parquet data files in
the table's folder as they arrive (no commit references them yet, so no reader sees them) and
returns their add actions; ``commit`` adds them in one Delta commit carrying an app
transaction ``(txnAppId or query id, txnVersion or batch id)``. Complete mode, AUTO CDC and
types a Delta table does not store as they are stage the rows as Arrow IPC in the sink's
checkpoint folder instead, and ``commit`` writes them with delta-rs. Either way a batch whose
transaction is already in the log is skipped, so a replay after a crash never duplicates rows;
the files of an attempt that died before its commit stay unreferenced (VACUUM removes them).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from headrace.errors import HeadraceError, UnsupportedError
from headrace.helpers.auto_cdc import AutoCdcSpec
from headrace.options import Options
from headrace.protocols import CommitMessage, Sink, SinkContext
from headrace_delta._files import DataFile, DataFileWriter, Layout, delete_files, direct_schema, read_back
from headrace_delta._options import (
    KEYS,
    MERGE_SCHEMA,
    OVERWRITE_SCHEMA,
    PARTITION_BY,
    PATH,
    STORAGE_PREFIX,
    STORED_AS_SCD_TYPE,
    TARGET_FILE_SIZE,
    TOMBSTONE_RETENTION,
    TRACK_HISTORY_COLUMN_LIST,
    TRACK_HISTORY_EXCEPT_COLUMN_LIST,
    TXN_APP_ID,
    TXN_VERSION,
    USER_METADATA,
)
from headrace_delta._schema import schema_mismatch_hint
from headrace_delta._storage import TableLocation

__all__ = ["DeltaSink", "StagedBatch", "WrittenFiles"]

_WRITER_FEATURES = frozenset({"appendOnly", "invariants", "timestampNtz", "deletionVectors", "changeDataFeed",
                              "v2Checkpoint", "vacuumProtocolCheck"})  # fmt: skip
"""Writer features a commit of plain add actions honours (the others: the rows go through delta-rs)."""

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StagedBatch(CommitMessage):
    """What one ``write`` staged: Arrow IPC files (possibly none) and their schema. Picklable."""

    batch_id: int
    files: tuple[str, ...]
    num_rows: int
    schema: bytes | None = None


@dataclass(frozen=True)
class WrittenFiles(CommitMessage):
    """What one ``write`` of an append wrote: Parquet data files in the table's folder, not yet
    committed, with the batch's Arrow schema and the layout they were written in. Picklable."""

    batch_id: int
    files: tuple[DataFile, ...]
    num_rows: int
    schema: bytes
    layout: Layout


class DeltaSink(Sink):
    """Writes each micro-batch in one Delta commit, idempotently per batch id.

    Built once per query run on the driver (and per task under Spark): cheap, no I/O.
    """

    idempotent_commit = True
    output_modes = ("append", "complete")

    def __init__(self, options: Options, context: SinkContext) -> None:
        super().__init__(options, context)
        self.loc = TableLocation(str(options[PATH]), options.passthrough(STORAGE_PREFIX))
        self.partition_by: list[str] | None = options[PARTITION_BY] or None
        self.merge_schema = bool(options[MERGE_SCHEMA])
        self.overwrite_schema = bool(options[OVERWRITE_SCHEMA])
        self.user_metadata: str | None = options[USER_METADATA]
        self.txn_app_id: str | None = options[TXN_APP_ID]
        self.txn_version: int | None = options[TXN_VERSION]
        self.target_file_size: int | None = options[TARGET_FILE_SIZE]
        self.mode = context.output_mode
        self.cdc = AutoCdcSpec.from_options(options, options[KEYS])
        self.scd_type = int(options[STORED_AS_SCD_TYPE])
        self.track_history: list[str] | None = options[TRACK_HISTORY_COLUMN_LIST]
        self.track_history_except: list[str] | None = options[TRACK_HISTORY_EXCEPT_COLUMN_LIST]
        if self.cdc.enabled and self.mode != "append":
            raise UnsupportedError("delta: AUTO CDC (sequenceBy / applyAsDeletes) needs output mode 'append'")
        if context.schema is not None and self.cdc.enabled:
            self._check_track_history(context.schema.names)
        self._tombstones: Any = None
        if self.cdc.sequence_by is not None and self.scd_type == 1 and options[TOMBSTONE_RETENTION] > 0:
            from headrace_delta._tombstones import TombstoneStore

            self._tombstones = TombstoneStore(context.state_path, options[TOMBSTONE_RETENTION])
        if self.overwrite_schema and self.mode != "complete":
            raise UnsupportedError(
                "overwriteSchema=true replaces the table's schema and needs output mode 'complete'; "
                "use mergeSchema=true to add columns in append mode"
            )
        if not self.txn_app_id and not context.query_id:
            raise HeadraceError("the delta sink needs a query id (run it in a query) or txnAppId with txnVersion")
        self._staging = os.path.join(context.state_path, "staging") if context.state_path else None
        self._temp_staging: str | None = None
        self._last_commit: dict[str, Any] = {}
        self._layout: Layout | None = None  # the table's, as last seen (None: not loaded yet)

    def _check_track_history(self, names: Sequence[str]) -> None:
        """Raise when trackHistory(Except)ColumnList names a column the target will not have
        (the change stream's ``names`` through columnList / exceptColumnList). No I/O."""
        if self.track_history is None and self.track_history_except is None:
            return
        from headrace_delta._scd2_track import tracked_columns

        cols = self.cdc.output_columns(names)
        tracked_columns(cols, self.cdc.keys, self.cdc.sequence_by, track=self.track_history,
                        track_except=self.track_history_except)  # fmt: skip

    # ------------------------------------------------------------------ staging
    def _staging_dir(self) -> str:
        if self._staging is None:
            if self._temp_staging is None:
                self._temp_staging = tempfile.mkdtemp(prefix="headrace-delta-staging-")
            return self._temp_staging
        os.makedirs(self._staging, exist_ok=True)
        return self._staging

    def write(self, batch_id: int, data: Iterator[pa.RecordBatch]) -> StagedBatch | WrittenFiles:
        """Write one share of batch ``batch_id`` as Parquet data files in the table's folder
        (appends), or stage it as an Arrow IPC file; nothing becomes visible.

        Called once per batch by the local engine (once per task under Spark), maybe in a worker
        thread. Returns a picklable :class:`WrittenFiles` or :class:`StagedBatch` for ``commit``.
        """
        seen: list[pa.Schema] = []  # AUTO CDC: the prepared events' schema
        if self.cdc.enabled:
            from headrace.helpers.auto_cdc import prepare

            def prepared(tables: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
                position = 0  # without sequenceBy: the stream order (apply_changes numbers the shares)
                for t in tables:
                    if t.num_rows:
                        self._check_track_history(t.schema.names)
                        out = prepare(pa.Table.from_batches([t]), self.cdc, position)
                        position += out.num_rows
                        seen[:] = [out.schema]
                        yield from out.to_batches()

            data = prepared(data)
        first = next(data, None)
        if first is None:
            schema = self.context.schema
            if self.cdc.enabled:  # the prepared schema (the tombstones open their store with it)
                schema = seen[0] if seen else _prepared_schema(schema, self.cdc)
            return StagedBatch(batch_id, (), 0, schema.serialize().to_pybytes() if schema is not None else None)
        if self.mode == "append" and not self.cdc.enabled:
            layout = self._table_layout()
            if direct_schema(first.schema, layout.partition_by):
                return self._write_files(batch_id, first, data, layout)
        path = os.path.join(self._staging_dir(), f"{batch_id:010d}-{uuid.uuid4().hex}.arrow")
        rows = 0
        with pa.OSFile(path, "wb") as sink, pa.ipc.new_stream(sink, first.schema) as writer:
            for b in _as_first(first, data):
                writer.write_batch(b)
                rows += b.num_rows
        return StagedBatch(batch_id, (path,), rows, first.schema.serialize().to_pybytes())

    def _table_layout(self) -> Layout:
        """The layout of the table's files (partition columns, statistics columns), loaded from
        the table on the first write of this sink and kept (a commit that finds it changed
        writes through delta-rs and loads it again)."""
        if self._layout is None:
            self._layout = Layout.of_table(self._table(), self.partition_by)
        return self._layout

    def _write_files(self, batch_id: int, first: pa.RecordBatch, data: Iterator[pa.RecordBatch],
                     layout: Layout) -> WrittenFiles:  # fmt: skip
        """Encode ``first`` and the rest of ``data`` as Parquet data files under the table root
        (on the writer's thread while this one pulls the next batches); delete them if the
        share fails."""
        writer = DataFileWriter(self.loc, first.schema, layout, self.target_file_size)
        rows = 0
        try:
            for b in _as_first(first, data):
                writer.add(b)
                rows += b.num_rows
            files = writer.finish()
        except BaseException:
            writer.discard()
            raise
        return WrittenFiles(batch_id, tuple(files), rows, first.schema.serialize().to_pybytes(), layout)

    # ------------------------------------------------------------------ commit
    def _txn(self, batch_id: int) -> tuple[str, int]:
        if self.txn_app_id is not None and self.txn_version is not None:
            return self.txn_app_id, int(self.txn_version)
        return self.context.query_id, batch_id

    def _table(self) -> Any:
        """The table at its latest version (a delta-rs ``DeltaTable``), or None when there is none."""
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        try:
            return DeltaTable(self.loc.uri, storage_options=self.loc.storage_options)
        except TableNotFoundError:
            return None

    def committed_version(self, app_id: str, table: Any = None) -> int | None:
        """The last transaction version of ``app_id`` in the table (``table``, or the latest
        version loaded now), or None (no table or no txn)."""
        dt = table if table is not None else self._table()
        return None if dt is None else dt.transaction_version(app_id)

    def commit(self, batch_id: int, messages: Sequence[CommitMessage | None]) -> None:
        """Commit the batch's data files (or write every staged share) in one Delta commit with
        the batch's app transaction, unless that transaction is already in the log. Called once
        per batch on the driver, and again with the same id when a batch is replayed after a
        crash."""
        from deltalake import CommitProperties, Transaction, write_deltalake

        staged = [m for m in messages if isinstance(m, StagedBatch)]
        written = [m for m in messages if isinstance(m, WrittenFiles)]
        shares: list[StagedBatch | WrittenFiles] = [*written, *staged]
        app_id, version = self._txn(batch_id)
        # one load of the log per batch, for the transaction check and the write (write_deltalake
        # given a URI would load it again); one run of a query at a time holds its checkpoint
        table = self._table()
        done = self.committed_version(app_id, table)
        rows = sum(m.num_rows for m in shares)
        try:
            if done is not None and done >= version:
                log.info("delta: batch %d (txn %s/%d) is already in %s; skipping", batch_id, app_id, version, self.loc.uri)
                # the batch's rows are in the table already: report them as skipped, not as output
                if self._tombstones is not None:
                    prepared = _schema_of(staged, None) or _prepared_schema(self.context.schema, self.cdc)
                    self._tombstones.skipped(batch_id, self.cdc.keys, prepared)
                self._last_commit = {"skipped": True, "numRowsSkipped": rows}
                self._delete_written(written)  # this attempt's files: the committed version has its own
                return
            if self.cdc.enabled and not any(m.num_rows for m in staged):
                if self._tombstones is not None:  # its version committed all the same: versions have no gaps
                    prepared = _schema_of(staged, None) or _prepared_schema(self.context.schema, self.cdc)
                    self._tombstones.advance(batch_id, self.cdc.keys, prepared)
                return  # no events: nothing to apply (a replay of it is a no-op as well)
            schema = _schema_of(shares, self.context.schema)
            if schema is None:
                return  # nothing staged and no schema known: nothing to create or record
            meta = {"userMetadata": self.user_metadata} if self.user_metadata is not None else None
            props = CommitProperties(app_transactions=[Transaction(app_id, version)], custom_metadata=meta)
            if written and self._commit_files(table, written, staged, schema, props):
                self._last_commit = {"numOutputRows": rows, "numRowsSkipped": 0}
                return
            readers = [pa.ipc.open_stream(pa.memory_map(f)) for m in staged for f in m.files]

            def batches() -> Iterator[pa.RecordBatch]:
                yield from read_back(self.loc, [f for m in written for f in m.files], schema)
                for r in readers:
                    for b in r:
                        yield b if b.schema == schema else pa.Table.from_batches([b]).cast(schema).to_batches()[0]

            if self.cdc.enabled:
                from headrace_delta._auto_cdc import apply_changes

                events = pa.Table.from_batches(list(batches()), schema=schema)
                self._last_commit = apply_changes(self.loc.uri, events, self.cdc, scd_type=self.scd_type,
                                                  commit_properties=props, storage_options=self.loc.storage_options,
                                                  partition_by=self.partition_by, track_history=self.track_history,
                                                  track_history_except=self.track_history_except,
                                                  tombstones=self._tombstones, batch_id=batch_id,
                                                  widen=self.merge_schema)  # fmt: skip
                return
            data = pa.RecordBatchReader.from_batches(schema, batches())
            schema_mode: Any = "merge" if self.merge_schema else ("overwrite" if self.overwrite_schema else None)
            write_deltalake(
                table if table is not None else self.loc.uri,
                data,
                mode="overwrite" if self.mode == "complete" else "append",
                partition_by=self.partition_by,
                schema_mode=schema_mode,
                storage_options=self.loc.storage_options,
                target_file_size=self.target_file_size,
                commit_properties=props,
            )
            self._last_commit = {"numOutputRows": rows, "numRowsSkipped": 0}
            self._layout = None  # the schema or layout may have changed: load it again on the next write
            self._delete_written(written)  # read back and written again by delta-rs: unreferenced
        except Exception as e:
            if type(e).__module__.startswith("deltalake") or "Schema" in type(e).__name__:
                hint = self._mismatch_hint(e, shares)
                raise HeadraceError(f"writing batch {batch_id} to Delta table {self.loc.uri} failed: "
                                    + (f"{hint} (deltalake: {e})" if hint else str(e))) from e  # fmt: skip
            raise
        finally:
            self._discard(staged, batch_id)

    def _commit_files(self, table: Any, written: Sequence[WrittenFiles], staged: Sequence[StagedBatch],
                      schema: pa.Schema, props: Any) -> bool:  # fmt: skip
        """Add the written data files in one commit (``props``: the app transaction) when they
        fit the table as it is now: same columns and types (no schema change to make), the
        layout they were written in, no writer feature that plain add actions would break.
        False (nothing done) otherwise: the caller writes the rows through delta-rs."""
        from deltalake import Schema as DeltaSchema
        from deltalake.transaction import create_table_with_add_actions

        if any(m.files for m in staged) or len({(m.schema, m.layout) for m in written}) != 1:
            return False  # shares of different shapes (several tasks under Spark): one write of all
        layout = written[0].layout
        wanted = tuple(self.partition_by or ())
        if wanted and wanted != layout.partition_by:
            return False
        adds = [f.add_action() for m in written for f in m.files]
        delta_schema = DeltaSchema.from_arrow(schema)
        if table is None:
            if layout.partition_by != wanted:
                return False
            create_table_with_add_actions(self.loc.uri, delta_schema, adds, mode="append",
                                          partition_by=list(layout.partition_by) or None,
                                          storage_options=self.loc.storage_options,
                                          commit_properties=props)  # fmt: skip
            return True
        now = Layout.of_table(table, self.partition_by)
        if now != layout:
            self._layout = now
            return False
        if delta_schema.to_json() != table.schema().to_json() or not _plain_appends(table):
            return False
        table.create_write_transaction(adds, "append", table.schema(), partition_by=list(layout.partition_by) or None,
                                       commit_properties=props)  # fmt: skip
        return True

    def _delete_written(self, written: Sequence[WrittenFiles]) -> None:
        delete_files(self.loc, [f.path for m in written for f in m.files])

    def _mismatch_hint(self, error: Exception, staged: Sequence[StagedBatch | WrittenFiles]) -> str | None:
        """What differs between the table's columns and the batch's, with the fix (mergeSchema=true
        for new or missing columns), when ``error`` is deltalake refusing the batch's schema."""
        if type(error).__name__ != "SchemaMismatchError" and "Cannot cast schema" not in str(error):
            return None
        data = _schema_of(staged, self.context.schema)
        try:
            from deltalake import DeltaTable

            table = pa.schema(DeltaTable(self.loc.uri, storage_options=self.loc.storage_options).schema().to_arrow())
        except Exception as e:  # the table cannot be read back: the plain error says what it can
            log.debug("delta: reading the schema of %s for the error message failed: %s", self.loc.uri, e)
            return None
        if data is None:
            return None
        return schema_mismatch_hint(table, data, merge_schema=self.merge_schema)

    def abort(self, batch_id: int, messages: Sequence[CommitMessage | None]) -> None:
        """Delete what the batch staged, and its data files unless its transaction is in the
        log (a commit that failed after its Delta commit). Called at most once per failed batch;
        best effort."""
        self._discard([m for m in messages if isinstance(m, StagedBatch)], batch_id)
        written = [m for m in messages if isinstance(m, WrittenFiles)]
        if written:
            app_id, version = self._txn(batch_id)
            try:
                done = self.committed_version(app_id)
            except Exception as e:  # the log cannot be read: keep the files (VACUUM removes orphans)
                log.debug("delta: reading %s to clean up batch %d failed: %s", self.loc.uri, batch_id, e)
                return
            if done is None or done < version:
                self._delete_written(written)

    def _discard(self, staged: Sequence[StagedBatch], batch_id: int) -> None:
        for m in staged:
            for f in m.files:
                with contextlib.suppress(OSError):
                    os.remove(f)
        folder = self._staging
        if folder and os.path.isdir(folder):  # shares of earlier runs that crashed before committing
            for name in os.listdir(folder):
                stem = name.split("-", 1)[0]
                if stem.isdigit() and int(stem) <= batch_id:
                    with contextlib.suppress(OSError):
                        os.remove(os.path.join(folder, name))

    def metrics(self) -> dict[str, Any]:
        """The last commit's figures, for the progress report. Called once per batch.
        ``numRowsSkipped``: rows of a replayed batch whose transaction was already in the log
        (the engine reports them as skipped, not as output)."""
        return dict(self._last_commit)

    def close(self) -> None:
        """Remove a temporary staging folder. Called once when the query stops; idempotent."""
        if self.cdc.apply_as_deletes is not None:
            from headrace.helpers.auto_cdc import release_sql

            release_sql()
        if self._tombstones is not None:
            self._tombstones.close()
        if self._temp_staging is not None:
            shutil.rmtree(self._temp_staging, ignore_errors=True)
            self._temp_staging = None


def _plain_appends(table: Any) -> bool:
    """Whether adding files to ``table`` needs nothing but their add actions: no CHECK
    constraints, column mapping, generated or identity columns, row tracking."""
    proto = table.protocol()
    conf = table.metadata().configuration or {}
    if any(k.startswith("delta.constraints.") for k in conf):
        return False
    if conf.get("delta.columnMapping.mode", "none") != "none" or conf.get("delta.enableRowTracking") == "true":
        return False
    if proto.min_writer_version == 7:
        return set(proto.writer_features or ()) <= _WRITER_FEATURES
    return bool(proto.min_writer_version <= 4)


def _schema_of(staged: Sequence[StagedBatch | WrittenFiles], fallback: pa.Schema | None) -> pa.Schema | None:
    for m in staged:
        if m.files and m.schema is not None:
            return pa.ipc.read_schema(pa.py_buffer(m.schema))
    for m in staged:
        if m.schema is not None:
            return pa.ipc.read_schema(pa.py_buffer(m.schema))
    return fallback


def _prepared_schema(schema: pa.Schema | None, cdc: AutoCdcSpec) -> pa.Schema | None:
    """The schema :func:`headrace.helpers.auto_cdc.prepare` makes of a change stream's
    ``schema`` (None when unknown or not a change stream of ``cdc``)."""
    from headrace.helpers.auto_cdc import AutoCdcError, prepare

    if schema is None:
        return None
    try:
        return prepare(schema.empty_table(), cdc).schema
    except AutoCdcError:
        return None


def _as_first(first: pa.RecordBatch, rest: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``first``, then each batch of ``rest`` cast to ``first``'s schema where it differs (a
    share's record batches are written as one stream of one schema)."""
    yield first
    for b in rest:
        if b.schema != first.schema:
            b = pa.Table.from_batches([b]).cast(first.schema).combine_chunks().to_batches()[0]
        yield b
