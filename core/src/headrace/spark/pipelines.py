"""A headrace pipeline run by Spark Declarative Pipelines (``spark-pipelines``, PySpark 4.1+).

``headrace pipelines run --engine spark`` (:func:`run_on_spark`) loads the pipeline, refuses
by name what Spark's pipelines cannot take (:func:`refusals`), writes a Spark pipeline project
next to the pipeline's storage (:func:`write_project`) and runs ``spark-pipelines run`` on it,
which starts a local Spark Connect server::

    <storage>/spark/project/spark-pipeline.yml      name, storage (file://.../spark/storage), configuration
    <storage>/spark/project/transformations/headrace_graph.py     define(spark, "<pipeline.yml>", ...)
    <storage>/spark/project/sql/<the pipeline's .sql files, as written, at their relative paths>
    <storage>/spark/project/spark-warehouse/<dataset>   the tables Spark writes (its default warehouse)

The generated Python definition file calls :func:`define` inside ``spark-pipelines``: it loads
the headrace definitions again and registers every dataset and flow defined in Python with
``pyspark.pipelines``, each query function translated to a Spark DataFrame by the Spark engine
(:mod:`headrace.spark.engine`): reads of the pipeline's datasets become
``spark.readStream.table(name)`` / ``spark.read.table(name)``, sources and steps translate as
in ``start(..., engine=spark)``. SQL files are Spark SQL already and go to Spark unchanged.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from headrace.errors import HeadraceError, UnsupportedError

if TYPE_CHECKING:
    from headrace.pipelines.elements import Dataset, Flow
    from headrace.pipelines.spec import LoadedPipeline

__all__ = ["SparkProject", "SparkRunResult", "define", "refusals", "run_on_spark", "write_project"]

log = logging.getLogger(__name__)

DEFINITION_FILE = "headrace_graph.py"
#: the Spark session settings a run needs unless the pipeline's configuration sets them
_DEFAULT_CONF = {"spark.sql.session.timeZone": "UTC"}  # headrace's windows and timestamps are UTC
#: steps whose Spark form asks Spark for the input's schema, which Spark Declarative Pipelines
#: forbid in a query function (ATTEMPT_ANALYSIS_IN_PIPELINE_QUERY_FUNCTION)
_ANALYSING_STEPS = {
    "FilterFunctionOperator": "filter(fn) runs as mapInArrow with the input's schema",
    "TransformWithStateOperator": "transform_with_state runs as transformWithStateInPandas with the input's schema",
}
_SQL_REFUSED = (
    (re.compile(r"\bread_(files|kafka|pubsub|kinesis)\s*\(", re.I),
     "{0}(...) is Databricks' (Spark has no such table function); define this dataset in Python, where the "
     "source translates to Spark (hr.read_stream.format(...))"),
    (re.compile(r"\bsecret\s*\(", re.I),
     "secret(...) is headrace's (an environment variable) and Databricks'; Spark SQL has no secret()"),
    (re.compile(r"\bCONSTRAINT\s+\S+\s+EXPECT\b", re.I),
     "expectations (CONSTRAINT ... EXPECT) do not exist in Spark Declarative Pipelines"),
    (re.compile(r"\bLIVE\s*\.|\bLIVE\s+(TABLE|VIEW)\b", re.I),
     "LIVE is Databricks' legacy syntax; name the dataset without it"),
)  # fmt: skip


def _spark_dir(p: LoadedPipeline) -> str:
    return os.path.join(p.storage.local_root, "spark")


@dataclass(frozen=True)
class SparkProject:
    """The Spark pipeline project written for a headrace pipeline: its folder, spec file, the
    folder of the tables Spark writes (one per dataset), and the adapter's state folder."""

    root: str
    spec_path: str
    warehouse: str
    state: str

    def table_path(self, name: str) -> str:
        """Where Spark writes dataset ``name`` (``spark_catalog.default.<name>``)."""
        return os.path.join(self.warehouse, name.lower())


@dataclass
class SparkRunResult:
    """How ``spark-pipelines run`` ended: ``completed`` (Spark printed ``Run is COMPLETED``),
    the flows it reported ``FAILED``, its exit status and the last lines of its output."""

    completed: bool
    failed_flows: list[str] = field(default_factory=list)
    returncode: int = 0
    tail: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.completed and not self.failed_flows


def _from_sql(ds_or_flow: Any) -> bool:
    return str(ds_or_flow.location.filename or "").endswith(".sql")


