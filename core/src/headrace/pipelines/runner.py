"""Running a pipeline: triggered (every flow once, available-now, in dependency order) or
continuous (every flow running with its trigger until stopped).

Full refresh of a dataset: a marker is written, the table truncated (one Delta commit) and its
flows' checkpoints reset, then the flows recompute it; the marker goes once they complete, so a
run killed in between redoes the whole refresh. A failing flow marks every flow downstream of it
skipped; unrelated flows go on. One pipeline run at a time per storage root (a lock file).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from headrace._words import counted, plural
from headrace.errors import HeadraceError
from headrace.pipelines.elements import MATERIALIZED_VIEW, SINK, STREAMING_TABLE, Flow
from headrace.pipelines.events import EventLog
from headrace.pipelines.expectations import ExpectationRunner
from headrace.pipelines.flows import WaitingForUpstream, compute_materialized_view, setup_stream_flow
from headrace.pipelines.graph import GraphError, continuous_check_interval
from headrace.pipelines.spec import LoadedPipeline, in_dir

__all__ = ["PipelineRun", "RunResult"]

log = logging.getLogger(__name__)

COMPLETED, FAILED, SKIPPED, RUNNING, STOPPED, WAITING = "COMPLETED", "FAILED", "SKIPPED", "RUNNING", "STOPPED", "WAITING"


@dataclass
class RunResult:
    """How a run ended: the run's state and each flow's (``COMPLETED``, ``FAILED``, ...)."""

    update_id: str
    state: str
    flows: dict[str, str] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.state == COMPLETED or self.state == STOPPED


class PipelineRun:
    """One run of a loaded pipeline. ``run()`` blocks; ``stop()`` (another thread or a signal
    handler) ends a continuous run after the running batches commit."""

    def __init__(
        self,
        pipeline: LoadedPipeline,
        *,
        full_refresh: Sequence[str] = (),
        full_refresh_all: bool = False,
        refresh: Sequence[str] = (),
        continuous: bool = False,
        out: Callable[[str], None] | None = print,
    ) -> None:
        if full_refresh_all and (full_refresh or refresh):
            raise HeadraceError("--full-refresh-all refreshes everything; drop --full-refresh / --refresh")
        self.pipeline = pipeline
        self.graph = pipeline.graph
        self.storage = pipeline.storage
        self.full_refresh = list(full_refresh)
        self.full_refresh_all = full_refresh_all
        self.refresh = list(refresh)
        self.continuous = continuous
        self._out = out
        self.update_id = str(uuid.uuid4())
        self.events = EventLog(self.storage.event_log, pipeline.spec.name, self.update_id)
        self._stop = threading.Event()
        self.status: dict[str, str] = {}
        self.errors: dict[str, str] = {}
        self._blocked: dict[str, str] = {}
        self._queries: dict[str, Any] = {}

    # ------------------------------------------------------------------ helpers
    def say(self, line: str) -> None:
        if self._out is not None:
            self._out(line)

    def stop(self) -> None:
        """End the run: running batches finish and commit, then every query stops."""
        self._stop.set()

    def _flow_event(self, flow: Flow, status: str, message: str, *, level: str = "INFO", **details: Any) -> None:
        self.status[flow.name] = status
        self.events.emit("flow_progress", message, level=level, flow=flow.name, dataset=flow.target,
                         details={"status": status, **details})  # fmt: skip

    def _on_batch(self, flow: Flow, progress: Any, exps: ExpectationRunner) -> None:
        d = progress.to_dict()
        dq = exps.take()
        metrics = {"batch_id": d.get("batchId"), "num_input_rows": d.get("numInputRows"),
                   "num_output_rows": (d.get("sink") or {}).get("numOutputRows", d.get("numInputRows")),
                   "duration_ms": (d.get("durationMs") or {}).get("triggerExecution")}  # fmt: skip
        backlog = progress.backlog() if hasattr(progress, "backlog") else {}
        if backlog:
            metrics["backlog"] = backlog
        self._flow_event(flow, RUNNING, f"batch {d.get('batchId')}: {counted(d.get('numInputRows', 0), 'row')}",
                         metrics=metrics, data_quality=dq)  # fmt: skip
        line = progress.line()
        if dq["expectations"]:
            failed = ", ".join(f"{e['name']}={e['failed_records']}" for e in dq["expectations"] if e["failed_records"])
            line += f"  expectations failed: {failed or 'none'}" + (f", dropped {dq['dropped_records']}" if dq["dropped_records"] else "")
        self.say(line)

    def _fail(self, flow: Flow, e: BaseException) -> None:
        cause = e.__cause__ if e.__cause__ is not None and type(e).__name__ == "StreamingQueryException" else e
        msg = f"{type(cause).__name__}: {cause}"
        self.errors[flow.name] = msg
        self._flow_event(flow, FAILED, f"flow {flow.name!r} failed: {msg}", level="ERROR", error=msg)
        self.say(f"{flow.name}: FAILED: {msg}")
        for d in self.graph.downstream_flows(flow):
            self._blocked.setdefault(d.name, flow.name)
            q = self._queries.get(d.name)
            if q is not None:
                q.stop(timeout=30)

    # ------------------------------------------------------------------ selection and refresh
    def _select(self) -> tuple[list[Flow], set[str]]:
        names = {*self.full_refresh, *self.refresh}
        unknown = sorted(n for n in names if self.graph.lookup(n) is None)
        if unknown:
            known = ", ".join(sorted(ds.name for ds in self.graph.datasets))
            raise HeadraceError(f"--refresh/--full-refresh name unknown {plural(len(unknown), 'dataset')} {unknown}; "
                                f"datasets: {known}")  # fmt: skip
        persisted = {ds.name for ds in self.graph.datasets if self.graph.kind_of(ds) in (STREAMING_TABLE, MATERIALIZED_VIEW)}
        fr = set(persisted) if self.full_refresh_all else {self.graph.lookup(n).name for n in self.full_refresh}  # type: ignore[union-attr]
        pending = {n for n in self.storage.pending_full_refreshes() if n in persisted}
        if pending - fr:
            self.say(f"redoing the interrupted full refresh of {', '.join(sorted(pending - fr))}")
        fr |= pending
        kept = {n for n in fr if str(self.graph.lookup(n).table_properties.get("pipelines.reset.allowed", "true")).lower() == "false"}  # type: ignore[union-attr]
        for n in sorted(kept):
            self.say(f"{n}: not fully refreshed (pipelines.reset.allowed = false); it is updated incrementally")
            self.storage.clear_full_refresh(n)
        fr -= kept
        order = self.graph.order()
        if names and not self.full_refresh_all:
            wanted = {self.graph.lookup(n).name for n in names} | fr  # type: ignore[union-attr]
            order = [f for f in order if self.graph.lookup(f.target).name in wanted]  # type: ignore[union-attr]
        return order, fr

    def _full_refresh(self, names: set[str]) -> None:
        for name in sorted(names):
            self.storage.mark_full_refresh(name)
            truncated = self.storage.truncate(name)
            flows = self.graph.flows_into(name)
            for f in flows:
                self.storage.reset_flow(name, f.name)
            self.events.emit("full_refresh", f"{name}: truncated and {counted(len(flows), 'flow checkpoint')} reset", dataset=name,
                             details={"truncated": truncated, "flows": [f.name for f in flows]})  # fmt: skip
            self.say(f"{name}: full refresh (table truncated, checkpoints of {', '.join(f.name for f in flows)} reset)")
            readers = sorted({f.target for f in self.graph.flows if name in self.graph.stream_reads(f)} - names)
            if readers:
                msg = (f"{', '.join(readers)} read {name} as a stream and will see its recomputed rows as new rows; "
                       f"full-refresh them too (--full-refresh {','.join([name, *readers])}) to rebuild the chain")  # fmt: skip
                self.events.emit("full_refresh", msg, level="WARN", dataset=name, details={"downstream": readers})
                self.say(f"warning: {msg}")

    # ------------------------------------------------------------------ run
    def run(self) -> RunResult:
        """Run the pipeline (blocks). Raises GraphError (nothing run) for an invalid graph."""
        os.makedirs(self.storage.local_root, exist_ok=True)
        lock_path = os.path.join(self.storage.local_root, ".lock")
        with open(lock_path, "a") as lock, in_dir(self.pipeline.spec.base_dir):
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise HeadraceError(f"pipeline {self.pipeline.spec.name!r} is already running on {self.storage.root} "
                                    f"(lock {lock_path} held); wait for it or stop it") from None  # fmt: skip
            return self._run_locked()

    def _run_locked(self) -> RunResult:
        mode = "continuous" if self.continuous else "triggered"
        self.events.emit("create_update", f"run started ({mode})", details={
            "mode": mode, "full_refresh": self.full_refresh, "full_refresh_all": self.full_refresh_all,
            "refresh": self.refresh})  # fmt: skip
        try:
            self.graph.analyze()
            order, fr = self._select()
            self._full_refresh(fr)
        except (GraphError, HeadraceError) as e:
            self.events.emit("update_progress", f"run failed: {e}", level="ERROR", details={"state": FAILED, "error": str(e)})
            raise
        self.events.emit("update_progress", "running", details={"state": RUNNING, "graph_dot": self._graph_dot()})
        try:
            if self.continuous:
                self._run_continuous(order)
            else:
                self._run_triggered(order)
        except BaseException as e:
            for q in self._queries.values():
                with contextlib.suppress(Exception):
                    q.stop(timeout=10)
            self.events.emit("update_progress", f"run interrupted: {type(e).__name__}: {e}", level="ERROR",
                             details={"state": FAILED})  # fmt: skip
            raise
        for name in fr:
            if all(self.status.get(f.name) == COMPLETED for f in self.graph.flows_into(name)):
                self.storage.clear_full_refresh(name)
        failed = [n for n, s in self.status.items() if s == FAILED]
        state = FAILED if failed else (STOPPED if self.continuous else COMPLETED)
        msg = f"run {state.lower()}" + (f"; failed flows: {', '.join(failed)}" if failed else "")
        self.events.emit("update_progress", msg, level="ERROR" if failed else "INFO", details={"state": state})
        return RunResult(self.update_id, state, dict(self.status), dict(self.errors))

    def _graph_dot(self) -> str | None:
        """The flow graph as graphviz DOT (what ``pipelines graph`` draws), for the dashboard."""
        from headrace.pipelines.render import render_dot

        try:
            return render_dot(self.graph, stats=False)
        except Exception as e:  # a picture never fails a run
            log.warning("pipeline %s: no flow graph in the event log: %s", self.pipeline.spec.name, e)
            return None

    def _is_mv(self, flow: Flow) -> bool:
        t = self.graph.lookup(flow.target)
        return t is not None and self.graph.kind_of(t) == MATERIALIZED_VIEW

    def _run_triggered(self, order: list[Flow]) -> None:
        for flow in order:
            if self._stop.is_set():
                break
            if flow.name in self._blocked:
                self._flow_event(flow, SKIPPED, f"skipped: upstream flow {self._blocked[flow.name]!r} failed")
                self.say(f"{flow.name}: SKIPPED (upstream flow {self._blocked[flow.name]} failed)")
                continue
            if flow.once and self.storage.once_done(flow.name):
                self._flow_event(flow, COMPLETED, "once=True flow already ran; a full refresh of its target runs it again")
                continue
            self._flow_event(flow, "STARTING", "starting")
            t0 = time.monotonic()
            try:
                if self._is_mv(flow):
                    m = compute_materialized_view(self.graph, flow)
                    self._flow_event(flow, COMPLETED, f"recomputed: {counted(m['num_output_rows'], 'row')}",
                                     metrics={"num_output_rows": m["num_output_rows"]}, data_quality=m["data_quality"])  # fmt: skip
                    self.say(f"{flow.name}: materialized view recomputed, {counted(m['num_output_rows'], 'row')} in "
                             f"{(time.monotonic() - t0) * 1000:.0f} ms")  # fmt: skip
                    continue
                setup = setup_stream_flow(self.graph, flow, continuous=False, on_batch=self._on_batch)
                q = setup.writer.start(setup.path)
                self._queries[flow.name] = q
                q.await_termination()
                if flow.once:
                    self.storage.mark_once_done(flow.name)
                rows = sum(p.get("numInputRows", 0) for p in q.recent_progress)
                self._flow_event(flow, COMPLETED, f"completed: {counted(len(q.recent_progress), 'batch')}, {counted(rows, 'row')}",
                                 metrics={"num_batches": len(q.recent_progress), "num_input_rows": rows})  # fmt: skip
                if not q.recent_progress:
                    self.say(f"{flow.name}: up to date (no new data)")
            except WaitingForUpstream as e:
                self._flow_event(flow, SKIPPED, f"skipped: {e}")
                self.say(f"{flow.name}: SKIPPED ({e})")
            except Exception as e:
                self._fail(flow, e)
            finally:
                self._queries.pop(flow.name, None)

    def _run_continuous(self, order: list[Flow]) -> None:
        interval = continuous_check_interval(self.graph.configuration)
        pending = list(order)
        mv_versions: dict[str, dict[str, int | None]] = {}
        while True:
            stopping = self._stop.is_set()
            for name, q in list(self._queries.items()):
                if not q.is_active:
                    flow = self.graph.registry.flows[name.lower()]
                    del self._queries[name]
                    exc = q.exception()
                    if exc is not None:
                        self._fail(flow, exc)
                    elif not stopping and flow.name not in self._blocked:
                        if flow.once:
                            self.storage.mark_once_done(flow.name)
                        self._flow_event(flow, COMPLETED, "the stream ended")
            if stopping:
                break
            for flow in list(pending):
                if flow.name in self._blocked:
                    pending.remove(flow)
                    self._flow_event(flow, SKIPPED, f"skipped: upstream flow {self._blocked[flow.name]!r} failed")
                    continue
                if self._is_mv(flow):
                    continue
                if flow.once and self.storage.once_done(flow.name):
                    pending.remove(flow)
                    self._flow_event(flow, COMPLETED, "once=True flow already ran")
                    continue
                try:
                    setup = setup_stream_flow(self.graph, flow, continuous=not flow.once, on_batch=self._on_batch)
                    self._queries[flow.name] = setup.writer.start(setup.path)
                    pending.remove(flow)
                    self._flow_event(flow, RUNNING, "started")
                    self.say(f"{flow.name}: started")
                except WaitingForUpstream as e:
                    if self.status.get(flow.name) != WAITING:
                        self._flow_event(flow, WAITING, f"waiting: {e}")
                except Exception as e:
                    pending.remove(flow)
                    self._fail(flow, e)
            for flow in order:
                if self._is_mv(flow) and flow.name not in self._blocked and self.status.get(flow.name) != FAILED:
                    self._refresh_mv_if_changed(flow, mv_versions)
            self._stop.wait(interval)
        for name, q in list(self._queries.items()):
            q.stop(timeout=60)
            flow = self.graph.registry.flows[name.lower()]
            exc = q.exception()
            if exc is not None:
                self._fail(flow, exc)
            else:
                self._flow_event(flow, STOPPED, "stopped")
        self._queries.clear()
        for flow in order:
            if self._is_mv(flow) and self.status.get(flow.name) not in (FAILED, SKIPPED):
                self._refresh_mv_if_changed(flow, mv_versions)
                if self.status.get(flow.name) != FAILED:
                    self.status[flow.name] = COMPLETED

    def _refresh_mv_if_changed(self, flow: Flow, seen: dict[str, dict[str, int | None]]) -> None:
        inputs = {n: self.storage.version(n) for n in self.graph.upstream(flow)
                  if (ds := self.graph.lookup(n)) is not None and self.graph.kind_of(ds) not in (SINK,)
                  and self.graph.kind_of(ds) in (STREAMING_TABLE, MATERIALIZED_VIEW)}  # fmt: skip
        if seen.get(flow.name) == inputs and self.storage.exists(flow.target):
            return
        try:
            m = compute_materialized_view(self.graph, flow)
        except WaitingForUpstream:
            return
        except Exception as e:
            self._fail(flow, e)
            return
        seen[flow.name] = inputs
        self._flow_event(flow, RUNNING, f"recomputed: {counted(m['num_output_rows'], 'row')}",
                         metrics={"num_output_rows": m["num_output_rows"]}, data_quality=m["data_quality"])  # fmt: skip
        self.say(f"{flow.name}: materialized view recomputed, {counted(m['num_output_rows'], 'row')}")
