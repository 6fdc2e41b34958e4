"""Named tables outside a pipeline: ``write_stream.to_table`` / ``toTable`` writes a Delta table
of the local warehouse, ``read_stream.table`` and ``read.table`` read it (headrace.api.warehouse)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import headrace as hr
from headrace.api.warehouse import (
    DEFAULT_WAREHOUSE,
    WAREHOUSE_ENV,
    TableNameError,
    set_warehouse,
    table_path,
    warehouse_path,
)
from headrace.errors import HeadraceError

pytest.importorskip("deltalake")


@pytest.fixture
def warehouse(tmp_path: Path) -> Any:
    root = tmp_path / "warehouse"
    previous = set_warehouse(root)
    yield root
    set_warehouse(previous)


def _files(folder: Path, batches: list[list[int]]) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    for i, values in enumerate(batches):
        pq.write_table(pa.table({"customerId": pa.array(values, pa.int64())}), folder / f"part-{i:03d}.parquet")
    return str(folder)


def _events(src: str) -> Any:
    return (hr.readStream.format("cloudFiles").option("cloudFiles.format", "parquet").option("maxFilesPerTrigger", 1)
            .schema("customerId BIGINT").load(src))  # fmt: skip


def _drain(query: Any) -> None:
    assert query.await_termination(60), "the query did not finish"
    assert query.exception() is None, query.exception()


def test_a_table_written_by_one_query_is_read_by_another(warehouse: Path, tmp_path: Path) -> None:
    src = _files(tmp_path / "in", [[1, 2, 1], [3, 1]])
    # PySpark's spelling, as Databricks documents it
    _drain(_events(src).writeStream.outputMode("append").option("checkpointLocation", str(tmp_path / "chk1"))
           .trigger(availableNow=True).toTable("events"))  # fmt: skip
    assert (warehouse / "events" / "_delta_log").is_dir()
    # a second query streams the table and writes an aggregate to another table
    _drain(hr.readStream.table("events").groupBy("customerId").count().writeStream.outputMode("complete")
           .option("checkpointLocation", str(tmp_path / "chk2")).trigger(availableNow=True)
           .toTable("events_by_customer"))  # fmt: skip
    counts = hr.read.table("events_by_customer").to_arrow()
    assert sorted(zip(*counts.to_pydict().values(), strict=True)) == [(1, 3), (2, 1), (3, 1)]
    # new input reaches both tables incrementally
    _files(tmp_path / "in", [[1, 2, 1], [3, 1], [2]])
    _drain(_events(src).write_stream.option("checkpointLocation", str(tmp_path / "chk1"))
           .trigger(available_now=True).to_table("events"))  # fmt: skip
    assert sorted(hr.read.table("events").to_arrow().column("customerId").to_pylist()) == [1, 1, 1, 2, 2, 3]


def test_names_with_a_database_and_a_catalog(warehouse: Path, tmp_path: Path) -> None:
    src = _files(tmp_path / "in", [[7]])
    for name in ("sales.orders", "main.sales.orders"):
        _drain(_events(src).writeStream.option("checkpointLocation", str(tmp_path / f"chk-{name}"))
               .trigger(availableNow=True).toTable(name))  # fmt: skip
    assert (warehouse / "sales.db" / "orders" / "_delta_log").is_dir()
    assert (warehouse / "main" / "sales.db" / "orders" / "_delta_log").is_dir()
    assert hr.read.table("SALES.Orders").to_arrow().num_rows == 1  # case-insensitive, as Spark
    assert hr.read.table("spark_catalog.sales.orders").to_arrow().num_rows == 1
    assert hr.read.table("main.sales.`orders`").to_arrow().num_rows == 1


@pytest.mark.parametrize("read", [lambda: hr.read_stream.table("missing"), lambda: hr.read.table("missing")],
                         ids=["read_stream.table", "read.table"])  # fmt: skip
def test_an_unknown_table_is_refused_naming_the_tables_and_the_fix(warehouse: Path, tmp_path: Path, read: Any) -> None:
    _drain(_events(_files(tmp_path / "in", [[1]])).writeStream.option("checkpointLocation", str(tmp_path / "c"))
           .trigger(availableNow=True).toTable("present"))  # fmt: skip
    with pytest.raises(HeadraceError, match=r"no table 'missing' in the warehouse .*tables there: present.*toTable"):
        read()


@pytest.mark.parametrize("name", ["../escape", "a/b", "/etc/passwd", "a..b", "", " ", "a.b.c.d", "x y", "`a/b`",
                                  "..", "a.", "é"])  # fmt: skip
def test_names_are_validated_before_any_io(warehouse: Path, tmp_path: Path, name: str) -> None:
    with pytest.raises(TableNameError):
        table_path(name)
    with pytest.raises(TableNameError):
        hr.read_stream.table(name)
    with pytest.raises(TableNameError):
        hr.read.table(name)
    with pytest.raises(TableNameError):
        _events(_files(tmp_path / "in", [[1]])).writeStream.option("checkpointLocation", str(tmp_path / "c")).toTable(name)
    assert not warehouse.exists()
    assert not (tmp_path / "c").exists()


def test_the_warehouse_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    previous = set_warehouse(None)
    try:
        monkeypatch.delenv(WAREHOUSE_ENV, raising=False)
        monkeypatch.chdir(tmp_path)
        assert warehouse_path() == str(tmp_path / DEFAULT_WAREHOUSE)  # Spark's spark-warehouse
        monkeypatch.setenv(WAREHOUSE_ENV, str(tmp_path / "env"))
        assert table_path("db.t") == str(tmp_path / "env" / "db.db" / "t")
        set_warehouse(tmp_path / "set")
        assert table_path("default.t") == str(tmp_path / "set" / "t")
    finally:
        set_warehouse(previous)


def test_another_format_is_refused(warehouse: Path, tmp_path: Path) -> None:
    src = _files(tmp_path / "in", [[1]])
    with pytest.raises(HeadraceError, match="warehouse tables are Delta"):
        _events(src).writeStream.format("parquet").option("checkpointLocation", str(tmp_path / "c")).toTable("t")
    with pytest.raises(HeadraceError, match="warehouse tables are Delta"):
        hr.readStream.format("kafka").table("t")


def test_without_headrace_delta_the_error_names_the_package(warehouse: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from headrace.plugins import discovery

    for module in [m for m in sys.modules if m == "headrace_delta" or m.startswith("headrace_delta.")] + ["headrace_delta"]:
        monkeypatch.setitem(sys.modules, module, None)  # as if headrace-delta were not installed
    monkeypatch.setattr(discovery, "_registry", None)
    for call in (lambda: hr.read_stream.table("t"), lambda: hr.read.table("t"),
                 lambda: hr.read_stream.format("rate").load().write_stream.option("checkpointLocation", "x")
                 .toTable("t")):  # fmt: skip
        with pytest.raises(HeadraceError, match="pip install headrace-delta"):
            call()
    assert not os.path.exists(warehouse)


def test_to_table_inside_a_pipeline_definition_is_refused(warehouse: Path) -> None:
    from headrace.api.catalog import installed
    from tests.core.api.test_catalog import DictCatalog

    with installed(DictCatalog({})), pytest.raises(HeadraceError, match="return the frame"):
        hr.read_stream.format("rate").load().write_stream.toTable("t")
