"""The dataflow graph: datasets, flows and the edges their definitions' reads make.

``DataflowGraph.analyze()`` calls every definition once (no data read), learns what each reads,
tells streaming tables from materialized views for ``@dp.table``, and checks everything the
dry run reports at once: unknown names, cycles, flows into the wrong kind of dataset, sink and
source options, expectations. ``order()`` is the flows' dependency order.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from headrace._words import counted
from headrace.errors import HeadraceError, OptionsError
from headrace.options import Duration
from headrace.pipelines.batch_reads import NeedsData
from headrace.pipelines.elements import (
    MATERIALIZED_VIEW,
    SINK,
    STREAMING_TABLE,
    TABLE,
    Dataset,
    Flow,
    GraphRegistry,
    PipelineDefinitionError,
    name_problem,
)
from headrace.pipelines.resolver import STATIC, STREAM, Resolver, UnknownDataset, result_kind

if TYPE_CHECKING:
    from headrace.pipelines.storage import PipelineStorage

__all__ = ["DataflowGraph", "FlowInfo", "GraphError", "check_trigger_conf", "continuous_check_interval"]

log = logging.getLogger(__name__)


class GraphError(HeadraceError):
    """The pipeline's definitions do not make a valid graph; ``problems`` lists every issue."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__(f"{counted(len(problems), 'problem')} in the pipeline:\n" + "\n".join(f"  - {p}" for p in problems))


@dataclass
class FlowInfo:
    """What the analysis learnt about a flow: what it reads (name -> stream/static) and returns."""

    flow: Flow
    reads: dict[str, set[str]] = field(default_factory=dict)
    result: str | None = None
    error: str | None = None