def _sql_files(p: LoadedPipeline) -> list[str]:
    from headrace.pipelines.spec import library_files

    return [f for f in library_files(p.spec) if f.endswith(".sql")]


def refusals(p: LoadedPipeline) -> list[str]:
    """Everything in the pipeline Spark Declarative Pipelines cannot run, one sentence each
    naming the dataset, flow, step or statement (empty when it all maps). Calls every Python
    definition once with the dry run's resolver (no data read); no Spark call."""
    from headrace.pipelines.elements import MATERIALIZED_VIEW, SINK, STREAMING_TABLE
    from headrace.pipelines.resolver import Resolver
    from headrace.pipelines.spec import in_dir
    from headrace.spark.engine import refusal

    graph = p.graph
    out: list[str] = []
    if p.spec.catalog:
        out.append(f"catalog {p.spec.catalog!r}: a local Spark session has one catalog, spark_catalog; "
                   "leave catalog out of the spec")  # fmt: skip
    for ds in graph.datasets:
        if graph.kind_of(ds) == SINK:
            out.append(
                f"sink {ds.name!r}: dp.create_sink is not mapped to Spark's sinks; write it from a headrace run"
            )
    for flow in graph.flows:
        target = graph.lookup(flow.target)
        where = f"flow {flow.name!r}"
        if flow.kind == "auto_cdc":
            out.append(f"{where}: dp.create_auto_cdc_flow is not mapped to Spark's create_auto_cdc_flow yet")
            continue
        if flow.kind == "update":
            out.append(f"{where}: dp.update_flow is headrace's; Spark's pipelines have append flows only")
            continue
        if flow.once:
            out.append(
                f"{where}: append_flow(once=True) is Databricks'; Spark's pipelines have no once flows"
            )
        if flow.all_expectations(target):
            names = ", ".join(repr(e.name) for e in flow.all_expectations(target))
            out.append(f"{where}: expectations ({names}) do not exist in Spark Declarative Pipelines "
                       "(PySpark 4.3 has no dp.expect*); remove them or run on headrace")  # fmt: skip
        if _from_sql(flow) or flow.func is None:
            continue
        try:
            with in_dir(p.spec.base_dir):
                result = Resolver(graph, analysis=True).call(flow)
        except HeadraceError as e:
            out.append(f"{where}: {e}")
            continue
        kind = graph.kind_of(target) if target is not None else None
        for step_where, op in _steps(result):
            why = refusal(op)
            if why is None and type(op).__name__ in _ANALYSING_STEPS:
                why = (f"{_ANALYSING_STEPS[type(op).__name__]}, which Spark Declarative Pipelines cannot ask for "
                       "while a query function builds its plan (ATTEMPT_ANALYSIS_IN_PIPELINE_QUERY_FUNCTION); "
                       "run this flow on headrace")  # fmt: skip
            if why is not None:
                out.append(f"{where}: step {op.name}{step_where} cannot run on Spark: {why}")
        if kind not in (STREAMING_TABLE, MATERIALIZED_VIEW) and flow.kind != "view":
            out.append(
                f"{where}: its target {flow.target!r} is a {kind}, which Spark's pipelines do not write"
            )
    for path in _sql_files(p):
        rel = os.path.relpath(path, p.spec.base_dir)
        from headrace.pipelines.sql import _split_statements

        with open(path, encoding="utf-8") as f:
            statements = _split_statements(f.read())
        for line, text in statements:
            for pattern, why in _SQL_REFUSED:
                m = pattern.search(text)
                if m:
                    out.append(f"{rel}:{line}: {why.format(m.group(0).split('(')[0].strip())}")
    return out


def _steps(result: Any) -> list[tuple[str, Any]]:
    """Every operator of a query's result (a stream's or a static frame's steps and the steps
    of the static sides it joins), with where it sits."""
    out: list[tuple[str, Any]] = []
    for op in getattr(result, "_steps", ()):
        out.append(("", op))
        for sop in getattr(getattr(op, "static", None), "_steps", ()):
            out.append((f" (in the static side of {op.name})", sop))
    return out


def project_of(p: LoadedPipeline) -> SparkProject:
    """Where the Spark project of pipeline ``p`` lives (``<local storage>/spark``)."""
    base = _spark_dir(p)
    root = os.path.join(base, "project")
    # the warehouse is Spark's default (spark-warehouse in the working folder): spark-pipelines
    # sets the spec's configuration on a running Spark Connect session, where
    # spark.sql.warehouse.dir, a static setting, cannot change
    return SparkProject(root, os.path.join(root, "spark-pipeline.yml"), os.path.join(root, "spark-warehouse"),
                        os.path.join(base, "headrace"))  # fmt: skip


