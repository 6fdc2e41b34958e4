"""The catalog seam: the api resolves table names through the Catalog installed in the context
(the pipelines runner installs its resolver), never by importing the pipelines package."""

from __future__ import annotations

import threading
from typing import Any

import pyarrow as pa
import pytest

import headrace as hr
from headrace.api.catalog import Catalog, active_catalog, installed
from headrace.api.reader import DataStreamReader
from headrace.api.stream_frame import StreamFrame
from headrace.errors import HeadraceError


class DictCatalog:
    """A catalog of in-memory tables, owned by no pipeline."""

    def __init__(self, tables: dict[str, pa.Table]) -> None:
        self.tables = tables
        self.asked: list[str] = []

    def stream_table(self, name: str, reader: DataStreamReader) -> StreamFrame:
        self.asked.append(name)
        return reader.format("memory").option("name", name).load()

    def static_frame(self, name: str) -> Any:
        self.asked.append(name)
        return self.tables[name]


def test_a_catalog_owned_by_no_pipeline_answers_the_readers() -> None:
    catalog = DictCatalog({"dim": pa.table({"k": [1]})})
    assert isinstance(catalog, Catalog)
    with installed(catalog):
        assert active_catalog() is catalog
        assert hr.read.table("dim") is catalog.tables["dim"]
        frame = hr.read_stream.table("events")
    assert isinstance(frame, StreamFrame)
    assert catalog.asked == ["dim", "events"]
    assert active_catalog() is None


@pytest.mark.parametrize("read", [lambda: hr.read_stream.table("t"), lambda: hr.read.table("t")],
                         ids=["read_stream.table", "read.table"])  # fmt: skip
def test_without_a_catalog_names_resolve_in_the_local_warehouse(read: Any, tmp_path: Any) -> None:
    from headrace.api.catalog import current_catalog
    from headrace.api.warehouse import WarehouseCatalog, set_warehouse

    assert isinstance(current_catalog(), WarehouseCatalog)
    previous = set_warehouse(tmp_path)
    try:
        with pytest.raises(HeadraceError, match=r"no table 't' in the warehouse"):
            read()
    finally:
        set_warehouse(previous)


def test_the_catalog_is_per_thread() -> None:
    seen: list[object] = []
    with installed(DictCatalog({})):
        t = threading.Thread(target=lambda: seen.append(active_catalog()))
        t.start()
        t.join()
    assert seen == [None]


def test_the_pipelines_resolver_is_a_catalog() -> None:
    from headrace.pipelines import _context
    from headrace.pipelines.resolver import Resolver

    assert issubclass(Resolver, Catalog)
    marker = DictCatalog({})
    with _context.resolving(marker):
        assert active_catalog() is marker
