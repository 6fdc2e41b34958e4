"""The built-in connectors pass the contract suites."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from headrace.connectors.files import read_files
from headrace.protocols import ReadLimit
from headrace.testing import SinkContract, SourceContract


class TestRateMicroBatchSourceContract(SourceContract):
    connector = "rate-micro-batch"
    limit = ReadLimit(max_rows=10)

    @pytest.fixture
    def source_options(self) -> dict[str, Any]:
        return {"rowsPerBatch": 10, "totalRows": 0, "numPartitions": 2}

    @pytest.fixture
    def seed(self, source_options: dict[str, Any]) -> Callable[[int], None]:
        # the generator's "stream" is bounded by totalRows: seeding n rows raises the bound
        def add(n: int) -> None:
            source_options["totalRows"] += n
            for src in self.__dict__.get("_live", []):
                src.total = source_options["totalRows"]

        return add

    def make_source(self, options: dict[str, Any], state: Path) -> Any:
        src = super().make_source(options, state)
        self.__dict__.setdefault("_live", []).append(src)
        return src


class TestFilesSinkContract(SinkContract):
    connector = "files"
    one_query_per_target = True  # one query's batches per folder, as Spark's file sink

    @pytest.fixture
    def sink_options(self, tmp_path: Path) -> dict[str, Any]:
        return {"path": str(tmp_path / "out")}

    @pytest.fixture
    def read_back(self, sink_options: dict[str, Any]) -> Callable[[], list[int]]:
        def values() -> list[int]:
            t = read_files(sink_options["path"])
            return t.column("value").to_pylist() if t.num_rows else []

        return values