def spark_configuration(p: LoadedPipeline) -> dict[str, str]:
    """The Spark session settings of the run: the pipeline's configuration (also what SQL
    files read as ``${key}``), with UTC as the session time zone unless it sets one."""
    return {**_DEFAULT_CONF, **p.spec.configuration}


def write_project(p: LoadedPipeline) -> SparkProject:
    """Write (again) the Spark pipeline project of ``p``, refusing first everything
    :func:`refusals` names (:class:`UnsupportedError` listing them). Called once per
    ``headrace pipelines run --engine spark``; the project is regenerated on every run."""
    import yaml

    from headrace.pipelines.graph import GraphError
    from headrace.pipelines.spec import in_dir

    with in_dir(p.spec.base_dir):
        try:
            p.graph.analyze()
        except GraphError as e:
            raise UnsupportedError(str(e)) from None
    problems = refusals(p)
    if problems:
        raise UnsupportedError(f"pipeline {p.spec.name!r} cannot run on Spark Declarative Pipelines:\n"
                               + "\n".join(f"  - {x}" for x in problems))  # fmt: skip
    project = project_of(p)
    transformations = os.path.join(project.root, "transformations")
    for folder in (transformations, os.path.join(project.root, "sql")):
        if os.path.isdir(folder):
            shutil.rmtree(folder)
    os.makedirs(transformations)
    # the SQL files as written, each its own library (a spec's glob is a folder/** or a file)
    sql_files = [os.path.relpath(f, p.spec.base_dir).replace(os.sep, "/") for f in _sql_files(p)]
    os.makedirs(project.warehouse, exist_ok=True)
    doc: dict[str, Any] = {
        "name": p.spec.name,
        "storage": "file://" + os.path.abspath(os.path.join(_spark_dir(p), "storage")),
        "configuration": spark_configuration(p),
        "libraries": [{"glob": {"include": "transformations/**"}}]
        + [{"glob": {"include": f"sql/{rel}"}} for rel in sql_files],
    }
    if p.spec.database:
        doc["database"] = p.spec.database
    with open(project.spec_path, "w", encoding="utf-8") as f:
        f.write(
            f"# written by `headrace pipelines run --engine spark` from {p.spec.path}; rewritten on every run\n"
        )
        yaml.safe_dump(doc, f, sort_keys=False)
    with open(os.path.join(transformations, DEFINITION_FILE), "w", encoding="utf-8") as f:
        f.write(f'"""The Python datasets and flows of {p.spec.path}, registered with pyspark.pipelines '
                f'(written by `headrace pipelines run --engine spark`)."""\n\n'
                "from headrace.spark.pipelines import define\n\n"
                f"define(spark, {os.path.abspath(p.spec.path)!r}, {project.state!r})  # noqa: F821 (spark-pipelines' session)\n")  # fmt: skip
    for rel in sql_files:
        dest = os.path.join(project.root, "sql", rel)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        shutil.copyfile(os.path.join(p.spec.base_dir, rel), dest)
    return project


def _spark_resolver(graph: Any) -> Any:
    """The pipeline's resolver with ``dp.read.table(name)`` as a read of the dataset's table
    (translated to ``spark.read.table(name)``) instead of a snapshot headrace reads."""
    from headrace.pipelines.resolver import Resolver

    class SparkResolver(Resolver):
        def static_table(self, name: str) -> Any:
            return self.static_frame(name)

    return SparkResolver(graph, analysis=False)


