"""The change source against the source contract kit (offsets, ranges, replay, pickling, kills)."""

# ruff: noqa: F811  (pytest fixtures imported from cdc_helpers)
from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import pytest

from headrace.protocols import ReadLimit
from headrace.testing import SourceContract
from tests.plugins.lakebase.cdc_helpers import Sql, cdc_name, cdc_options, lsql  # noqa: F401


class TestChangeSourceContract(SourceContract):
    connector = "postgresql"
    limit: ClassVar[ReadLimit] = ReadLimit(max_rows=10)
    seed_rows = 30
    page_rows = 500  # one transaction per seeded row (~50 ms each); 50 snapshot chunks of 10 rows still

    @pytest.fixture
    def source_options(self, cdc_options: dict[str, Any], cdc_name: str, lsql: Sql) -> dict[str, Any]:
        lsql(f"CREATE TABLE IF NOT EXISTS {cdc_name} (id int PRIMARY KEY, n int)")
        return {**cdc_options, "snapshotChunkRows": 10}

    @pytest.fixture
    def seed(self, source_options: dict[str, Any], cdc_name: str, lsql: Sql) -> Callable[[int], None]:
        counter = [0]

        def add(n: int) -> None:
            for _ in range(n):  # one transaction per row
                lsql(f"INSERT INTO {cdc_name} VALUES (%s, 0)", (counter[0],))
                counter[0] += 1

        return add
