"""Helpers of the Spark tests: run a query to its end, poll, read results."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from typing import Any

import pyarrow as pa

from headrace.connectors.files import read_files


def run_available_now(spark: Any, source: str, source_opts: Mapping[str, Any], sink: str,
                      sink_opts: Mapping[str, Any], checkpoint: str, *, timeout: float = 90) -> Any:  # fmt: skip
    """readStream(source) -> writeStream(sink), trigger availableNow, run to the end."""
    df = spark.readStream.format(source).options(**{k: str(v) for k, v in source_opts.items()}).load()
    q = (
        df.writeStream.format(sink)
        .options(**{k: str(v) for k, v in sink_opts.items()})
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    assert q.awaitTermination(timeout), f"query did not finish within {timeout} s"
    return q


def wait_for(cond: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.1)


def values(table: pa.Table, column: str = "value") -> list[Any]:
    return sorted(table.column(column).to_pylist()) if table.num_rows else []


def files_rows(path: str) -> pa.Table:
    return read_files(path)


def commit_markers(path: str) -> list[int]:
    folder = os.path.join(path, "_commits")
    return sorted(int(n) for n in os.listdir(folder) if n.isdigit()) if os.path.isdir(folder) else []


def total_input_rows(query: Any) -> int:
    return sum(int(p["numInputRows"]) for p in query.recentProgress)
