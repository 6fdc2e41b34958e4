"""``StreamingQuery``: the checkpointed micro-batch loop, triggers, progress, stop and await.

Per batch, with Spark's semantics:

1. ``end = source.latest_offset(start, limit)`` for each source; no new data -> no batch.
2. ``offsets/<n>`` written (write-ahead, atomic) before any data is read.
3. Partitions read (``headrace.engine.reader``), the stream's plan applied
   (``headrace.engine.plan``: stateless steps in the reader threads, stateful ones on the
   consumer), ``sink.write`` then ``sink.commit(n, messages)``.
4. ``commits/<n>`` written on the checkpoint's I/O thread (after ``offsets/<n>``, before
   ``offsets/<n+1>``: one thread, in order), and ``source.commit(end)`` once it is durable:
   in the next batch just before its sink commit, when the loop finds no new data, or when
   the query ends (Spark defers ``Source.commit`` to the next batch likewise).

With ``with_watermark``, ``offsets/<n>`` also records the batch's watermark
(``headrace.engine.watermark``), and when the watermark moves while no new data arrives, a
batch without data runs so that stateful operators can emit and evict (Spark's no-data batch).

On start, a last batch with an offsets entry and no commits entry is replayed over the same
range with the same batch id, so a sink whose commit is idempotent per batch id gives
exactly-once output across crashes. Real-time batches live in ``headrace.engine.real_time``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pyarrow as pa

from headrace.checkpoint import Checkpoint, OffsetEntry
from headrace.engine.crash import CrashHook
from headrace.engine.deadletters import (
    close_dead_letter_sinks,
    open_dead_letter_sinks,
    settle_bad_records,
    transform_bad_record_metrics,
)
from headrace.engine.plan import PlanRunner
from headrace.engine.reader import BatchCounts, read_partitions
from headrace.engine.real_time import run_real_time_batch
from headrace.engine.trigger import SourcePlan, Transform, Trigger
from headrace.engine.watermark import EventTimeTracker
from headrace.errors import (
    HeadraceError,
    StreamingQueryException,
    UnsupportedError,
    redact,
    redact_url,
    scrub_exception,
)
from headrace.history import ProgressHistory
from headrace.options import Options
from headrace.progress import QueryProgress
from headrace.protocols import Offset, Partition, ReadLimit, Sink, SinkContext, Source, SourceContext
from headrace.transforms.operator import BatchInfo, Operator, OperatorContext
from headrace.transforms.stateless import MapBatchesOperator

__all__ = ["StreamingQuery"]

log = logging.getLogger(__name__)


class StreamingQuery:
    """A running query. Created by ``DataStreamWriter.start()``; runs in a background thread.

    Mirrors PySpark's ``StreamingQuery``: ``id``, ``run_id``, ``name``, ``is_active``,
    ``status``, ``last_progress``, ``recent_progress``, ``await_termination``, ``stop``,
    ``exception``, ``process_all_available``.
    """

    def __init__(
        self,
        *,
        name: str,
        sources: Sequence[SourcePlan],
        transform: Transform | None = None,
        sink_connector: str,
        sink_class: type,
        sink_options: Options,
        output_mode: str,
        trigger: Trigger,
        checkpoint_location: str | None,
        read_parallelism: int | None = None,
        progress_callbacks: Sequence[Callable[[QueryProgress], None]] = (),
        keep_progress: int = 100,
        checkpoint_fsync: bool = True,
        operators: Sequence[Operator] = (),
        state_store: str = "memory",
    ) -> None:
        if not sources:
            raise HeadraceError("a query needs at least one source")
        self.name = name
        self._plans = list(sources)
        ops = list(operators)
        if transform is not None:
            ops.append(MapBatchesOperator(transform))
        self._operators = ops
        self._state_store = state_store
        self._runner: PlanRunner | None = None
        self._tracker = EventTimeTracker(())
        self._sink_connector = sink_connector
        self._sink_class = sink_class
        self._sink_options = sink_options
        self.output_mode = output_mode
        self.trigger = trigger
        self._temp_checkpoint = checkpoint_location is None
        self._checkpoint_location = checkpoint_location or tempfile.mkdtemp(prefix="headrace-checkpoint-")
        self._parallelism = read_parallelism or min(8, max(2, (os.cpu_count() or 2)))
        self._callbacks = list(progress_callbacks)
        self._keep = keep_progress
        self._fsync = checkpoint_fsync
        self.run_id = str(uuid.uuid4())
        self.id = ""
        self._progress: list[QueryProgress] = []
        self._stop = threading.Event()
        self._terminated = threading.Event()
        self._exception: StreamingQueryException | None = None
        self._status = {"message": "Initializing", "isDataAvailable": False, "isTriggerActive": False}
        self._thread: threading.Thread | None = None
        self._sources: list[Source] = []
        self._sink: Sink | None = None
        self._checkpoint: Checkpoint | None = None
        self._history: ProgressHistory | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._crash = CrashHook.from_env()
        self._last_trigger: float | None = None
        self._current_batch: int | None = None
        self._processed_batches = 0
        self._idle_checks = 0
        self._last_watermark: int | None = None
        self._deferred_commit: tuple[Future[None], list[Offset]] | None = None

    # ------------------------------------------------------------------ public API
    @property
    def is_active(self) -> bool:
        return self._thread is not None and not self._terminated.is_set()

    @property
    def status(self) -> dict[str, Any]:
        return dict(self._status)

    @property
    def last_progress(self) -> dict[str, Any] | None:
        return self._progress[-1].to_dict() if self._progress else None

    @property
    def recent_progress(self) -> list[dict[str, Any]]:
        return [p.to_dict() for p in self._progress]

    @property
    def delivery_guarantee(self) -> str:
        """``exactly-once`` when every source is replayable and the sink's commit idempotent.

        Asks the source and sink instances once they exist (a sink may become idempotent
        through its options, e.g. Kafka transactions), the classes before."""
        sources: list[Any] = list(self._sources) or [p.source_class for p in self._plans]
        sink: Any = self._sink if self._sink is not None else self._sink_class
        replayable = all(getattr(s, "replayable", False) for s in sources)
        idempotent = bool(getattr(sink, "idempotent_commit", False))
        return "exactly-once" if replayable and idempotent else "at-least-once"

    @property
    def checkpoint_location(self) -> str:
        return self._checkpoint_location

    def exception(self) -> StreamingQueryException | None:
        """The exception that ended the query, or None."""
        return self._exception

    def await_termination(self, timeout: float | None = None) -> bool:
        """Wait until the query ends (or ``timeout`` seconds). Raises its exception if it failed.

        Returns True when it ended, False on timeout.
        """
        ended = self._terminated.wait(timeout)
        if ended and self._exception is not None:
            raise self._exception
        return ended

    def stop(self, timeout: float | None = 60.0) -> None:
        """Stop the query: a running micro-batch finishes (a real-time batch ends early and
        commits), then sources and sink are closed. Blocks until done or ``timeout``."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def process_all_available(self, timeout: float | None = None) -> None:
        """Block until every source has no more data than what has been processed (tests)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        # the second "no new data" check after this call certainly started after it
        target = self._idle_checks + 2
        while self.is_active:
            if self._idle_checks >= target:
                return
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"query '{self.name}' did not catch up within {timeout} s")
            time.sleep(0.01)
        if self._exception is not None:
            raise self._exception

    def __repr__(self) -> str:
        return redact(f"StreamingQuery(name={self.name!r}, id={self.id!r}, active={self.is_active})")

    # ------------------------------------------------------------------ start
    def start(self) -> StreamingQuery:
        """Open the checkpoint, build sources and sink (raising configuration errors here),
        then run the loop in a background thread."""
        try:
            self._setup()
        except Exception as e:  # configuration errors reach the user without any secret in them
            clean = scrub_exception(e)
            if clean is e:
                raise
            raise clean from None
        self._thread = threading.Thread(target=self._run, name=f"headrace-query-{self.name or self.id[:8]}", daemon=True)
        self._thread.start()
        return self

    def _resolve_plan(self, schema: pa.Schema) -> PlanRunner:
        """Validate the plan against the input schema (every expression run on an empty
        table), then its output mode and trigger. Raises before any data is read."""
        runner = PlanRunner(self._operators, schema)
        runner.check_output_mode(self.output_mode)
        if self.trigger.kind == "real_time":
            problems = runner.check_real_time(self.output_mode)
            if problems:
                raise UnsupportedError(
                    "this plan cannot run with the real-time trigger: " + "; ".join(problems)
                    + ". Use trigger(processing_time=...) instead"
                )
        return runner

    def _setup(self) -> None:
        if self.trigger.kind == "real_time":
            self._check_real_time()
        if self.output_mode not in getattr(self._sink_class, "output_modes", ("append",)):
            raise UnsupportedError(
                f"sink '{self._sink_connector}' does not support output mode '{self.output_mode}'; "
                f"it supports: {', '.join(getattr(self._sink_class, 'output_modes', ('append',)))}"
            )
        if self._plans[0].user_schema is not None:  # validate before the checkpoint is touched
            self._resolve_plan(self._plans[0].user_schema)
        cp = Checkpoint(self._checkpoint_location, durable=self._fsync)
        meta = cp.open(
            name=self.name,
            sources=[{"connector": p.connector, "path": redact_url(p.path) if p.path else p.path} for p in self._plans],
            sink={"connector": self._sink_connector},
        )
        self._checkpoint = cp
        self.id = meta["id"]
        committed = bool(cp.committed_ids())
        self._history = ProgressHistory(cp.location, keep=self._keep)
        try:
            for i, plan in enumerate(self._plans):
                ctx = SourceContext(
                    query_id=self.id,
                    run_id=self.run_id,
                    source_index=i,
                    state_path=cp.source_state_path(i),
                    user_schema=plan.user_schema,
                    has_committed_batches=committed,
                )
                self._sources.append(plan.source_class(plan.options, ctx))
            runner = self._resolve_plan(self._sources[0].schema)
            self._runner = runner  # before open(): operator contexts read it
            self._tracker = EventTimeTracker(runner.watermarks)
            schema = runner.sink_schema
            sctx = SinkContext(
                query_id=self.id,
                run_id=self.run_id,
                query_name=self.name,
                output_mode=self.output_mode,
                state_path=cp.sink_state_path(),
                schema=schema,
            )
            self._sink = self._sink_class(self._sink_options, sctx)
            runner.open(self._operator_context)
            open_dead_letter_sinks(self, cp)
        except BaseException:
            self._close_all()
            raise
        log.info(
            "query '%s' (id %s, run %s) starting: %s -> %s, trigger %s, delivery %s, checkpoint %s",
            self.name, self.id, self.run_id, ", ".join(p.describe() for p in self._plans),
            self._sink_connector, self.trigger, self.delivery_guarantee, self._checkpoint_location,
        )  # fmt: skip

    def _operator_context(self, index: int, op: Operator) -> OperatorContext:
        assert self._checkpoint is not None and self._runner is not None
        options = {"checkpointFsync": self._fsync, **self._runner.operator_options(index)}
        return OperatorContext(
            index=index,
            query_id=self.id,
            state_path=self._checkpoint.state_path(index) if op.stateful else None,
            state_backend=self._state_store,
            retain=self._checkpoint.retain,
            output_mode=self.output_mode,
            real_time=self.trigger.kind == "real_time",
            options=options,
        )

    def _check_real_time(self) -> None:
        problems = []
        if len(self._plans) != 1:
            problems.append("it reads exactly one source")
        for p in self._plans:
            if not getattr(p.source_class, "supports_real_time", False):
                problems.append(f"source '{p.connector}' does not support it")
        if not getattr(self._sink_class, "supports_real_time", False):
            problems.append(f"sink '{self._sink_connector}' does not support it")
        if problems:
            raise UnsupportedError(
                "the real-time trigger needs a source and a sink that support it: " + "; ".join(problems)
                + ". Use trigger(processing_time=...) instead, or a real-time capable pair (e.g. kafka -> kafka)"
            )

    # ------------------------------------------------------------------ loop
    def _run(self) -> None:
        from headrace.plugins import registry

        hook = registry().hook
        with contextlib.suppress(Exception):
            hook.headrace_query_started(
                event={"id": self.id, "runId": self.run_id, "name": self.name, "timestamp": time.time(),
                       "deliveryGuarantee": self.delivery_guarantee}
            )
        batch_id: int | None = None
        if self._history is not None:
            try:
                self._history.start(id=self.id, run_id=self.run_id, name=self.name)
            except OSError as e:  # the history is for people; it never stops a query
                log.warning("query '%s': progress history disabled: %s", self.name, e)
                self._history = None
        try:
            self._pool = ThreadPoolExecutor(self._parallelism, thread_name_prefix="headrace-read")
            try:
                batch_id = self._loop()
            finally:
                self._settle_commit()  # the last batch's marker durable, its sources committed
        except BaseException as e:
            e = scrub_exception(e)  # no secret in q.exception(), its traceback or the log line
            self._exception = StreamingQueryException(self.name or self.id, self._current_batch, e)
            self._exception.__cause__ = e
            log.error("query '%s' failed: %s", self.name, e, exc_info=e)
        finally:
            self._status = {"message": "Stopped", "isDataAvailable": False, "isTriggerActive": False}
            if self._history is not None:
                with contextlib.suppress(Exception):
                    self._history.finish(run_id=self.run_id, exception=str(self._exception) if self._exception else None,
                                         batch_id=self._current_batch)  # fmt: skip
            self._close_all()
            if "headrace.transforms.expressions" in sys.modules:  # DuckDB was used on this thread
                sys.modules["headrace.transforms.expressions"].release_thread()
            with contextlib.suppress(Exception):
                hook.headrace_query_terminated(
                    event={"id": self.id, "runId": self.run_id, "name": self.name,
                           "exception": str(self._exception) if self._exception else None,
                           "lastBatchId": batch_id,
                           "failedBatchId": self._current_batch if self._exception else None}
                )
            self._terminated.set()

    def _close_all(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        if self._runner is not None:
            self._runner.close()
        for s in self._sources:
            try:
                s.close()
            except Exception as e:
                log.warning("closing source failed: %s", redact(e))
        if self._sink is not None:
            try:
                self._sink.close()
            except Exception as e:
                log.warning("closing sink failed: %s", redact(e))
        close_dead_letter_sinks(self)
        if self._checkpoint is not None:
            self._checkpoint.close()
        if self._temp_checkpoint:
            shutil.rmtree(self._checkpoint_location, ignore_errors=True)

    def _loop(self) -> int | None:
        assert self._checkpoint is not None
        pending = self._checkpoint.pending()
        entry, committed = self._checkpoint.latest()
        self._last_watermark = self._tracker.watermark_ms
        if entry is None:
            batch_id = 0
            current: list[Offset] = [s.initial_offset() for s in self._sources]
        elif committed:
            if any(e is None for e in entry.ends):
                raise HeadraceError(f"checkpoint batch {entry.batch_id} is committed without an end offset")
            self._tracker.restore(entry.metadata, self._checkpoint.read_commit(entry.batch_id) or {})
            self._last_watermark = entry.metadata.get("batchWatermarkMs", self._tracker.watermark_ms)
            batch_id = entry.batch_id + 1
            current = [dict(e) for e in entry.ends if e is not None]
        else:
            # uncommitted batches (the one a crash interrupted, or those `checkpoint reset` rolled
            # back) are replayed first, each with exactly its recorded range, batch id and watermark
            for k, entry in enumerate(pending):
                if self._stop.is_set():
                    return None
                log.info("query '%s': replaying uncommitted batch %d", self.name, entry.batch_id)
                self._tracker.restore(entry.metadata)
                if entry.real_time and any(e is None for e in entry.ends):
                    if k != len(pending) - 1:
                        raise HeadraceError(f"checkpoint batch {entry.batch_id} has no end offset but later batches do")
                    self._real_time_batch(entry.batch_id, list(entry.starts), entry.metadata)
                else:
                    ends = [e for e in entry.ends if e is not None]
                    self._batch(entry.batch_id, list(entry.starts), ends, replay=True, metadata=entry.metadata)
            assert self._checkpoint is not None
            latest, _ = self._checkpoint.latest()
            assert latest is not None and entry is not None
            batch_id = entry.batch_id + 1
            current = [dict(e) for e in latest.ends if e is not None]
            if self.trigger.kind == "once":
                return entry.batch_id

        kind = self.trigger.kind
        limits = [s.default_read_limit() for s in self._sources]
        if kind == "once":
            limits = [ReadLimit.all_available() for _ in self._sources]
        elif kind == "available_now":
            prepared = [s.prepare_for_available_now() for s in self._sources]
            if not all(prepared):
                limits = [ReadLimit.all_available() for _ in self._sources]
                kind = "once"

        last_batch: int | None = None
        while not self._stop.is_set():
            if kind == "real_time":
                current = self._real_time_batch(batch_id, current)
                last_batch = batch_id
                batch_id += 1
                continue
            t0 = time.monotonic()
            self._status = {"message": "Getting offsets from sources", "isDataAvailable": False, "isTriggerActive": True}
            ends = [s.latest_offset(st, lim) for s, st, lim in zip(self._sources, current, limits, strict=True)]
            t_latest = time.monotonic() - t0
            if all(e == st for e, st in zip(ends, current, strict=True)):
                if self._needs_no_data_batch():
                    self._batch(batch_id, current, current, t0=t0, t_latest=t_latest)
                    last_batch = batch_id
                    batch_id += 1
                    continue
                self._settle_commit()
                self._status = {"message": "Waiting for data to arrive", "isDataAvailable": False, "isTriggerActive": False}
                self._idle_checks += 1
                if kind in ("once", "available_now"):
                    break
                self._stop.wait(self.trigger.interval if kind == "processing_time" else 0.01)
                continue
            self._batch(batch_id, current, ends, t0=t0, t_latest=t_latest)
            last_batch = batch_id
            batch_id += 1
            current = ends
            if kind == "once":
                break
            if kind == "processing_time":
                remaining = self.trigger.interval - (time.monotonic() - t0)
                if remaining > 0:
                    self._status = {"message": "Waiting for next trigger", "isDataAvailable": True, "isTriggerActive": False}
                    self._stop.wait(remaining)
        return last_batch

    def _needs_no_data_batch(self) -> bool:
        """Whether the watermark moved past the one the last batch ran with, in a plan with
        stateful operators (which then emit and evict in a batch without data)."""
        return (
            self._runner is not None and self._runner.has_stateful and self._tracker.enabled
            and self._tracker.watermark_ms != self._last_watermark
        )  # fmt: skip

    def _settle_commit(self) -> None:
        """Wait until the last batch's ``commits/<n>`` is durable, then ``source.commit(end)``
        for it (on the loop's thread, as every source call). Called before the next batch's
        sink commit, when a trigger finds no new data, before a real-time batch and when the
        loop ends. A crash before this point replays batch ``n`` (its marker may be missing),
        exactly as a crash between a synchronous marker and ``source.commit`` did."""
        deferred, self._deferred_commit = self._deferred_commit, None
        if deferred is None:
            return
        done, ends = deferred
        done.result()
        for src, en in zip(self._sources, ends, strict=True):
            src.commit(en)

    # ------------------------------------------------------------------ one batch
    def _batch(
        self,
        batch_id: int,
        starts: list[Offset],
        ends: list[Offset],
        *,
        replay: bool = False,
        t0: float | None = None,
        t_latest: float = 0.0,
        metadata: dict[str, Any] | None = None,
    ) -> None:
        assert self._checkpoint is not None and self._sink is not None and self._runner is not None
        t0 = time.monotonic() if t0 is None else t0
        wall = time.time()
        if metadata is None:
            metadata = self._tracker.metadata(int(wall * 1000))
        info = BatchInfo(batch_id, metadata.get("batchWatermarkMs") if self._tracker.enabled else None)
        self._current_batch = batch_id
        self._status = {"message": "Processing new data", "isDataAvailable": True, "isTriggerActive": True}
        crash = self._crash
        crash("before_offsets", batch_id)
        t = time.monotonic()
        wal = None
        if not replay:
            entry = OffsetEntry(batch_id, starts, list(ends), int(wall * 1000), metadata=metadata)
            wal = self._checkpoint.write_offsets_async(entry)
            if crash.point:  # crash tests need the entry on disk at the named point
                wal.result()
        t_wal = time.monotonic() - t
        crash("after_offsets", batch_id)

        parts: list[tuple[int, Partition]] = []
        for i, (src, st, en) in enumerate(zip(self._sources, starts, ends, strict=True)):
            if st != en:
                parts.extend((i, p) for p in src.partitions(st, en))
        counts = BatchCounts([0] * len(self._sources))
        t = time.monotonic()
        messages: list[Any] = []
        runner = self._runner
        runner.begin(info)
        read = read_partitions(self._sources, parts, runner.prefix_transform, counts, batch_id=batch_id, pool=self._pool,
                               crash=crash)  # fmt: skip
        data = runner.run(read, info)
        try:
            messages.append(self._sink.write(batch_id, data))
            if not runner.finished:
                raise HeadraceError(
                    f"sink '{self._sink_connector}' returned from write() without reading the whole batch; "
                    "a sink must consume every record batch it is given"
                )
            if wal is not None:
                tw = time.monotonic()
                wal.result()  # the write-ahead entry is durable before anything is committed
                t_wal += time.monotonic() - tw
            self._settle_bad_records(batch_id, counts)  # dead letters: after the WAL, before the commit
            tc = time.monotonic()
            self._settle_commit()  # the previous batch's marker is durable; its sources commit
            t_commit = time.monotonic() - tc
            crash("before_sink_commit", batch_id)
            self._sink.commit(batch_id, messages)
        except BaseException:
            if wal is not None:
                with contextlib.suppress(Exception):
                    wal.result()
            with contextlib.suppress(Exception):
                self._sink.abort(batch_id, messages or [None])
            raise
        finally:
            data.close()
            read.close()
        t_add = time.monotonic() - t - t_commit
        crash("after_sink_commit", batch_id)
        event_time = self._tracker.after_batch(info.watermark_ms)
        self._last_watermark = info.watermark_ms
        t = time.monotonic()
        done = self._checkpoint.write_commit_async(batch_id, self._tracker.commit_info())
        if crash.point:  # crash tests need the marker on disk at the named point
            done.result()
        crash("after_commit", batch_id)
        self._deferred_commit = (done, list(ends))  # source.commit once the marker is durable
        t_commit += time.monotonic() - t
        total = time.monotonic() - t0
        self._report(batch_id, wall, starts, ends, counts.input_rows, runner.rows_out,
                     {"latestOffset": t_latest, "walCommit": t_wal, "addBatch": t_add,
                      "commitOffsets": t_commit, "triggerExecution": total},
                     event_time=event_time, state_operators=runner.state_metrics())  # fmt: skip

    def _settle_bad_records(self, batch_id: int, counts: BatchCounts) -> None:
        settle_bad_records(self, batch_id, counts)

    def _report(
        self,
        batch_id: int,
        wall: float,
        starts: list[Offset],
        ends: list[Offset],
        counts: list[int],
        out_rows: int,
        durations: dict[str, float],
        latencies: dict[str, Sequence[float]] | None = None,
        *,
        event_time: dict[str, str] | None = None,
        state_operators: list[dict[str, Any]] | None = None,
    ) -> None:
        srcs = []
        for plan, src, st, en, n in zip(self._plans, self._sources, starts, ends, counts, strict=True):
            try:
                metrics = dict(src.metrics(en))
            except Exception as e:  # metrics must never fail a batch
                metrics = {"error": redact(e)}
            bad = getattr(src, "bad_records", None)
            if bad is not None:
                metrics.update(bad.metrics())
            srcs.append((plan.describe(), st, en, metrics.pop("latestOffset", en), n, metrics))
        sink_metrics: dict[str, Any] = {}
        get_metrics = getattr(self._sink, "metrics", None)  # duck-typed sinks may lack it
        if callable(get_metrics):
            try:
                sink_metrics = dict(get_metrics())
            except Exception as e:  # metrics must never fail a batch
                sink_metrics = {"error": redact(e)}
        sink_bad = getattr(self._sink, "bad_records", None)
        if sink_bad is not None:
            sink_metrics.update(sink_bad.metrics())
        sink_metrics.update(transform_bad_record_metrics(self))
        skipped = sink_metrics.get("numRowsSkipped")
        if isinstance(skipped, int) and not isinstance(skipped, bool) and skipped > 0:
            # the sink already held this batch (a replay): its rows are not output again
            out_rows = max(0, out_rows - skipped)
        progress = QueryProgress.build(
            id=self.id,
            run_id=self.run_id,
            name=self.name,
            batch_id=batch_id,
            started=wall,
            durations=durations,
            previous_trigger=self._last_trigger,
            sources=srcs,
            sink=(self._sink_connector, out_rows, sink_metrics),
            latencies=latencies,
            event_time=event_time,
            state_operators=state_operators,
        )
        self._last_trigger = wall
        self._progress.append(progress)
        if len(self._progress) > self._keep:
            del self._progress[0]
        self._processed_batches += 1
        for cb in self._callbacks:
            cb(progress)
        from headrace.plugins import registry

        hook = registry().hook
        listeners = bool(hook.headrace_query_progress.get_hookimpls())
        d = progress.to_dict() if listeners or self._history is not None else {}
        if self._history is not None:
            self._history.append(d)
        if listeners:
            try:
                hook.headrace_query_progress(progress=d)
            except Exception as e:
                log.warning("a progress listener failed: %s", redact(e))
        if log.isEnabledFor(logging.DEBUG):
            log.debug("%s", progress.line())

    def _real_time_batch(self, batch_id: int, starts: list[Offset], metadata: dict[str, Any] | None = None) -> list[Offset]:
        self._settle_commit()
        return run_real_time_batch(self, batch_id, starts, metadata)
