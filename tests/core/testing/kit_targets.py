"""The contract kit aimed at the broken SQLite variants (tests/core/testing/broken_sqlite.py) and
at the correct example plugin. Not collected by the main run (no ``test_`` prefix): run by
tests/core/testing/test_kit.py in a subprocess with ``HEADRACE_PLUGINS`` set."""

from __future__ import annotations

import itertools
import sqlite3
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from headrace.protocols import ReadLimit
from headrace.testing import SinkContract, SourceContract


class _Source(SourceContract):
    limit = ReadLimit(max_rows=7)

    @pytest.fixture
    def source_options(self, tmp_path: Path) -> dict[str, Any]:
        db = tmp_path / "source.db"
        with closing(sqlite3.connect(db)) as conn, conn:
            conn.execute("CREATE TABLE events (id INTEGER PRIMARY KEY AUTOINCREMENT, value INTEGER, name TEXT)")
        return {"path": str(db), "table": "events"}

    @pytest.fixture
    def seed(self, source_options: dict[str, Any]) -> Callable[[int], None]:
        counter = itertools.count()

        def seed(n: int) -> None:
            with closing(sqlite3.connect(source_options["path"])) as conn, conn:
                conn.executemany("INSERT INTO events (value, name) VALUES (?, ?)",
                                 [(v, f"row-{v}") for v in itertools.islice(counter, n)])  # fmt: skip

        return seed


class _Sink(SinkContract):
    @pytest.fixture
    def sink_options(self, tmp_path: Path) -> dict[str, Any]:
        return {"path": str(tmp_path / "sink.db"), "table": "out"}

    @pytest.fixture
    def read_back(self, sink_options: dict[str, Any]) -> Callable[[], list[int]]:
        def read() -> list[int]:
            with closing(sqlite3.connect(sink_options["path"])) as conn:
                if conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'out'").fetchone() is None:
                    return []
                return [int(r[0]) for r in conn.execute("SELECT value FROM out")]

        return read


class TestCorrectSource(_Source):
    connector = "sqlite"


class TestCorrectSink(_Sink):
    connector = "sqlite"


class TestReplayNotSkipped(_Sink):
    connector = "broken-replay-not-skipped"


class TestRunKeyed(_Sink):
    connector = "broken-run-keyed"


class TestWritesBeforeCommit(_Sink):
    connector = "broken-writes-before-commit"


class TestFirstWriterOnly(_Sink):
    connector = "broken-first-writer-only"


class TestSeparateTransaction(_Sink):
    connector = "broken-separate-transaction"


class TestIgnoresLimit(_Source):
    connector = "broken-ignores-limit"


class TestOffByOne(_Source):
    connector = "broken-off-by-one"


class TestReadsPastEnd(_Source):
    connector = "broken-reads-past-end"


class TestUnpicklablePartition(_Source):
    connector = "broken-unpicklable-partition"


class TestIgnoresAvailableNow(_Source):
    connector = "broken-ignores-available-now"


class TestTooFewBatches(_Source):
    """A correct source, but its kill test's data fits in one batch: no random kill can land."""

    connector = "sqlite"
    limit = ReadLimit(max_rows=100)


class TestOneRowBatches(_Source):
    """A correct source, but batches of one row never pass the engine's mid_write point."""

    connector = "sqlite"
    seed_rows = 3
    limit = ReadLimit(max_rows=1)
