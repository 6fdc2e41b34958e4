"""What one run of a query is made of, as the engine's modules see it.

- :class:`QuerySpec`: the query as it was defined (sources, operators, sink, trigger, writer
  options); immutable, built by ``StreamingQuery`` when the query is created.
- :class:`RunStatus`: what the running query tells its ``StreamingQuery`` (the status message,
  the batch running, the idle checks ``process_all_available`` waits for); written by the
  query's thread, read by any.
- :class:`QueryRun`: one run, returned by ``headrace.engine.setup.setup_query``: the checkpoint,
  the sources (a tuple, fixed for the run), the sink, the plan runner, the event-time tracker,
  the planner, the commit order, the read lane and read mode, the crash hook, the plugin hooks
  and the progress history. Its parts never change during the run; what the loop moves from
  batch to batch is in :attr:`QueryRun.loop` (:class:`LoopState`).

``StreamingQuery`` keeps the public API, the thread and the progress list; every engine module
works on a :class:`QueryRun` and never on the ``StreamingQuery``.
"""

from __future__ import annotations

import logging
import shutil
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from headrace.errors import redact
from headrace.state.backends import DEFAULT_HELD_KEYS_MB

if TYPE_CHECKING:
    from headrace.checkpoint import Checkpoint
    from headrace.engine.commits import CommitOrder
    from headrace.engine.plan import PlanRunner
    from headrace.engine.planner import Planner
    from headrace.engine.read_mode import ReadMode
    from headrace.engine.reader import ReadLane
    from headrace.engine.source_plan import SourcePlan
    from headrace.engine.trigger import Trigger
    from headrace.engine.watermark import EventTimeTracker
    from headrace.helpers.crash import CrashHook
    from headrace.history import ProgressHistory
    from headrace.options import Options
    from headrace.progress import QueryProgress
    from headrace.protocols import Sink, Source
    from headrace.transforms.operator import Operator

__all__ = ["LoopState", "QueryRun", "QuerySpec", "RunStatus"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class QuerySpec:
    """A query as defined: what every run of it starts from. Built once by ``StreamingQuery``;
    read by the engine (on the caller's thread at ``start()``, then on the query's thread);
    never pickled or persisted."""

    name: str
    plans: tuple[SourcePlan, ...]
    operators: tuple[Operator, ...]
    sink_connector: str
    sink_class: type
    sink_options: Options
    output_mode: str
    trigger: Trigger
    checkpoint_location: str
    temp_checkpoint: bool  # made for this query (no checkpointLocation): deleted when it stops
    read_parallelism: int
    checkpoint_fsync: bool = True
    state_store: str = "memory"
    state_snapshot_interval: int = 10
    rocksdb_held_keys_mb: int = DEFAULT_HELD_KEYS_MB  # rocksdbHeldKeysMB (headrace.state.rocksdb)
    keep_progress: int = 100
    watermark_policy: str = "min"  # multipleWatermarkPolicy (headrace.engine.watermark)


class RunStatus:
    """What a query's run tells the ``StreamingQuery`` while it runs: Spark's status dict
    (:attr:`status`), the batch being run (:attr:`current_batch`, named by the exception of a
    failed query) and the number of times a trigger found no new data (:attr:`idle_checks`,
    what ``process_all_available`` waits for). Written by the query's thread only; read from
    any thread (each attribute is replaced whole, never changed in place)."""

    def __init__(self) -> None:
        self.status: dict[str, Any] = {"message": "Initializing", "isDataAvailable": False, "isTriggerActive": False}
        self.current_batch: int | None = None
        self.idle_checks = 0

    def set(self, message: str, *, data_available: bool, trigger_active: bool) -> None:
        """Replace the status (Spark's ``StreamingQueryStatus`` keys). Called a few times per batch."""
        self.status = {"message": message, "isDataAvailable": data_available, "isTriggerActive": trigger_active}


@dataclass
class LoopState:
    """What the loop carries from one batch to the next within a run (on the query's thread)."""

    last_watermark: int | None = None  # the watermark the last batch ran with (no-data batches)
    batches_run: int = 0  # micro-batches this run has finished (the planner plans ahead after the first)
    last_trigger: float | None = None  # when the last reported batch started (time.time())


@dataclass(frozen=True, eq=False)
class QueryRun:
    """One run of a query: built by ``setup_query`` when ``StreamingQuery.start`` is called,
    driven by the loop on the query's thread, closed once when the run ends (:meth:`close`).
    Nothing in it is pickled."""

    spec: QuerySpec
    id: str  # the query's id (from the checkpoint's metadata)
    run_id: str
    checkpoint: Checkpoint
    sources: tuple[Source, ...]
    sink: Sink
    runner: PlanRunner
    tracker: EventTimeTracker
    commits: CommitOrder
    planner: Planner
    lane: ReadLane
    read_mode: ReadMode
    crash: CrashHook
    hook: Any  # the plugin hooks (progress listeners)
    history: ProgressHistory | None  # None when the checkpoint cannot hold one
    stop: threading.Event  # set by StreamingQuery.stop
    status: RunStatus
    publish: Callable[[QueryProgress], None]  # a batch's report to the StreamingQuery (kept, callbacks)
    source_descriptions: tuple[str, ...]  # per source, for progress (paths redacted)
    loop: LoopState = field(default_factory=LoopState)

    @property
    def name(self) -> str:
        return self.spec.name

    def close(self) -> None:
        """Release everything the run opened: reader lane, operators, sources, sink, dead-letter
        sinks, checkpoint (and a temporary checkpoint's folder). Called once, when the run ends,
        on the query's thread; errors are logged, never raised."""
        from headrace.engine.deadletters import close_dead_letter_sinks

        self.lane.shutdown(wait=True, cancel_futures=True)
        self.runner.close()
        close_parts(self.sources, self.sink)
        close_dead_letter_sinks(self)
        self.checkpoint.close()
        if self.spec.temp_checkpoint:
            shutil.rmtree(self.spec.checkpoint_location, ignore_errors=True)


def close_parts(sources: tuple[Source, ...] | list[Source], sink: Sink | None) -> None:
    """Close sources then sink, logging (redacted) what fails. Called once per run."""
    for s in sources:
        try:
            s.close()
        except Exception as e:
            log.warning("closing source failed: %s", redact(e))
    if sink is not None:
        try:
            sink.close()
        except Exception as e:
            log.warning("closing sink failed: %s", redact(e))
