"""headrace's sink contract suite, in upsert mode and in insert mode (no key), on a real
PostgreSQL. Both must be exactly-once across SIGKILLs: inserts through the bookkeeping table
alone."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from headrace.testing import SinkContract

Query = Callable[..., list[tuple[Any, ...]]]


class _Base(SinkContract):
    connector = "lakebase"
    supports_abort = False  # chunks are committed during write(), as in Lakebase; replay completes a batch

    @pytest.fixture
    def read_back(self, sink_options: dict[str, Any], query: Query, table: str) -> Callable[[], list[int]]:
        def read() -> list[int]:
            exists = query("SELECT to_regclass(%s)", (f"public.{table}",))[0][0]
            return [r[0] for r in query(f"SELECT value FROM {table}")] if exists else []

        return read


class TestUpsertSinkContract(_Base):
    @pytest.fixture
    def sink_options(self, pg_options: dict[str, Any]) -> dict[str, Any]:
        return {**pg_options, "upsertkey": "value", "batchsize": 150}

    # Upserts share every line of the exactly-once path with inserts (which run the whole
    # crash matrix below) and test_kill_restart.py kills upserts mid-write; one more point here
    # keeps the suite's wall time in budget.
    @pytest.mark.slow
    @pytest.mark.parametrize("crash", ["before_sink_commit"])
    def test_kill_and_restart_loses_nothing(
        self, crash: str, sink_options: dict[str, Any], read_back: Callable[[], list[int]], tmp_path: Path
    ) -> None:
        super().test_kill_and_restart_loses_nothing(crash, sink_options, read_back, tmp_path)


class TestInsertSinkContract(_Base):
    @pytest.fixture
    def sink_options(self, pg_options: dict[str, Any]) -> dict[str, Any]:
        return {**pg_options, "batchsize": 150}
