"""``StreamingQuery``: a query's public API (PySpark's), its thread and its progress list.

Each ``start()`` makes one run (:class:`headrace.engine.run.QueryRun`, built by
``headrace.engine.setup``), which the engine's modules drive on the query's thread
(``headrace.engine.loop``); they never read the ``StreamingQuery``.

Per batch, with Spark's semantics (``headrace.engine.planner`` plans a batch,
``headrace.engine.microbatch`` runs it, ``headrace.engine.report`` reports it):

1. ``end = source.latest_offset(start, limit)`` for each source; no new data -> no batch.
2. ``offsets/<n>`` written (write-ahead, atomic, durable before the sink commits anything).
3. Partitions read, the stream's plan applied, ``sink.write`` then ``sink.commit(n, messages)``.
4. ``commits/<n>`` made, and ``source.commit(end)`` once it is durable (the rules of what
   becomes durable when: ``headrace.engine.commits.CommitOrder``; Spark defers
   ``Source.commit`` to the next batch likewise).

With ``with_watermark``, ``offsets/<n>`` also records the batch's watermark
(``headrace.engine.watermark``), and when the watermark moves while no new data arrives, a
batch without data runs so that stateful operators can emit and evict (Spark's no-data batch).

On start, a last batch with an offsets entry and no commits entry is replayed over the same
range with the same batch id, so a sink whose commit is idempotent per batch id gives
exactly-once output across crashes. Real-time batches live in ``headrace.engine.real_time``.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from headrace.engine.loop import run_loop
from headrace.engine.run import QueryRun, QuerySpec, RunStatus
from headrace.engine.setup import setup_query
from headrace.engine.source_plan import SourcePlan
from headrace.engine.trigger import Trigger
from headrace.errors import (
    HeadraceError,
    StreamingQueryException,
    redact,
    scrub_exception,
)
from headrace.options import Options
from headrace.progress import QueryProgress
from headrace.state.backends import DEFAULT_HELD_KEYS_MB
from headrace.transforms.operator import Operator
from headrace.transforms.stateless import MapBatchesOperator, Transform

__all__ = ["StreamingQuery"]

log = logging.getLogger(__name__)


class _FrozenHeap:
    """While queries run, the objects alive when each started (modules, connectors, the plan)
    sit in the garbage collector's permanent generation (``gc.freeze``): a full collection, which
    the batches' short-lived objects trigger (a Kafka source makes a million message objects per
    million messages), then walks only what the batches made instead of the hundreds of
    thousands of objects imports and setup left, which live on anyway. Objects freed by reference
    counting are freed as always; cycles among frozen objects wait until the last query stops,
    when everything is unfrozen (unless the application had frozen objects itself before: then
    its freeze is kept). ``query_started`` is called on the caller's thread of ``start``,
    ``query_stopped`` on the query's thread when it ends; both once per run."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running = 0
        self._keep = False  # the application's own freeze: never undone

    def query_started(self) -> None:
        with self._lock:
            if self._running == 0:
                self._keep = gc.get_freeze_count() > 0
            self._running += 1
            gc.freeze()

    def query_stopped(self) -> None:
        with self._lock:
            self._running -= 1
            if self._running == 0 and not self._keep:
                gc.unfreeze()


