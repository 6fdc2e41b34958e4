"""Which Delta timestamp type the sink writes: ``timestamp`` for Arrow timestamps with a time
zone, ``timestamp_ntz`` (a reader-version-3 table feature that Spark before 3.5 cannot read) for
timestamps without one, and how a query gets ``timestamp`` (plugins/delta/README.md, "Timestamps")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from deltalake import DeltaTable

import headrace as hr


def write(tmp_path: Path, expr: str) -> DeltaTable:
    out = str(tmp_path / "out")
    q = (
        hr.read_stream.format("rate-micro-batch").option("rowsPerBatch", 5).option("totalRows", 5).load()
        .select_expr(expr)
        .write_stream.format("delta").option("checkpointLocation", str(tmp_path / "chk"))
        .trigger(available_now=True).start(out)
    )  # fmt: skip
    q.await_termination()
    return DeltaTable(out)


def field_type(table: DeltaTable) -> str:
    return str(json.loads(table.schema().to_json())["fields"][0]["type"])


@pytest.mark.parametrize(
    ("expr", "delta_type", "reader_version"),
    [
        pytest.param("timestamp AS ts", "timestamp", 1, id="utc-column-stays-timestamp"),
        pytest.param("CAST(timestamp AS TIMESTAMP_NTZ) AS ts", "timestamp_ntz", 3, id="cast-to-ntz-writes-ntz"),
        pytest.param(
            "CAST(CAST(timestamp AS TIMESTAMP_NTZ) AS TIMESTAMP) AS ts",
            "timestamp",
            1,
            id="spark-cast-to-timestamp-fixes-it",
        ),
    ],
)
def test_the_delta_timestamp_type_follows_the_arrow_time_zone(
    tmp_path: Path, expr: str, delta_type: str, reader_version: int
) -> None:
    table = write(tmp_path, expr)
    assert field_type(table) == delta_type
    assert table.protocol().min_reader_version == reader_version


def test_a_ddl_timestamp_is_spark_s_timestamp_and_ntz_is_zone_less() -> None:
    from headrace.sql_types import ddl_to_schema

    schema = ddl_to_schema("ts TIMESTAMP, local TIMESTAMP_NTZ")
    assert schema.field("ts").type.tz == "UTC"
    assert schema.field("local").type.tz is None