def define(spark: Any, spec_path: str, state_root: str) -> None:
    """Register the Python datasets and flows of the headrace pipeline at ``spec_path`` with
    ``pyspark.pipelines``. Called once by the generated definition file, inside
    ``spark-pipelines`` (its registration context, ``block_session_mutations``), with the
    session it injects; each query function is called there, once, to build its plan.
    ``state_root`` holds what the adapter's sources keep under Spark (cloudFiles schema
    locations, ``headraceStatePath``)."""
    from pyspark import pipelines as sdp

    from headrace.pipelines.elements import MATERIALIZED_VIEW, STREAMING_TABLE, TEMPORARY_VIEW
    from headrace.pipelines.spec import in_dir, load_pipeline
    from headrace.spark.engine import SparkEngine

    p = load_pipeline(spec_path)
    graph = p.graph
    with in_dir(p.spec.base_dir):
        graph.analyze()
    problems = refusals(p)
    if problems:
        raise UnsupportedError(f"pipeline {p.spec.name!r} cannot run on Spark Declarative Pipelines:\n"
                               + "\n".join(f"  - {x}" for x in problems))  # fmt: skip
    tables = {graph.storage.table_path(ds.name): ds.name for ds in graph.datasets if ds.persisted}
    engine = SparkEngine(spark, tables=tables, sql_watermarks=True)
    # the adapter's data sources, registered before any query function runs (a registration
    # is an analysis Spark forbids inside one)
    import headrace.spark

    for connector in sorted(_connectors(p, engine)):
        headrace.spark.register(spark, connector)

    def query(flow: Flow) -> Callable[[], Any]:
        def fn() -> Any:
            with in_dir(p.spec.base_dir):
                out = _spark_resolver(graph).call(flow)
                return _to_spark(out, engine, flow, state_root)

        fn.__name__ = flow.name
        return fn

    for ds in graph.datasets:
        if _from_sql(ds):
            continue  # the SQL file, copied into the project, defines it
        kind = graph.kind_of(ds)
        flow = graph.flow_of(ds.name)
        common = _table_args(ds)
        if kind == STREAMING_TABLE:
            sdp.create_streaming_table(ds.name, **common)
        elif kind == MATERIALIZED_VIEW:
            assert flow is not None
            sdp.materialized_view(name=ds.name, spark_conf=dict(flow.spark_conf), **common)(query(flow))
        elif kind == TEMPORARY_VIEW:
            assert flow is not None
            sdp.temporary_view(name=ds.name, comment=ds.comment, spark_conf=dict(flow.spark_conf))(
                query(flow)
            )
    for flow in graph.flows:
        target = graph.lookup(flow.target)
        if _from_sql(flow) or target is None or graph.kind_of(target) != STREAMING_TABLE:
            continue
        sdp.append_flow(target=target.name, name=flow.name, spark_conf=dict(flow.spark_conf))(query(flow))


def _connectors(p: LoadedPipeline, engine: Any) -> set[str]:
    """The connectors the Python flows' streams read through the adapter (``headrace.<name>``):
    every source that is not one of the pipeline's tables. Calls each definition with the dry
    run's resolver (no data read)."""
    from headrace.api import StreamFrame
    from headrace.pipelines.resolver import Resolver
    from headrace.pipelines.spec import in_dir

    out: set[str] = set()
    for flow in [*p.graph.flows, *(f for f in p.graph.registry.flows.values() if f.kind == "view")]:
        if flow.func is None or _from_sql(flow):
            continue
        with in_dir(p.spec.base_dir):
            result = Resolver(p.graph, analysis=True).call(flow)
        if isinstance(result, StreamFrame):
            out.update(plan.connector for plan in result._sources if engine.table_of(plan) is None)
    return out


def _table_args(ds: Dataset) -> dict[str, Any]:
    return {
        "comment": ds.comment,
        "table_properties": {str(k): str(v) for k, v in ds.table_properties.items()} or None,
        "partition_cols": list(ds.partition_cols) if ds.partition_cols else None,
        "cluster_by": list(ds.cluster_by) if ds.cluster_by else None,
    }


def _to_spark(out: Any, engine: Any, flow: Flow, state_root: str) -> Any:
    """A headrace query function's result as a Spark DataFrame (a stream, a static frame or a
    ``pyarrow.Table``)."""
    import pyarrow as pa

    from headrace.api import StreamFrame
    from headrace.api.static import StaticFrame
    from headrace.spark.engine import check_plan, static_to_spark, to_spark

    if isinstance(out, pa.Table):
        return engine.session.createDataFrame(out)
    if isinstance(out, StaticFrame):
        return static_to_spark(out, engine)
    if not isinstance(out, StreamFrame):
        raise HeadraceError(
            f"flow {flow.name!r}: the query returned {type(out).__name__}, not a stream or a table"
        )
    check_plan(out)
    frame = _with_schema_locations(out, flow, state_root)
    return to_spark(frame, engine, os.path.join(state_root, _safe(flow.name)))


def _safe(name: str) -> str:
    from headrace.pipelines.storage import _safe as safe

    return str(safe(name))