class DataflowGraph:
    """Datasets and flows of a pipeline, with the storage they run against."""

    def __init__(
        self,
        registry: GraphRegistry,
        storage: PipelineStorage,
        *,
        base_dir: str,
        catalog: str | None = None,
        database: str | None = None,
    ) -> None:
        self.registry = registry
        self.storage = storage
        self.base_dir = base_dir
        self.catalog = catalog
        self.database = database
        self.configuration: dict[str, str] = {}
        self.info: dict[str, FlowInfo] = {}
        self._kinds: dict[str, str] = {}
        self._resolving: list[str] = []

    # ------------------------------------------------------------------ lookups
    def lookup(self, name: str) -> Dataset | None:
        """The dataset ``name`` names: ``x``, ``LIVE.x``, ``<database>.x`` or ``<catalog>.<database>.x``."""
        key = name.lower()
        ds = self.registry.datasets.get(key)
        if ds is not None:
            return ds
        parts = key.split(".")
        prefixes = [["live"]]
        if self.database:
            prefixes.append([self.database.lower()])
            if self.catalog:
                prefixes.append([self.catalog.lower(), self.database.lower()])
        for p in prefixes:
            if len(parts) == len(p) + 1 and parts[:-1] == p:
                return self.registry.datasets.get(parts[-1])
        return None

    def flows_into(self, name: str) -> list[Flow]:
        return [f for f in self.registry.flows.values() if self.lookup(f.target) is self.registry.datasets.get(name.lower())]

    def flow_of(self, name: str) -> Flow | None:
        """The defining flow of a table/view declared with a decorator (same name)."""
        return self.registry.flows.get(name.lower())

    def kind_of(self, ds: Dataset) -> str:
        """The dataset's kind; ``@dp.table`` becomes a streaming table or a materialized view
        from what its function returns (analysed on demand)."""
        if ds.kind != TABLE:
            return ds.kind
        key = ds.name.lower()
        if key in self._kinds:
            return self._kinds[key]
        if key in self._resolving:
            return STREAMING_TABLE  # a cycle: reported by the cycle check
        flow = self.flow_of(ds.name)
        self._resolving.append(key)
        try:
            info = self._analyze_flow(flow) if flow is not None else None
        finally:
            self._resolving.remove(key)
        kind = MATERIALIZED_VIEW if info is not None and info.result == STATIC else STREAMING_TABLE
        self._kinds[key] = kind
        return kind

    @property
    def datasets(self) -> list[Dataset]:
        return list(self.registry.datasets.values())

    @property
    def flows(self) -> list[Flow]:
        return [f for f in self.registry.flows.values() if f.kind != "view"]

    # ------------------------------------------------------------------ analysis
    def _analyze_flow(self, flow: Flow) -> FlowInfo:
        key = flow.name.lower()
        if key in self.info:
            return self.info[key]
        info = FlowInfo(flow)
        self.info[key] = info
        if flow.kind == "auto_cdc":
            assert flow.auto_cdc is not None
            src = self.lookup(flow.auto_cdc.source)
            if src is not None:
                info.reads[src.name] = {STREAM}
            info.result = STREAM
            return info
        r = Resolver(self, analysis=True)
        try:
            out = r.call(flow)
            info.result = result_kind(out)
            if info.result is None:
                info.error = (
                    f"{flow.location}: the query function of {flow.name!r} returned {type(out).__name__}; it must return "
                    "a stream (hr.read_stream...), a batch (dp.read..., a StaticFrame) or a pyarrow.Table"
                )
        except NeedsData:
            info.result = STATIC
        except (UnknownDataset, OptionsError, HeadraceError) as e:
            info.error = f"{flow.location}: {flow.name!r}: {e}"
        except Exception as e:
            info.error = f"{flow.location}: the query function of {flow.name!r} raised {type(e).__name__}: {e}"
        info.reads = r.reads
        return info

    def analyze(self) -> DataflowGraph:
        """Call every definition once (no data read); raise GraphError listing every problem."""
        problems = list(self.registry.problems)
        for flow in list(self.registry.flows.values()):
            info = self._analyze_flow(flow)
            if info.error:
                problems.append(info.error)
        for ds in self.datasets:
            self.kind_of(ds)
        problems += self._check_flows()
        problems += [x for f in self.flows for x in check_trigger_conf(self, f)]
        problems += self._check_datasets()
        problems += self._check_names()
        try:
            continuous_check_interval(self.configuration)
        except PipelineDefinitionError as e:
            problems.append(str(e))
        cycles = self.find_cycles()
        for cycle in cycles[:_MAX_CYCLES_SHOWN]:
            problems.append(f"the datasets read each other in a cycle: {' -> '.join(cycle)}; a dataset cannot depend on itself")
        if len(cycles) > _MAX_CYCLES_SHOWN:
            problems.append(f"... and {len(cycles) - _MAX_CYCLES_SHOWN} more cycles among the datasets above")
        if problems:
            raise GraphError(problems)
        return self

    def _check_flows(self) -> list[str]:
        out: list[str] = []
        for flow in self.flows:
            target = self.lookup(flow.target)
            where = f"{flow.location}: flow {flow.name!r}"
            if target is None:
                out.append(f"{where} writes to {flow.target!r}, which is not a dataset of the pipeline; "
                           "create it with dp.create_streaming_table(...) or dp.create_sink(...)")  # fmt: skip
                continue
            kind = self.kind_of(target)
            info = self.info[flow.name.lower()]
            if flow.kind == "auto_cdc":
                assert flow.auto_cdc is not None
                if kind != STREAMING_TABLE:
                    out.append(f"{where}: create_auto_cdc_flow needs a streaming table target (dp.create_streaming_table), not a {kind}")
                src = self.lookup(flow.auto_cdc.source)
                if src is None:
                    out.append(f"{where}: create_auto_cdc_flow source {flow.auto_cdc.source!r} is not a dataset of the pipeline")
                elif self.kind_of(src) == MATERIALIZED_VIEW:
                    out.append(f"{where}: create_auto_cdc_flow source {src.name!r} is a materialized view; it must be a stream")
                out += self._check_cdc_options(flow, where)
                continue
            if flow.kind == "update" and kind != SINK:
                out.append(f"{where}: @dp.update_flow writes to a sink (dp.create_sink); {target.name!r} is a {kind}")
            if flow.kind in ("append", "update") and flow.name.lower() != target.name.lower() and kind not in (STREAMING_TABLE, SINK):
                out.append(f"{where}: append flows write to streaming tables and sinks; {target.name!r} is a {kind}")
            if info.result == STATIC and kind in (STREAMING_TABLE, SINK):
                out.append(f"{where} returns a batch result but {target.name!r} is a {kind}, fed by streams; "
                           "return hr.read_stream... (or make it a @dp.materialized_view)")  # fmt: skip
            if info.result == STREAM and kind == MATERIALIZED_VIEW:
                out.append(f"{where} returns a stream but {target.name!r} is a materialized view; use @dp.table")
            for e in flow.all_expectations(target):
                if isinstance(e.condition, str):
                    try:
                        e.duckdb_sql()
                    except PipelineDefinitionError as err:
                        out.append(f"{where}: {err}")
        return out

    def _check_names(self) -> list[str]:
        """Every dataset and flow name names a folder of the storage (``name_problem``)."""
        out = []
        for ds in self.datasets:
            problem = name_problem(ds.name)
            if problem:
                out.append(f"{ds.location}: dataset name {problem}; its table and checkpoints are folders named after "
                           "it: use letters, digits, _ and . (name=...)")  # fmt: skip
        for flow in self.registry.flows.values():
            problem = name_problem(flow.name)
            if problem and self.registry.datasets.get(flow.name.lower()) is None:  # not reported twice
                out.append(f"{flow.location}: flow name {problem}; its checkpoint is a folder named after it: use "
                           "letters, digits, _ and . (name=...)")  # fmt: skip
        return out

    def _check_datasets(self) -> list[str]:
        out: list[str] = []
        for ds in self.datasets:
            kind = self.kind_of(ds)
            if kind in (STREAMING_TABLE, SINK) and not self.flows_into(ds.name):
                what = "streaming table" if kind == STREAMING_TABLE else "sink"
                out.append(f"{ds.location}: {what} {ds.name!r} has no flow writing to it; add @dp.append_flow(target={ds.name!r})")
            if kind == SINK:
                out += self._check_sink(ds)
        return out

    def _check_cdc_options(self, flow: Flow, where: str) -> list[str]:
        """The delta sink must accept the CDC options (``keys``, ``sequenceBy``, ...)."""
        from headrace.plugins import registry

        assert flow.auto_cdc is not None
        raw = {"path": self.storage.table_path(flow.target), **flow.auto_cdc.sink_options()}
        try:
            registry().get("delta").sink_options.parse(raw, connector="delta", role="sink")
        except OptionsError as e:
            return [f"{where}: create_auto_cdc_flow writes with the delta sink's CDC options {sorted(raw)[:-1]}, "
                    f"which the installed headrace-delta does not accept ({e}); upgrade headrace-delta"]  # fmt: skip
        except HeadraceError as e:
            return [f"{where}: create_auto_cdc_flow needs the delta connector: {e}"]
        return []

    def _check_sink(self, ds: Dataset) -> list[str]:
        from headrace.api import ENGINE_WRITER_OPTIONS
        from headrace.plugins import registry

        try:
            spec = registry().get(str(ds.format))
        except HeadraceError as e:
            return [f"{ds.location}: sink {ds.name!r}: {e}"]
        if spec.sink is None:
            return [f"{ds.location}: sink {ds.name!r}: connector {spec.name!r} cannot be written to"]
        from headrace.api.writer import parse_engine_options

        out = [f"{ds.location}: sink {ds.name!r}: option {p}" for p in parse_engine_options(dict(ds.options))[1]]
        engine = {o.lower() for o in ENGINE_WRITER_OPTIONS}
        raw = {k: v for k, v in ds.options.items() if k.lower() not in engine}
        if spec.name == "memory":
            raw["queryName"] = ds.name  # the engine names the table after the flow's query
        try:
            spec.sink_options.parse(raw, connector=spec.name, role="sink")
        except OptionsError as e:
            out.append(f"{ds.location}: sink {ds.name!r}: {e}")
        return out

    # ------------------------------------------------------------------ edges and order
    def upstream(self, flow: Flow) -> set[str]:
        """Names of the persisted datasets (and views) the flow reads."""
        info = self.info.get(flow.name.lower())
        return set(info.reads) if info else set()

    def dataset_edges(self) -> dict[str, set[str]]:
        """target name -> names it reads (through its flows; views included)."""
        edges: dict[str, set[str]] = {ds.name: set() for ds in self.datasets}
        for info in self.info.values():
            target = self.lookup(info.flow.target)
            if target is not None:
                edges.setdefault(target.name, set()).update(info.reads)
        return edges

    def find_cycle(self) -> list[str] | None:
        """One cycle among the datasets (``a -> b -> a``), or None."""
        cycles = self.find_cycles(limit=1)
        return cycles[0] if cycles else None

    def find_cycles(self, limit: int = 1000) -> list[list[str]]:
        """Every elementary cycle among the datasets (up to ``limit``), each as the path
        ``a -> ... -> a`` in the direction data flows, in a stable order. Each cycle is found
        once, from its smallest dataset, by a depth-first search of simple paths (pipelines
        have tens of datasets; the search stops after ``_MAX_CYCLE_STEPS`` steps)."""
        edges = {n: set(m) for n, m in self.dataset_edges().items()}
        for targets in list(edges.values()):
            for m in targets:
                edges.setdefault(m, set())
        found: list[list[str]] = []
        steps = 0
        for start in sorted(edges):
            allowed = {n for n in edges if n >= start}
            path = [start]
            # an explicit stack (no recursion: a long chain of datasets must not overflow it)
            stack = [iter(sorted(m for m in edges[start] if m in allowed))]
            on_path = {start}
            while stack:
                steps += 1
                if steps > _MAX_CYCLE_STEPS:
                    return found
                nxt = next(stack[-1], None)
                if nxt is None:
                    stack.pop()
                    on_path.discard(path.pop())
                    continue
                if nxt == start:
                    found.append([*path, start][::-1])
                    if len(found) >= limit:
                        return found
                elif nxt not in on_path:
                    path.append(nxt)
                    on_path.add(nxt)
                    stack.append(iter(sorted(m for m in edges[nxt] if m in allowed)))
        return found

    def order(self) -> list[Flow]:
        """Flows in dependency order (a flow after every flow writing what it reads), keeping
        definition order among independent flows."""
        flows = self.flows
        writers: dict[str, list[Flow]] = {}
        for f in flows:
            t = self.lookup(f.target)
            if t is not None:
                writers.setdefault(t.name, []).append(f)
        deps: dict[str, set[str]] = {}
        for f in flows:
            d: set[str] = set()
            for name in self._persisted_reads(f):
                d.update(w.name for w in writers.get(name, []) if w.name != f.name)
            deps[f.name] = d
        done: list[Flow] = []
        seen: set[str] = set()
        while len(done) < len(flows):
            ready = [f for f in flows if f.name not in seen and deps[f.name] <= seen]
            if not ready:
                raise GraphError([f"cycle among flows {sorted(set(deps) - seen)}"])
            for f in ready[:1]:
                done.append(f)
                seen.add(f.name)
        return done

    def _persisted_reads(self, flow: Flow) -> set[str]:
        out = set()
        for name in self.upstream(flow):
            ds = self.lookup(name)
            if ds is not None and self.kind_of(ds) in (STREAMING_TABLE, MATERIALIZED_VIEW):
                out.add(ds.name)
        return out

    def stream_reads(self, flow: Flow) -> set[str]:
        """Persisted datasets the flow reads as a stream."""
        info = self.info.get(flow.name.lower())
        if info is None:
            return set()
        return {n for n, how in info.reads.items() if STREAM in how and n in self._persisted_reads(flow)}

    def static_reads(self, flow: Flow) -> set[str]:
        info = self.info.get(flow.name.lower())
        if info is None:
            return set()
        return {n for n, how in info.reads.items() if STATIC in how and n in self._persisted_reads(flow)}

    def downstream_flows(self, flow: Flow) -> list[Flow]:
        """Every flow that reads, directly or not, what ``flow`` writes."""
        target = self.lookup(flow.target)
        if target is None:
            return []
        hit = {target.name}
        out: list[Flow] = []
        for f in self.order():
            if f.name != flow.name and self._persisted_reads(f) & hit:
                out.append(f)
                t = self.lookup(f.target)
                if t is not None:
                    hit.add(t.name)
        return out

    def describe(self) -> Mapping[str, Any]:
        return {ds.name: self.kind_of(ds) for ds in self.datasets}


