"""Declarative pipelines, mirroring ``pyspark.pipelines`` (Spark Declarative Pipelines)::

    import headrace as hr
    import headrace.pipelines as dp

    @dp.table                                   # a streaming table (the function returns a stream)
    def bronze():
        return hr.read_stream.format("cloudFiles").option("cloudFiles.format", "json").load("landing")

    @dp.table
    @dp.expect_or_drop("positive", "amount > 0")
    def silver():
        return hr.read_stream.table("bronze")    # another dataset: an edge of the graph

    @dp.materialized_view                       # recomputed from batch reads on every run
    def gold():
        return dp.read.table("silver").join(dp.read.table("dims"), on="k")

A ``pipeline.yml`` lists the libraries (Python and SQL files); ``headrace pipelines run`` runs
them (see docs/pipelines.md). Importing this package imports neither PyYAML, sqlglot nor DuckDB.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from headrace.pipelines._context import configuration
from headrace.pipelines.api import (
    append_flow,
    create_auto_cdc_flow,
    create_sink,
    create_streaming_table,
    materialized_view,
    table,
    temporary_view,
    update_flow,
)
from headrace.pipelines.batch_reads import StaticFrame, read, stream_static_join
from headrace.pipelines.expectations import (
    expect,
    expect_all,
    expect_all_or_drop,
    expect_all_or_fail,
    expect_or_drop,
    expect_or_fail,
)

if TYPE_CHECKING:
    from headrace.pipelines.runner import PipelineRun, RunResult
    from headrace.pipelines.spec import LoadedPipeline, load_pipeline

__all__ = [
    "LoadedPipeline",
    "PipelineRun",
    "RunResult",
    "StaticFrame",
    "append_flow",
    "configuration",
    "create_auto_cdc_flow",
    "create_sink",
    "create_streaming_table",
    "expect",
    "expect_all",
    "expect_all_or_drop",
    "expect_all_or_fail",
    "expect_or_drop",
    "expect_or_fail",
    "load_pipeline",
    "materialized_view",
    "read",
    "stream_static_join",
    "table",
    "temporary_view",
    "update_flow",
]


def __getattr__(name: str) -> Any:
    if name in ("LoadedPipeline", "load_pipeline"):
        from headrace.pipelines import spec

        return getattr(spec, name)
    if name in ("PipelineRun", "RunResult"):
        from headrace.pipelines import runner

        return getattr(runner, name)
    raise AttributeError(f"module 'headrace.pipelines' has no attribute {name!r}")