_HEAP = _FrozenHeap()


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
        rocksdb_held_keys_mb: int = DEFAULT_HELD_KEYS_MB,
    ) -> None:
        if not sources:
            raise HeadraceError("a query needs at least one source")
        ops = list(operators)
        if transform is not None:
            ops.append(MapBatchesOperator(transform))
        self._spec = QuerySpec(
            name=name,
            plans=tuple(sources),
            operators=tuple(ops),
            sink_connector=sink_connector,
            sink_class=sink_class,
            sink_options=sink_options,
            output_mode=output_mode,
            trigger=trigger,
            checkpoint_location=checkpoint_location or tempfile.mkdtemp(prefix="headrace-checkpoint-"),
            temp_checkpoint=checkpoint_location is None,
            read_parallelism=read_parallelism or min(8, max(2, (os.cpu_count() or 2))),
            checkpoint_fsync=checkpoint_fsync,
            state_store=state_store,
            state_snapshot_interval=state_snapshot_interval,
            rocksdb_held_keys_mb=rocksdb_held_keys_mb,
            keep_progress=keep_progress,
            watermark_policy=watermark_policy,
        )
        self.name = name
        self.output_mode = output_mode
        self.trigger = trigger
        self.run_id = str(uuid.uuid4())
        self.id = ""
        self._callbacks = list(progress_callbacks)
        self._progress: list[QueryProgress] = []
        self._stop = threading.Event()
        self._terminated = threading.Event()
        self._exception: StreamingQueryException | None = None
        self._run_status = RunStatus()
        self._thread: threading.Thread | None = None
        self._run: QueryRun | None = None

    # ------------------------------------------------------------------ public API
    @property
    def is_active(self) -> bool:
        return self._thread is not None and not self._terminated.is_set()

    @property
    def status(self) -> dict[str, Any]:
        return dict(self._run_status.status)

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
        run = self._run
        sources: list[Any] = list(run.sources) if run is not None else [p.source_class for p in self._spec.plans]
        sink: Any = run.sink if run is not None else self._spec.sink_class
        replayable = all(getattr(s, "replayable", False) for s in sources)
        idempotent = bool(getattr(sink, "idempotent_commit", False))
        return "exactly-once" if replayable and idempotent else "at-least-once"

    @property
    def checkpoint_location(self) -> str:
        return self._spec.checkpoint_location

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
        target = self._run_status.idle_checks + 2
        while self.is_active:
            if self._run_status.idle_checks >= target:
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
        self._thread = threading.Thread(target=self._run_thread, name=f"headrace-query-{self.name or self.id[:8]}",
                                        daemon=True)  # fmt: skip
        _HEAP.query_started()
        self._thread.start()
        return self

    def _setup(self) -> None:
        self._run = run = setup_query(self._spec, run_id=self.run_id, stop=self._stop, status=self._run_status,
                                      publish=self._publish)  # fmt: skip
        self.id = run.id
        log.info(
            "query '%s' (id %s, run %s) starting: %s -> %s, trigger %s, delivery %s, checkpoint %s",
            self.name, self.id, self.run_id, ", ".join(run.source_descriptions),
            self._spec.sink_connector, self.trigger, self.delivery_guarantee, self._spec.checkpoint_location,
        )  # fmt: skip

    def _publish(self, progress: QueryProgress) -> None:
        """A batch's report from the run (on the query's thread): kept for ``recent_progress``
        (the last ``keep_progress``), then handed to the ``on_progress`` callbacks."""
        self._progress.append(progress)
        if len(self._progress) > self._spec.keep_progress:
            del self._progress[0]
        for cb in self._callbacks:
            cb(progress)

    # ------------------------------------------------------------------ loop
    def _run_thread(self) -> None:
        run = self._run
        assert run is not None
        hook = run.hook
        with contextlib.suppress(Exception):
            hook.headrace_query_started(
                event={"id": self.id, "runId": self.run_id, "name": self.name, "timestamp": time.time(),
                       "deliveryGuarantee": self.delivery_guarantee}
            )
        batch_id: int | None = None
        try:
            try:
                batch_id = run_loop(run)
            finally:
                run.planner.discard()  # batches planned ahead that did not run: forgotten
                run.commits.settle()  # the last batches' markers durable, their sources committed
        except BaseException as e:
            e = scrub_exception(e)  # no secret in q.exception(), its traceback or the log line
            self._exception = StreamingQueryException(self.name or self.id, self._run_status.current_batch, e)
            self._exception.__cause__ = e
            # query_failure: the headrace command reports this failure itself and drops the record
            log.error("query '%s' failed: %s", self.name, e, exc_info=e, extra={"query_failure": True})
        finally:
            self._run_status.set("Stopped", data_available=False, trigger_active=False)
            failed_batch = self._run_status.current_batch
            if run.history is not None:
                with contextlib.suppress(Exception):
                    run.history.finish(run_id=self.run_id, exception=self._exception, batch_id=failed_batch)
            run.close()
            if "headrace.transforms.expressions" in sys.modules:  # DuckDB was used on this thread
                sys.modules["headrace.transforms.expressions"].release_thread()
            with contextlib.suppress(Exception):
                hook.headrace_query_terminated(
                    event={"id": self.id, "runId": self.run_id, "name": self.name,
                           "exception": str(self._exception) if self._exception else None,
                           "lastBatchId": batch_id,
                           "failedBatchId": failed_batch if self._exception else None}
                )
            _HEAP.query_stopped()
            self._terminated.set()