_MAX_CYCLES_SHOWN = 20
_MAX_CYCLE_STEPS = 1_000_000
_DEFAULT_CHECK_INTERVAL = "0.5 seconds"
_MIN_CHECK_INTERVAL = 0.01  # a continuous run must not check its flows without a pause


def continuous_check_interval(configuration: Mapping[str, str]) -> float:
    """Seconds between a continuous run's checks of its flows (``pipelines.continuous.checkInterval``
    in the spec's configuration, default 0.5 s, at least 10 ms). The dry run's analysis and the
    run both call it, so both refuse the same values; raises PipelineDefinitionError naming the key."""
    lower = {k.lower(): v for k, v in configuration.items()}
    raw = lower.get("pipelines.continuous.checkinterval", _DEFAULT_CHECK_INTERVAL)
    try:
        return float(Duration(min=_MIN_CHECK_INTERVAL).parse(raw))
    except ValueError as e:
        raise PipelineDefinitionError(f"configuration pipelines.continuous.checkInterval: {e}; give a duration such as "
                           f"'{_DEFAULT_CHECK_INTERVAL}' (at least 10 milliseconds), or leave it out") from None  # fmt: skip


def check_trigger_conf(graph: DataflowGraph, flow: Flow) -> list[str]:
    """Problems with ``pipelines.trigger`` / ``pipelines.trigger.interval`` (for the dry run)."""
    conf = {**graph.configuration, **flow.spark_conf}
    lower = {k.lower(): v for k, v in conf.items()}
    out = []
    if "pipelines.trigger.interval" in lower:
        try:
            Duration().parse(lower["pipelines.trigger.interval"])
        except ValueError as e:
            out.append(f"{flow.location}: flow {flow.name!r}: pipelines.trigger.interval: {e}")
    trig = lower.get("pipelines.trigger")
    if trig is not None and str(trig).lower() not in ("realtime", "real_time", "processingtime", "default"):
        out.append(f"{flow.location}: flow {flow.name!r}: pipelines.trigger={trig!r}; use 'RealTime' (or leave it out)")
    return out
