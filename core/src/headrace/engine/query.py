"""``StreamingQuery``: the checkpointed micro-batch loop, triggers, progress, stop and await.

Per batch, with Spark's semantics (``headrace.engine.planner`` plans a batch,
``headrace.engine.microbatch`` runs it, ``headrace.engine.report`` reports it):

1. ``end = source.latest_offset(start, limit)`` for each source; no new data -> no batch.
2. ``offsets/<n>`` written (write-ahead, atomic, durable before the sink commits anything).
3. Partitions read, the stream's plan applied, ``sink.write`` then ``sink.commit(n, messages)``.
4. ``commits/<n>`` renamed into place, and ``source.commit(end)`` once it is durable
   (``headrace.engine.commits``; Spark defers ``Source.commit`` to the next batch likewise).

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
from concurrent.futures import Future
from typing import Any

import pyarrow as pa

from headrace.checkpoint import Checkpoint
from headrace.engine.commits import SourceCommits
from headrace.engine.deadletters import close_dead_letter_sinks, settle_bad_records
from headrace.engine.loop import run_loop
from headrace.engine.plan import PlanRunner
from headrace.engine.planner import LOOK_AHEAD, Planner
from headrace.engine.read_mode import ReadMode
from headrace.engine.reader import BatchCounts, ReadLane
from headrace.engine.real_time import run_real_time_batch
from headrace.engine.setup import resolve_plan, setup_query
from headrace.engine.trigger import SourcePlan, Transform, Trigger
from headrace.engine.watermark import EventTimeTracker
from headrace.errors import (
    HeadraceError,
    StreamingQueryException,
    redact,
    scrub_exception,
)
from headrace.helpers.crash import CrashHook
from headrace.history import ProgressHistory
from headrace.options import Options
from headrace.progress import QueryProgress
from headrace.protocols import Offset, Sink, Source
from headrace.transforms.operator import Operator
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
        state_snapshot_interval: int = 10,
        watermark_policy: str = "min",
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
        self._snapshot_interval = state_snapshot_interval
        self._watermark_policy = watermark_policy  # multipleWatermarkPolicy (headrace.engine.watermark)
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
        self._pool: ReadLane | None = None
        self._read_mode = ReadMode()
        self._crash = CrashHook.from_env()
        self._last_trigger: float | None = None
        self._current_batch: int | None = None
        self._processed_batches = 0
        self._idle_checks = 0
        self._last_watermark: int | None = None
        self._planner = Planner(self)
        self._source_commits = SourceCommits(self._sources, max_pending=LOOK_AHEAD + 2, flush=self._flush_commits)
        self._marker_in_flight: Future[None] | None = None  # a marker written whole, not yet visible
        self._ran = 0  # micro-batches this run has finished (the planner plans ahead after the first)
        self._hook: Any = None  # the plugin hooks (progress listeners), from the run's start

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

    # ------------------------------------------------------------------ PySpark's spellings
    @property
    def isActive(self) -> bool:
        """PySpark's name of :attr:`is_active`."""
        return self.is_active

    @property
    def lastProgress(self) -> dict[str, Any] | None:
        """PySpark's name of :attr:`last_progress` (the same dict, Spark's keys)."""
        return self.last_progress

    @property
    def recentProgress(self) -> list[dict[str, Any]]:
        """PySpark's name of :attr:`recent_progress`."""
        return self.recent_progress

    @property
    def runId(self) -> str:
        """PySpark's name of :attr:`run_id`."""
        return self.run_id

    def awaitTermination(self, timeout: float | None = None) -> bool:
        """PySpark's name of :meth:`await_termination` (called on the caller's thread, blocks)."""
        return self.await_termination(timeout)

    def processAllAvailable(self, timeout: float | None = None) -> None:
        """PySpark's name of :meth:`process_all_available` (called on the caller's thread, blocks)."""
        self.process_all_available(timeout)

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
        return resolve_plan(self, schema)

    def _new_history(self, location: str) -> ProgressHistory:
        return ProgressHistory(location, keep=self._keep)

    def _setup(self) -> None:
        setup_query(self)
        log.info(
            "query '%s' (id %s, run %s) starting: %s -> %s, trigger %s, delivery %s, checkpoint %s",
            self.name, self.id, self.run_id, ", ".join(p.describe() for p in self._plans),
            self._sink_connector, self.trigger, self.delivery_guarantee, self._checkpoint_location,
        )  # fmt: skip

    # ------------------------------------------------------------------ loop
    def _run(self) -> None:
        from headrace.plugins import registry

        hook = self._hook = registry().hook
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
            self._pool = ReadLane(self._parallelism)
            self._read_mode = ReadMode.for_sources(self._sources)
            try:
                batch_id = run_loop(self)
            finally:
                self._planner.discard()  # batches planned ahead that did not run: forgotten
                self._settle_commit()  # the last batches' markers durable, their sources committed
        except BaseException as e:
            e = scrub_exception(e)  # no secret in q.exception(), its traceback or the log line
            self._exception = StreamingQueryException(self.name or self.id, self._current_batch, e)
            self._exception.__cause__ = e
            # query_failure: the headrace command reports this failure itself and drops the record
            log.error("query '%s' failed: %s", self.name, e, exc_info=e, extra={"query_failure": True})
        finally:
            self._status = {"message": "Stopped", "isDataAvailable": False, "isTriggerActive": False}
            if self._history is not None:
                with contextlib.suppress(Exception):
                    self._history.finish(run_id=self.run_id, exception=self._exception,
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

    def _settle_commit(self) -> None:
        """Wait until every finished batch's ``commits/<n>`` is durable, then
        ``source.commit(end)`` for each, in order (on the loop's thread, as every source call).
        Called when a trigger finds no new data, before a real-time batch and when the loop ends;
        at every batch, :meth:`SourceCommits.settle` commits what is durable without waiting."""
        self._wait_marker()
        self._source_commits.settle(wait=True)

    def _flush_commits(self) -> None:
        if self._checkpoint is not None:
            self._checkpoint.flush_commits()

    def _wait_marker(self) -> None:
        """Wait until the last batch's marker is visible, when it was written whole in the
        background (with a watermark): before the next sink commit, so a crash never replays a
        batch before the last one the sink committed."""
        pending, self._marker_in_flight = self._marker_in_flight, None
        if pending is not None:
            pending.result()

    def _settle_bad_records(self, batch_id: int, counts: BatchCounts) -> None:
        settle_bad_records(self, batch_id, counts)

    def _real_time_batch(self, batch_id: int, starts: list[Offset], metadata: dict[str, Any] | None = None) -> list[Offset]:
        self._settle_commit()
        return run_real_time_batch(self, batch_id, starts, metadata)
