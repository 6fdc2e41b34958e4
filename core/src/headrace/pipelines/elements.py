"""The elements of a pipeline's dataflow graph, as the definitions register them.

Mirrors ``pyspark.pipelines.output`` / ``flow``: outputs (streaming tables, materialized
views, temporary views, sinks) and the flows that write them. A ``GraphRegistry`` collects
them while a pipeline's source files are loaded (``headrace.pipelines.spec.load_definitions``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from headrace.errors import HeadraceError

__all__ = [
    "AutoCdc",
    "Dataset",
    "Flow",
    "GraphRegistry",
    "PipelineDefinitionError",
    "SourceLocation",
    "name_problem",
]

STREAMING_TABLE = "streaming_table"
MATERIALIZED_VIEW = "materialized_view"
TEMPORARY_VIEW = "temporary_view"
SINK = "sink"
TABLE = "table"  # @dp.table before its query told stream (streaming table) from batch (materialized view)

KINDS = (STREAMING_TABLE, MATERIALIZED_VIEW, TEMPORARY_VIEW, SINK, TABLE)

_MAX_NAME_BYTES = 255  # a folder name on every common file system


def name_problem(name: str) -> str | None:
    """Why a dataset or flow name cannot be used, or None. Tables, checkpoints and schema
    locations are folders named after datasets and flows, so a name is one folder name: not
    empty, not ``.`` or ``..``, no ``/`` or ``\\``, no control character (a newline, NUL, ...;
    object stores refuse them too), at most 255 bytes. The graph's analysis (dry run and run)
    and the storage layout both apply it."""
    shown = repr(name) if len(name) <= 60 else repr(name[:50]) + f"... ({len(name)} characters)"
    if not name or name in (".", ".."):
        return f"{shown} is not a name"
    bad = sorted({c for c in name if c in "/\\" or ord(c) < 32 or ord(c) == 127})
    if bad:
        return f"{shown} contains {', '.join(repr(c) for c in bad)}"
    if len(name.encode("utf-8", "surrogatepass")) > _MAX_NAME_BYTES:
        return f"{shown} is longer than {_MAX_NAME_BYTES} bytes"
    return None


class PipelineDefinitionError(HeadraceError):
    """A definition that cannot be part of the graph (duplicate name, bad argument, ...)."""


@dataclass(frozen=True)
class SourceLocation:
    """Where a definition was made: file and line (for errors and the graph)."""

    filename: str | None = None
    line: int | None = None

    def __str__(self) -> str:
        return f"{self.filename}:{self.line}" if self.filename else "<unknown>"

    @classmethod
    def of_caller(cls, depth: int = 2) -> SourceLocation:
        frame = inspect.currentframe()
        try:
            for _ in range(depth):
                if frame is None:
                    break
                frame = frame.f_back
            if frame is None:
                return cls()
            return cls(frame.f_code.co_filename, frame.f_lineno)
        finally:
            del frame


@dataclass
class Dataset:
    """A streaming table, materialized view, temporary view or sink of the pipeline."""

    name: str
    kind: str
    comment: str | None = None
    table_properties: Mapping[str, str] = field(default_factory=dict)
    partition_cols: Sequence[str] | None = None
    cluster_by: Sequence[str] | None = None
    schema: Any = None
    format: str | None = None
    options: Mapping[str, Any] = field(default_factory=dict)  # sinks: the sink's options
    location: SourceLocation = field(default_factory=SourceLocation)
    expectations: Sequence[Any] = ()  # create_streaming_table(expect_all=...): on every flow into it

    @property
    def persisted(self) -> bool:
        """A Delta table in the pipeline's storage (streaming tables and materialized views)."""
        return self.kind in (STREAMING_TABLE, MATERIALIZED_VIEW, TABLE)


@dataclass(frozen=True)
class AutoCdc:
    """What ``create_auto_cdc_flow`` asked for, as the delta sink's CDC options."""

    source: str
    keys: tuple[str, ...]
    sequence_by: str
    apply_as_deletes: str | None = None
    column_list: tuple[str, ...] | None = None
    except_column_list: tuple[str, ...] | None = None
    stored_as_scd_type: int | None = None
    track_history_column_list: tuple[str, ...] | None = None
    track_history_except_column_list: tuple[str, ...] | None = None

    def sink_options(self) -> dict[str, str]:
        """The delta/lakebase sink options this flow writes with (the ``cdc`` options)."""
        out = {"keys": ",".join(self.keys), "sequenceBy": self.sequence_by}
        if self.apply_as_deletes:
            out["applyAsDeletes"] = self.apply_as_deletes
        if self.column_list:
            out["columnList"] = ",".join(self.column_list)
        if self.except_column_list:
            out["exceptColumnList"] = ",".join(self.except_column_list)
        if self.stored_as_scd_type is not None:
            out["storedAsScdType"] = str(self.stored_as_scd_type)
        if self.track_history_column_list:
            out["trackHistoryColumnList"] = ",".join(self.track_history_column_list)
        if self.track_history_except_column_list:
            out["trackHistoryExceptColumnList"] = ",".join(self.track_history_except_column_list)
        return out


@dataclass
class Flow:
    """How a dataset is updated: a query function (or an Auto CDC spec) writing into ``target``.

    ``kind`` is ``append`` (``@dp.table`` / ``@dp.append_flow`` / SQL), ``update``
    (``@dp.update_flow``), ``auto_cdc`` or ``view`` (a temporary view's query, inlined where it
    is read).
    """

    name: str
    target: str
    func: Callable[[], Any] | None
    kind: str = "append"
    spark_conf: Mapping[str, str] = field(default_factory=dict)
    location: SourceLocation = field(default_factory=SourceLocation)
    auto_cdc: AutoCdc | None = None
    sql: str | None = None  # the statement, for flows defined in SQL
    expectations: Sequence[Any] = ()  # SQL-defined expectations (Python ones ride on func)
    once: bool = False  # Databricks' append_flow(once=True): a backfill run once until a full refresh

    def all_expectations(self, target: Dataset | None = None) -> list[Any]:
        """SQL constraints, the ``@dp.expect*`` decorators on the function and the target's
        ``create_streaming_table(expect_all...)`` expectations."""
        from headrace.pipelines.expectations import expectations_of

        own = [*self.expectations, *(expectations_of(self.func) if self.func is not None else [])]
        names = {e.name for e in own}
        return own + [e for e in (target.expectations if target is not None else ()) if e.name not in names]


class GraphRegistry:
    """Collects datasets and flows while definitions load; checks names as they come."""

    def __init__(self) -> None:
        self.datasets: dict[str, Dataset] = {}
        self.flows: dict[str, Flow] = {}
        self.problems: list[str] = []

    def register_dataset(self, ds: Dataset) -> None:
        """Called once per ``@dp.table`` / ``materialized_view`` / ``temporary_view`` /
        ``create_streaming_table`` / ``create_sink`` / SQL ``CREATE``."""
        other = self.datasets.get(ds.name.lower())
        if other is not None:
            raise PipelineDefinitionError(
                f"dataset {ds.name!r} is defined twice ({other.location} and {ds.location}); "
                "give one of them another name (name=...)"
            )
        self.datasets[ds.name.lower()] = ds

    def register_flow(self, flow: Flow) -> None:
        """Called once per flow; flow names are unique in the pipeline."""
        other = self.flows.get(flow.name.lower())
        if other is not None:
            raise PipelineDefinitionError(
                f"flow {flow.name!r} is defined twice ({other.location} and {flow.location}); "
                "give one of them another name (name=...)"
            )
        self.flows[flow.name.lower()] = flow
