"""The definition API, mirroring ``pyspark.pipelines`` (names, arguments, semantics)::

    import headrace as hr
    import headrace.pipelines as dp

    @dp.table
    def bronze():
        return hr.read_stream.format("cloudFiles").option("cloudFiles.format", "json").load("landing")

    @dp.materialized_view
    def gold():
        return dp.read.table("silver").join(dp.read.table("dims"), on="k")

Decorators register the dataset and its flow into the pipeline being loaded and return the
function unchanged (pyspark returns None), so ``@dp.expect`` may sit above or below them.
Query functions are called by the runner: once by the dry run to learn the graph, then once
per run (per flow start) to build the query; they must not do I/O themselves.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, TypeVar, overload

from headrace.pipelines._context import active_registry
from headrace.pipelines.elements import (
    MATERIALIZED_VIEW,
    SINK,
    STREAMING_TABLE,
    TABLE,
    TEMPORARY_VIEW,
    AutoCdc,
    Dataset,
    Flow,
    PipelineDefinitionError,
    SourceLocation,
)

__all__ = [
    "append_flow",
    "create_auto_cdc_flow",
    "create_sink",
    "create_streaming_table",
    "materialized_view",
    "table",
    "temporary_view",
    "update_flow",
]

F = TypeVar("F", bound=Callable[..., Any])
QueryFunction = Callable[[], Any]


def _check_str(arg: str, value: Any, *, optional: bool = False) -> None:
    if value is None and optional:
        return
    if not isinstance(value, str) or not value:
        raise PipelineDefinitionError(f"{arg} must be a non-empty string, not {type(value).__name__} {value!r}")


def _check_str_list(arg: str, value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
        raise PipelineDefinitionError(f"{arg} must be a list of column names (strings), not {value!r}")


def _check_str_dict(arg: str, value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, Mapping):
        raise PipelineDefinitionError(f"{arg} must be a dict of strings, not {type(value).__name__}")


def _check_callable(decorated: Any, decorator: str) -> None:
    if not callable(decorated):
        raise PipelineDefinitionError(
            f"@dp.{decorator} decorates a query function; with arguments write "
            f"@dp.{decorator}(name='{decorator}_a') above a def"
        )


def _stored(
    kind: str,
    query_function: QueryFunction | None,
    *,
    name: str | None,
    comment: str | None,
    spark_conf: Mapping[str, str] | None,
    table_properties: Mapping[str, str] | None,
    partition_cols: Sequence[str] | None,
    cluster_by: Sequence[str] | None,
    schema: Any,
    format: str | None,
    decorator: str,
) -> Any:
    _check_str("name", name, optional=True)
    _check_str_dict("table_properties", table_properties)
    _check_str_dict("spark_conf", spark_conf)
    _check_str_list("partition_cols", partition_cols)
    _check_str_list("cluster_by", cluster_by)
    if format is not None and format.lower() != "delta":
        raise PipelineDefinitionError(
            f"@dp.{decorator}(format={format!r}): pipeline tables are Delta tables; remove format= "
            "or write to another format with dp.create_sink(...)"
        )
    loc = SourceLocation.of_caller(3)

    def outer(decorated: F) -> F:
        _check_callable(decorated, decorator)
        resolved = name or decorated.__name__
        reg = active_registry()
        reg.register_dataset(Dataset(
            name=resolved, kind=kind, comment=comment, table_properties=dict(table_properties or {}),
            partition_cols=list(partition_cols) if partition_cols else None,
            cluster_by=list(cluster_by) if cluster_by else None, schema=schema, format=format, location=loc,
        ))  # fmt: skip
        reg.register_flow(Flow(name=resolved, target=resolved, func=decorated,
                               kind="view" if kind == TEMPORARY_VIEW else "append",
                               spark_conf=dict(spark_conf or {}), location=loc))  # fmt: skip
        return decorated

    if query_function is not None:
        return outer(query_function)
    return outer


@overload
def table(query_function: F) -> F: ...
@overload
def table(
    *, query_function: None = None, name: str | None = None, comment: str | None = None,
    spark_conf: Mapping[str, str] | None = None, table_properties: Mapping[str, str] | None = None,
    partition_cols: Sequence[str] | None = None, cluster_by: Sequence[str] | None = None,
    schema: Any = None, format: str | None = None,
) -> Callable[[F], F]: ...  # fmt: skip
def table(
    query_function: QueryFunction | None = None,
    *,
    name: str | None = None,
    comment: str | None = None,
    spark_conf: Mapping[str, str] | None = None,
    table_properties: Mapping[str, str] | None = None,
    partition_cols: Sequence[str] | None = None,
    cluster_by: Sequence[str] | None = None,
    schema: Any = None,
    format: str | None = None,
) -> Any:
    """(Return a) decorator defining a table and marking the function as its query.

    A function returning a stream (``hr.read_stream...``) makes a **streaming table**: a Delta
    table in the pipeline's storage, appended to incrementally, each input row processed once.
    A function returning a batch result (``dp.read...``, a ``pyarrow.Table``) makes a
    **materialized view**, recomputed on each run. Usable with or without arguments;
    ``name`` defaults to the function's name. ``partition_cols`` partition the Delta table;
    ``table_properties``, ``cluster_by`` and ``schema`` are recorded (see docs/pipelines.md).
    """
    return _stored(TABLE, query_function, name=name, comment=comment, spark_conf=spark_conf,
                   table_properties=table_properties, partition_cols=partition_cols, cluster_by=cluster_by,
                   schema=schema, format=format, decorator="table")  # fmt: skip


@overload
def materialized_view(query_function: F) -> F: ...
@overload
def materialized_view(
    *, query_function: None = None, name: str | None = None, comment: str | None = None,
    spark_conf: Mapping[str, str] | None = None, table_properties: Mapping[str, str] | None = None,
    partition_cols: Sequence[str] | None = None, cluster_by: Sequence[str] | None = None,
    schema: Any = None, format: str | None = None,
) -> Callable[[F], F]: ...  # fmt: skip
def materialized_view(
    query_function: QueryFunction | None = None,
    *,
    name: str | None = None,
    comment: str | None = None,
    spark_conf: Mapping[str, str] | None = None,
    table_properties: Mapping[str, str] | None = None,
    partition_cols: Sequence[str] | None = None,
    cluster_by: Sequence[str] | None = None,
    schema: Any = None,
    format: str | None = None,
) -> Any:
    """(Return a) decorator defining a materialized view: a Delta table whose content is the
    query's batch result, recomputed on every run after its inputs are updated (and on full
    refresh). The query reads other datasets with ``dp.read.table(name)``."""
    return _stored(MATERIALIZED_VIEW, query_function, name=name, comment=comment, spark_conf=spark_conf,
                   table_properties=table_properties, partition_cols=partition_cols, cluster_by=cluster_by,
                   schema=schema, format=format, decorator="materialized_view")  # fmt: skip


@overload
def temporary_view(query_function: F) -> F: ...
@overload
def temporary_view(
    *, query_function: None = None, name: str | None = None, comment: str | None = None,
    spark_conf: Mapping[str, str] | None = None,
) -> Callable[[F], F]: ...  # fmt: skip
def temporary_view(
    query_function: QueryFunction | None = None,
    *,
    name: str | None = None,
    comment: str | None = None,
    spark_conf: Mapping[str, str] | None = None,
) -> Any:
    """(Return a) decorator defining a temporary view: a named query other definitions of the
    pipeline read (stream or batch, as its function returns); never persisted."""
    _check_str("name", name, optional=True)
    _check_str_dict("spark_conf", spark_conf)
    loc = SourceLocation.of_caller(2)

    def outer(decorated: F) -> F:
        _check_callable(decorated, "temporary_view")
        resolved = name or decorated.__name__
        reg = active_registry()
        reg.register_dataset(Dataset(name=resolved, kind=TEMPORARY_VIEW, comment=comment, location=loc))
        reg.register_flow(Flow(name=resolved, target=resolved, func=decorated, kind="view",
                               spark_conf=dict(spark_conf or {}), location=loc))  # fmt: skip
        return decorated

    if query_function is not None:
        return outer(query_function)
    return outer


def create_streaming_table(
    name: str,
    *,
    comment: str | None = None,
    table_properties: Mapping[str, str] | None = None,
    partition_cols: Sequence[str] | None = None,
    cluster_by: Sequence[str] | None = None,
    schema: Any = None,
    format: str | None = None,
    expect_all: Mapping[str, Any] | None = None,
    expect_all_or_drop: Mapping[str, Any] | None = None,
    expect_all_or_fail: Mapping[str, Any] | None = None,
) -> None:
    """Create a streaming table that ``@dp.append_flow(target=name)`` flows (or
    ``create_auto_cdc_flow``) write into. ``expect_all*`` (Databricks) apply to every flow
    writing into it."""
    from headrace.pipelines.expectations import expect_all as _ea
    from headrace.pipelines.expectations import expect_all_or_drop as _ead
    from headrace.pipelines.expectations import expect_all_or_fail as _eaf
    from headrace.pipelines.expectations import expectations_of

    def _holder() -> None: ...

    for deco, arg in ((_ea, expect_all), (_ead, expect_all_or_drop), (_eaf, expect_all_or_fail)):
        if arg:
            deco(arg)(_holder)
    _check_str("name", name)
    _check_str_dict("table_properties", table_properties)
    _check_str_list("partition_cols", partition_cols)
    _check_str_list("cluster_by", cluster_by)
    if format is not None and format.lower() != "delta":
        raise PipelineDefinitionError(f"create_streaming_table({name!r}, format={format!r}): pipeline tables are Delta tables")
    active_registry().register_dataset(Dataset(
        name=name, kind=STREAMING_TABLE, comment=comment, table_properties=dict(table_properties or {}),
        partition_cols=list(partition_cols) if partition_cols else None,
        cluster_by=list(cluster_by) if cluster_by else None, schema=schema, format=format,
        location=SourceLocation.of_caller(2), expectations=tuple(expectations_of(_holder)),
    ))  # fmt: skip


def create_sink(name: str, format: str, options: Mapping[str, Any] | None = None) -> None:
    """Create a sink flows can write to: any headrace sink connector (``kafka``, ``delta`` at
    a path, ``postgresql``, ``files``, ...) with its options, checked by the dry run."""
    _check_str("name", name)
    _check_str("format", format)
    if options is not None and not isinstance(options, Mapping):
        raise PipelineDefinitionError(f"create_sink({name!r}): options must be a dict, not {type(options).__name__}")
    active_registry().register_dataset(Dataset(
        name=name, kind=SINK, format=format, options=dict(options or {}), location=SourceLocation.of_caller(2)
    ))  # fmt: skip


def append_flow(
    *,
    target: str,
    name: str | None = None,
    spark_conf: Mapping[str, str] | None = None,
    once: bool = False,
) -> Callable[[F], F]:
    """Return a decorator defining an append flow: the function's stream is appended to
    ``target`` (a streaming table or a sink). Several flows may target one table; each has its
    own checkpoint. ``name`` defaults to the function's name. ``once=True`` (Databricks): a
    backfill that runs once (everything available then) and not again until a full refresh."""
    _check_str("target", target)
    _check_str("name", name, optional=True)
    _check_str_dict("spark_conf", spark_conf)
    loc = SourceLocation.of_caller(2)

    def outer(func: F) -> F:
        _check_callable(func, "append_flow")
        active_registry().register_flow(Flow(name=name or func.__name__, target=target, func=func, kind="append",
                                             spark_conf=dict(spark_conf or {}), location=loc, once=bool(once)))  # fmt: skip
        return func

    return outer


def update_flow(
    *,
    target: str,
    name: str | None = None,
    spark_conf: Mapping[str, str] | None = None,
) -> Callable[[F], F]:
    """Return a decorator defining an update flow into a sink (Databricks' real-time flows):
    with ``spark_conf={"pipelines.trigger": "RealTime", "pipelines.trigger.interval": "5 minutes"}``
    it runs with the real-time trigger in a continuous run (the source and sink must support it)."""
    _check_str("target", target)
    _check_str("name", name, optional=True)
    _check_str_dict("spark_conf", spark_conf)
    loc = SourceLocation.of_caller(2)

    def outer(func: F) -> F:
        _check_callable(func, "update_flow")
        active_registry().register_flow(Flow(name=name or func.__name__, target=target, func=func, kind="update",
                                             spark_conf=dict(spark_conf or {}), location=loc))  # fmt: skip
        return func

    return outer


def _names(arg: str, value: Any) -> tuple[str, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) and v for v in value):
        raise PipelineDefinitionError(f"create_auto_cdc_flow: {arg} must be a list of column names, not {value!r}")
    return tuple(value)


def create_auto_cdc_flow(
    target: str,
    source: str,
    keys: Sequence[str],
    sequence_by: str,
    apply_as_deletes: str | None = None,
    column_list: Sequence[str] | None = None,
    except_column_list: Sequence[str] | None = None,
    stored_as_scd_type: Literal[1, 2, "1", "2"] | None = None,
    name: str | None = None,
    *,
    track_history_column_list: Sequence[str] | None = None,
    track_history_except_column_list: Sequence[str] | None = None,
    spark_conf: Mapping[str, str] | None = None,
) -> None:
    """Apply the change events of ``source`` (a dataset of the pipeline, read as a stream) to
    the streaming table ``target`` (made with ``create_streaming_table``): upserts by ``keys``
    ordered by ``sequence_by``, deletes where ``apply_as_deletes``, SCD type 1 or 2.

    Runs as the delta sink's CDC mode with the options ``keys``, ``sequenceBy``,
    ``applyAsDeletes``, ``columnList``, ``exceptColumnList``, ``storedAsScdType``.
    """
    _check_str("target", target)
    _check_str("source", source)
    _check_str("name", name, optional=True)
    _check_str("sequence_by", sequence_by)
    _check_str("apply_as_deletes", apply_as_deletes, optional=True)
    key_names = _names("keys", keys)
    if not key_names:
        raise PipelineDefinitionError("create_auto_cdc_flow: keys needs at least one column")
    cols, excl = _names("column_list", column_list), _names("except_column_list", except_column_list)
    if cols and excl:
        raise PipelineDefinitionError("create_auto_cdc_flow: give column_list or except_column_list, not both")
    th, the = (_names("track_history_column_list", track_history_column_list),
               _names("track_history_except_column_list", track_history_except_column_list))  # fmt: skip
    if th and the:
        raise PipelineDefinitionError(
            "create_auto_cdc_flow: give track_history_column_list or track_history_except_column_list, not both"
        )
    if stored_as_scd_type is not None and str(stored_as_scd_type) not in ("1", "2"):
        raise PipelineDefinitionError(f"create_auto_cdc_flow: stored_as_scd_type must be 1 or 2, not {stored_as_scd_type!r}")
    scd = int(stored_as_scd_type) if stored_as_scd_type is not None else None
    if (th or the) and scd != 2:
        raise PipelineDefinitionError(
            "create_auto_cdc_flow: track_history_column_list / track_history_except_column_list need stored_as_scd_type=2"
        )
    cdc = AutoCdc(source=source, keys=key_names, sequence_by=sequence_by, apply_as_deletes=apply_as_deletes,
                  column_list=cols, except_column_list=excl, stored_as_scd_type=scd,
                  track_history_column_list=th, track_history_except_column_list=the)  # fmt: skip
    active_registry().register_flow(Flow(name=name or target, target=target, func=None, kind="auto_cdc",
                                         spark_conf=dict(spark_conf or {}), location=SourceLocation.of_caller(2),
                                         auto_cdc=cdc))  # fmt: skip