def _with_schema_locations(frame: Any, flow: Flow, state_root: str) -> Any:
    """The stream's sources as Spark's workers need them: a relative path made absolute
    (against the pipeline's folder, the working folder here; a worker's is another), and a
    cloudFiles source given no schemaLocation one under the Spark run's state (as the
    headrace run gives it one under the pipeline's storage)."""
    plans = []
    for i, plan in enumerate(frame._sources):
        raw = dict(plan.raw_options)
        path = raw.get("path")
        if isinstance(path, str) and "://" not in path and not os.path.isabs(path):
            raw["path"] = os.path.abspath(path)
        if plan.connector.lower() == "cloudfiles" and not any(
            k.lower() == "cloudfiles.schemalocation" for k in raw
        ):
            raw["cloudFiles.schemaLocation"] = os.path.join(state_root, _safe(flow.name), "schemas", str(i))
        plans.append(replace(plan, raw_options=raw))
    return replace(frame, _sources=tuple(plans))


def spark_pipelines_command() -> str:
    """The ``spark-pipelines`` script (next to this Python, or on PATH)."""
    here = os.path.join(os.path.dirname(sys.executable), "spark-pipelines")
    found = here if os.path.exists(here) else shutil.which("spark-pipelines")
    if not found:
        raise HeadraceError("spark-pipelines not found (next to this Python or on PATH); install PySpark 4.1+ "
                            "with the Spark Connect client: pip install 'headrace[spark]'")  # fmt: skip
    return found


def _stop_group(proc: subprocess.Popen[str]) -> None:
    """Stop the process group ``run_on_spark`` started (SIGTERM, then SIGKILL after 30 s)."""
    import signal

    for sig, wait in ((signal.SIGTERM, 30.0), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


_FLOW_FAILED = re.compile(r"Flow '?([^\s']+)'? has FAILED")
_COMPLETED = "Run is COMPLETED"
#: PySpark 4.3's client raises this after the run's last event when a Python data source ran:
#: the Python accumulators' observed metrics arrive as a response execute_command_as_iterator
#: does not know (pyspark/sql/connect/client/core.py); the run itself has completed
_ACCUMULATOR_RESPONSE = ("UNKNOWN_RESPONSE", "__python_accumulator__")


def run_on_spark(
    p: LoadedPipeline,
    *,
    full_refresh: Sequence[str] = (),
    full_refresh_all: bool = False,
    refresh: Sequence[str] = (),
    dry: bool = False,
    out: Callable[[str], None] = print,
) -> SparkRunResult:
    """Write the Spark project of ``p`` and run ``spark-pipelines run`` (``dry-run`` with
    ``dry``) on it, passing each output line to ``out``; the refresh selections as Spark's.
    Called once per ``headrace pipelines run --engine spark`` on the calling thread; blocks
    until the Spark run ends. Raises :class:`UnsupportedError` naming what cannot map."""
    project = write_project(p)
    cmd = [spark_pipelines_command(), "dry-run" if dry else "run", "--spec", project.spec_path]
    if not dry:
        if full_refresh_all:
            cmd.append("--full-refresh-all")
        if full_refresh:
            cmd += ["--full-refresh", ",".join(full_refresh)]
        if refresh:
            cmd += ["--refresh", ",".join(refresh)]
    env = dict(os.environ)
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    env.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    import headrace

    root = os.path.dirname(os.path.dirname(os.path.abspath(headrace.__file__)))
    env["PYTHONPATH"] = os.pathsep.join(
        dict.fromkeys([root, *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))])
    )
    log.info("running %s", " ".join(cmd))
    result = SparkRunResult(completed=False)
    # its own process group: the launcher starts a JVM, which starts the Python client, which
    # starts the Spark Connect server; an interrupted run stops all of them
    proc = subprocess.Popen(cmd, cwd=project.root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, errors="replace", start_new_session=True)  # fmt: skip
    assert proc.stdout is not None
    tail: list[str] = []
    try:
        for line in proc.stdout:
            line = line.rstrip("\n")
            out(line)
            tail = [*tail[-39:], line]
            m = _FLOW_FAILED.search(line)
            if m and m.group(1).rsplit(".", 1)[-1] not in result.failed_flows:
                result.failed_flows.append(m.group(1).rsplit(".", 1)[-1])
            if _COMPLETED in line:
                result.completed = True
        result.returncode = proc.wait()
    finally:
        if proc.poll() is None:
            _stop_group(proc)
    result.tail = tail
    if result.returncode != 0 and result.completed:
        text = "\n".join(tail)
        if not all(s in text for s in _ACCUMULATOR_RESPONSE):
            result.completed = False
    if dry and result.returncode == 0:
        result.completed = True
    return result
