"""``LakebaseSink``: batched, exactly-once upserts (or inserts) into PostgreSQL.

Per ``write`` (one per micro-batch in the local engine, one per task under Spark):

1. On first use, check the table (create it from the data's Arrow schema when missing),
   resolve the upsert keys (``upsertkey`` must equal the primary key; unset: the primary key,
   or plain inserts without one) and create the bookkeeping table.
2. Ask the bookkeeping table how many input rows this writer already wrote in this batch (a
   replay after a crash) and skip them.
3. Cut the input into chunks of ``batchsize`` rows, or fewer when the oldest buffered row is
   ``batchinterval`` old, in a bounded buffer (back-pressure). A flusher thread writes each
   chunk in one transaction: record the chunk in the bookkeeping table (skip it if recorded),
   COPY (binary) into a temporary staging table, then one ``INSERT ... SELECT ... ON CONFLICT
   (keys) DO UPDATE``; without keys, COPY straight into the table. Rows of a chunk are collapsed
   to the last per key and sorted by key first.
4. Transient errors (lost connection, admin shutdown, deadlock, serialization failure, too many
   connections) reconnect and retry the chunk with exponential backoff and jitter, up to
   ``maxRetries`` times; then the query fails, and a restart resumes from the bookkeeping.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import psycopg
import pyarrow as pa
from psycopg import sql

from headrace.errors import HeadraceError, UnsupportedError
from headrace.helpers.auto_cdc import DELETE, SEQ, AutoCdcSpec
from headrace.helpers.badrecords import BadRecords
from headrace.helpers.crash import crash_point
from headrace.options import Options
from headrace.protocols import CommitMessage, Sink, SinkContext
from headrace_lakebase._options import (
    BATCHINTERVAL,
    BATCHSIZE,
    CONNECT_TIMEOUT,
    DBTABLE,
    MAX_RETRIES,
    TOMBSTONE_RETENTION,
    UPSERTKEY,
)
from headrace_lakebase.bookkeeping import Bookkeeping
from headrace_lakebase.buffer import Chunk, ChunkBuffer
from headrace_lakebase.connection import Conn, Connector, params_from_options
from headrace_lakebase.copy_binary import encode_pieces
from headrace_lakebase.copy_rows import python_rows
from headrace_lakebase.dedupe import last_per_key_sorted
from headrace_lakebase.rejects import DATA_ERRORS, ENCODE_ERRORS, Rejects, describe, write_row_by_row
from headrace_lakebase.table import TablePlan, plan_table
from headrace_lakebase.writer import chain_batches, writer_id

__all__ = ["LakebaseCommitMessage", "LakebaseSink"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LakebaseCommitMessage(CommitMessage):
    """What one ``write`` did: its writer id, input rows, rows skipped as already written
    (replay), chunks flushed. Picklable."""

    writer: str
    rows: int
    skipped: int
    chunks: int


class LakebaseSink(Sink):
    """The ``lakebase`` / ``postgresql`` sink. See the module docstring and the README.

    Exactly-once per (query id, batch id, writer, chunk) through the bookkeeping table, with a
    replayable source. Rows become visible chunk by chunk during ``write`` (as in Lakebase's
    sink), so ``abort`` cannot take them back; the replay after a restart completes the batch.
    """

    idempotent_commit: ClassVar[bool] = True
    supports_real_time: ClassVar[bool] = True
    output_modes: ClassVar[tuple[str, ...]] = ("append", "update")

    def __init__(self, options: Options, context: SinkContext) -> None:
        """Called once per query run on the driver (and once per task under Spark). No I/O:
        the first connection is made by the first ``write`` or ``commit``."""
        super().__init__(options, context)
        if context.output_mode not in self.output_modes:
            raise UnsupportedError(
                f"lakebase: output mode {context.output_mode!r} is not supported (the table would have to be "
                "replaced every batch); use output_mode('append') or output_mode('update'), which both upsert"
            )
        self.table = options[DBTABLE]
        self.batch_size: int = options[BATCHSIZE]
        self.interval: float = options[BATCHINTERVAL]
        self.upsert_key: list[str] | None = options[UPSERTKEY]
        self.cdc = AutoCdcSpec.from_options(options, self.upsert_key)
        self.tombstone_retention: float = options[TOMBSTONE_RETENTION]
        self._tomb: Any = None  # headrace_lakebase.tombstones.Tombstones, at the first AUTO CDC write
        self._last_gc: float | None = None
        self._connector = Connector(
            lambda: params_from_options(options),
            max_retries=options[MAX_RETRIES],
            connect_timeout=options[CONNECT_TIMEOUT],
            what=f"writing to {self.table}",
        )
        self._bk = Bookkeeping(self.table.schema, str(self.table), context.query_id or context.run_id)
        self.bad_records = BadRecords.from_options(options, what=f"lakebase {self.table}")
        self._rejects = Rejects(self.table.schema, str(self.table), context.query_id or context.run_id)
        self._conn: Conn | None = None
        self._staged_conn: Conn | None = None
        self._plan: TablePlan | None = None
        self._plan_schema: pa.Schema | None = None
        self._bk_ready = False
        self._lock = threading.Lock()
        self._closed = False
        self._rows_written = 0
        self._chunks_written = 0
        self._rows_skipped = 0
        self._batch_skipped = 0

    def __repr__(self) -> str:
        return f"LakebaseSink(dbtable={self.table}, keys={self.upsert_key}, batchsize={self.batch_size})"

    # ------------------------------------------------------------------ preparation
    def _ensure_plan(self, schema: pa.Schema) -> TablePlan:
        if self._plan is not None and self._plan_schema == schema:
            return self._plan

        def prepare(conn: Conn) -> TablePlan:
            plan = plan_table(conn, self.table, schema, self.upsert_key)
            if not self._bk_ready:
                self._bk.ensure(conn)
                if self.bad_records is not None:
                    self._rejects.ensure(conn)
            return plan

        self._conn, plan = self._connector.run(self._conn, prepare)
        self._bk_ready = True
        if plan.created:
            log.info("lakebase: created table %s (%s)", self.table,
                     ", ".join(f"{n}" for n in plan.columns) + (f"; primary key {', '.join(plan.keys)}" if plan.keys else ""))  # fmt: skip
        self._plan, self._plan_schema = plan, schema
        return plan

    def _ensure_tombstones(self, plan: TablePlan, seq_type: pa.DataType) -> None:
        """Create (or find) the target's tombstone table. Once per sink, or when the plan changed."""
        if self._tomb is not None and self._tomb.plan.keys == plan.keys and self._tomb.plan.table == plan.table:
            self._tomb.plan = plan
            return
        from headrace_lakebase.tombstones import Tombstones

        tomb = Tombstones(plan, seq_type)
        self._conn, _ = self._connector.run(self._conn, tomb.ensure)
        self._staged_conn = None  # the session's temp tables: created again with the events table
        self._tomb = tomb

    @classmethod
    def writer_id(cls, first: pa.RecordBatch) -> str:
        """``<task>:<hash of the first input row>`` (see :func:`headrace_lakebase.writer.writer_id`)."""
        return writer_id(first)

    # ------------------------------------------------------------------ write
    def write(self, batch_id: int, data: Iterator[pa.RecordBatch]) -> LakebaseCommitMessage:
        """Write one share of batch ``batch_id``, chunk by chunk, and return what was done.

        Called once per batch by the local engine (once per task under Spark, in the task's
        process); in real-time mode ``data`` is live and this returns when the long batch ends,
        flushing by ``batchsize`` and ``batchinterval`` meanwhile. The returned message is
        picklable. Raises on a non-transient error or when retries run out.
        """
        with self._lock:
            if self._closed:
                raise HeadraceError("lakebase: write() on a closed sink; create a new one")
            it = iter(data)
            if self.cdc.enabled:
                from headrace_lakebase import autocdc  # AUTO CDC only: not at query start

                it = autocdc.cdc_batches(it, self.cdc)
            first = next((b for b in it if b.num_rows), None)
            if first is None:
                return LakebaseCommitMessage("", 0, 0, 0)
            plan = self._ensure_plan(_without_hidden(first.schema) if self.cdc.enabled else first.schema)
            if self.cdc.enabled and not plan.keys:
                raise HeadraceError(
                    f"lakebase: AUTO CDC into {self.table} needs key columns: set keys (or upsertkey), or give the "
                    "table a primary key"
                )
            if self.cdc.sequence_by is not None and self.tombstone_retention > 0:
                self._ensure_tombstones(plan, first.schema.field(SEQ).type)
            writer = self.writer_id(first)
            self._conn, (done, next_chunk, committed) = self._connector.run(
                self._conn, lambda c: self._bk.progress(c, batch_id, writer)
            )
            if committed is not None and batch_id <= committed and not plan.keys:
                return self._skip_committed(batch_id, writer, committed, first, it)
            if done:
                log.info("lakebase: batch %d writer %s replayed: skipping %d rows already written", batch_id, writer, done)
            buffer = ChunkBuffer(batch_size=self.batch_size, interval=self.interval, skip=done, first_chunk=next_chunk)
            failure: list[BaseException] = []
            stopping = threading.Event()
            counts = [0, 0]  # rows, chunks

            def flush_all() -> None:
                try:
                    while (chunk := buffer.next_chunk()) is not None:
                        if self._flush(plan, batch_id, writer, chunk, stopping):
                            counts[0] += chunk.num_rows
                            counts[1] += 1
                except BaseException as e:
                    failure.append(e)
                    buffer.fail(e)

            flusher = threading.Thread(target=flush_all, name=f"headrace-lakebase-flush-{batch_id}", daemon=True)
            flusher.start()
            total = 0
            try:
                for b in chain_batches(first, it, first.schema):
                    total += b.num_rows
                    buffer.add(b)
            except BaseException:
                stopping.set()
                buffer.fail(HeadraceError("lakebase: write cancelled"))
                buffer.close()
                flusher.join()
                raise
            buffer.close()
            flusher.join()
            if failure:
                raise failure[0]
            if self.bad_records is not None:  # this run's rejects and those of chunks written before a crash
                self._conn, rejected = self._connector.run(self._conn, lambda c: self._rejects.read(c, batch_id, writer))
                self.bad_records.add(describe(rejected, self.table, batch_id, writer))
            self._rows_written += counts[0]
            self._chunks_written += counts[1]
            self._rows_skipped += min(done, total)
            return LakebaseCommitMessage(writer, total, min(done, total), counts[1])

    def _skip_committed(self, batch_id: int, writer: str, committed: int, first: pa.RecordBatch,
                        rest: Iterator[pa.RecordBatch]) -> LakebaseCommitMessage:  # fmt: skip
        """Insert mode, a batch at or below the last one committed to this table: a replay after
        ``headrace checkpoint reset`` (or of the last batch, committed here before its commits
        entry was durable). Its rows are in the table already: read them (the engine wants the
        whole batch consumed), write nothing, report them skipped, as delta and files do."""
        total = first.num_rows + sum(b.num_rows for b in rest)
        log.info("lakebase: batch %d was committed to %s before (last committed batch %d): skipping its %d rows",
                 batch_id, self.table, committed, total)  # fmt: skip
        self._rows_skipped += total
        return LakebaseCommitMessage(writer, total, total, 0)

    def _flush(self, plan: TablePlan, batch_id: int, writer: str, chunk: Chunk, stopping: threading.Event) -> bool:
        """Write one chunk in one transaction (with retries). False when it was already recorded."""
        if self.cdc.enabled:
            return self._flush_cdc(plan, batch_id, writer, chunk, stopping)
        table = pa.Table.from_batches(chunk.batches).select(list(plan.columns))
        if plan.keys:
            table = last_per_key_sorted(table, plan.keys)
        checked = self.bad_records is not None and self.bad_records.policy != "fail"
        try:
            payload = encode_pieces(table, list(plan.oids)) if plan.fast else None
            rows = None if plan.fast else list(python_rows(table, plan.oids))  # a list: a retry writes it again
        except ENCODE_ERRORS:
            if not checked:
                raise
            payload, rows = None, None  # a value does not encode: find it row by row

        def copy(cur: psycopg.Cursor[Any], payload: tuple[memoryview, ...] | None, rows: Any) -> None:
            with cur.copy(plan.copy_into(staging=bool(plan.keys))) as cp:
                if payload is not None:
                    for piece in payload:  # streamed: no joined copy of the chunk
                        cp.write(piece)
                else:
                    assert rows is not None
                    cp.set_types(list(plan.oids))
                    for row in rows:
                        cp.write_row(row)
            if plan.keys:
                cur.execute(plan.upsert_from_staging())

        def work(conn: Conn) -> bool:
            if plan.keys and self._staged_conn is not conn:
                conn.execute(plan.create_staging())
                self._staged_conn = conn
            with conn.transaction(), conn.cursor() as cur:
                if not self._bk.claim(cur, batch_id, writer, chunk.number, chunk.row_start, chunk.row_end):
                    return False
                # the chunk is recorded but its rows not written: a kill here must lose both
                crash_point("lakebase_between_bookkeeping_and_data", batch_id)
                if not checked:
                    copy(cur, payload, rows)
                    return True
                if payload is not None or rows is not None:
                    try:
                        with conn.transaction():  # a savepoint: the whole chunk at once, the usual case
                            copy(cur, payload, rows)
                        return True
                    except DATA_ERRORS:
                        pass

                def one(t: pa.Table) -> None:
                    fast = plan.fast
                    copy(cur, encode_pieces(t, list(plan.oids)) if fast else None,
                         None if fast else list(python_rows(t, plan.oids)))  # fmt: skip
                    if plan.keys:
                        cur.execute(sql.SQL("DELETE FROM {}").format(sql.Identifier(plan.staging_name())))

                self._rejects.record(cur, batch_id, writer, chunk.number, write_row_by_row(conn, table, one))
            return True

        self._conn, written = self._connector.run(self._conn, work, stop=stopping.is_set)
        return written

    def _flush_cdc(self, plan: TablePlan, batch_id: int, writer: str, chunk: Chunk, stopping: threading.Event) -> bool:
        """AUTO CDC: apply one chunk of events in one transaction with its bookkeeping row
        (see headrace_lakebase.autocdc). False when it was already recorded."""
        from headrace_lakebase import autocdc

        work = autocdc.chunk_work(plan, self.cdc, self._bk, batch_id, writer, chunk, self, self._tomb)
        self._conn, written = self._connector.run(self._conn, work, stop=stopping.is_set)
        return written

    # ------------------------------------------------------------------ commit / abort
    def commit(self, batch_id: int, messages: Sequence[CommitMessage | None]) -> None:
        """Every write of ``batch_id`` succeeded; its rows are already durable. Mark the batch
        committed in the bookkeeping and forget the chunks of earlier batches of this query.

        Called once per batch on the driver (again with the same id on a replay: idempotent)."""
        self._batch_skipped = sum(m.skipped for m in messages if isinstance(m, LakebaseCommitMessage))
        wrote = any(isinstance(m, LakebaseCommitMessage) and m.rows for m in messages)
        if not wrote:
            return

        def forget(conn: Conn) -> None:
            try:
                self._bk.mark_committed(conn, batch_id)
            except psycopg.errors.UndefinedTable:
                pass
            if self.bad_records is not None:
                with contextlib.suppress(psycopg.errors.UndefinedTable):
                    self._rejects.forget_before(conn, batch_id)
            if self.cdc.sequence_by is not None and self.tombstone_retention > 0:
                from headrace_lakebase.tombstones import collect_due

                self._last_gc = collect_due(conn, self.table, self.tombstone_retention, self._last_gc)

        with self._lock:
            self._conn, _ = self._connector.run(self._conn, forget)

    def abort(self, batch_id: int, messages: Sequence[CommitMessage | None]) -> None:
        """Called at most once when batch ``batch_id`` failed. Chunks already flushed stay (they
        are recorded, so the replay after a restart skips them and writes the rest)."""
        written = sum(m.rows - m.skipped for m in messages if isinstance(m, LakebaseCommitMessage))
        if written:
            log.warning("lakebase: batch %d aborted; %d rows already written stay in %s", batch_id, written, self.table)

    def metrics(self) -> dict[str, int]:
        """Sink metrics for the progress report: rows and chunks written, rows skipped on
        replay, transient errors retried. Called once per batch."""
        return {
            "numOutputRowsWritten": self._rows_written,
            "numChunksWritten": self._chunks_written,
            "numRowsSkippedOnReplay": self._rows_skipped,
            # this batch's rows already written before a crash: reported as skipped, not output
            "numRowsSkipped": self._batch_skipped,
            "numRetries": self._connector.retries,
        }

    def close(self) -> None:
        """Close the connection. Called once when the query stops; idempotent."""
        if self.cdc.apply_as_deletes is not None:
            from headrace.helpers.auto_cdc import release_sql

            release_sql()
        self._closed = True
        conn, self._conn = self._conn, None
        self._staged_conn = None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()


def _without_hidden(schema: pa.Schema) -> pa.Schema:
    """The target's columns of a prepared AUTO CDC batch (without the sequence and delete flag)."""
    return pa.schema([f for f in schema if f.name not in (SEQ, DELETE)])
