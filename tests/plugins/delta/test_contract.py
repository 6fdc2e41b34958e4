"""The headrace contract suites for the delta source and sink."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from headrace.protocols import ReadLimit
from headrace.testing import SinkContract, SourceContract


class TestDeltaSourceContract(SourceContract):
    connector = "delta"
    limit = ReadLimit(max_files=1)  # seed writes 10-row commits, one file each
    page_rows = 1000  # 100 commits of one 10-row file each (seeding 5,000 rows takes 500 commits)

    @pytest.fixture
    def source_options(self, tmp_path: Path) -> dict[str, Any]:
        path = str(tmp_path / "table")
        write_deltalake(path, pa.schema([("v", pa.int64())]).empty_table())
        return {"path": path}

    @pytest.fixture
    def seed(self, source_options: dict[str, Any]) -> Callable[[int], None]:
        state = {"next": 0}

        def seed(n: int) -> None:
            while n > 0:
                k = min(10, n)
                lo = state["next"]
                write_deltalake(source_options["path"], pa.table({"v": pa.array(range(lo, lo + k), pa.int64())}), mode="append")
                state["next"] += k
                n -= k

        return seed


class TestDeltaSinkContract(SinkContract):
    connector = "delta"

    @pytest.fixture
    def sink_options(self, tmp_path: Path) -> dict[str, Any]:
        return {"path": str(tmp_path / "out")}

    @pytest.fixture
    def read_back(self, sink_options: dict[str, Any]) -> Callable[[], list[int]]:
        def read() -> list[int]:
            if not DeltaTable.is_deltatable(sink_options["path"]):
                return []
            return list(DeltaTable(sink_options["path"]).to_pyarrow_table().column("value").to_pylist())

        return read
