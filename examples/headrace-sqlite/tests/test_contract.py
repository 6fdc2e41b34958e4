"""headrace's contract kit, run against the ``sqlite`` connector on real SQLite files.

The kit's tests come from the base classes; this file only says how to make an empty stream
(``source_options``), add rows to it (``seed``), where the sink writes (``sink_options``), how
to read back what it holds (``read_back``) and how to make its client fail (``commit_fault``).
Kill tests are marked ``slow``: ``pytest -m "not slow"`` skips them.
"""

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


class TestSqliteSource(SourceContract):
    connector = "sqlite"
    limit = ReadLimit(max_rows=7)  # splits the 30 seeded rows into 5 batches

    @pytest.fixture
    def source_options(self, tmp_path: Path) -> dict[str, Any]:
        """A new, empty table; the stream reads it from its start."""
        db = tmp_path / "source.db"
        with closing(sqlite3.connect(db)) as conn, conn:
            conn.execute("CREATE TABLE events (id INTEGER PRIMARY KEY AUTOINCREMENT, value INTEGER, name TEXT)")
        return {"path": str(db), "table": "events"}

    @pytest.fixture
    def seed(self, source_options: dict[str, Any]) -> Callable[[int], None]:
        """seed(n) appends n new, distinct rows."""
        counter = itertools.count()

        def seed(n: int) -> None:
            rows = [(v, f"row-{v}") for v in itertools.islice(counter, n)]
            with closing(sqlite3.connect(source_options["path"])) as conn, conn:
                conn.executemany("INSERT INTO events (value, name) VALUES (?, ?)", rows)

        return seed

class TestSqliteSink(SinkContract):
    connector = "sqlite"

    @pytest.fixture
    def sink_options(self, tmp_path: Path) -> dict[str, Any]:
        return {"path": str(tmp_path / "sink.db"), "table": "out"}

    @pytest.fixture
    def read_back(self, sink_options: dict[str, Any]) -> Callable[[], list[int]]:
        """() -> the ``value`` ints the sink's table holds now."""

        def read() -> list[int]:
            with closing(sqlite3.connect(sink_options["path"])) as conn:
                if conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'out'").fetchone() is None:
                    return []
                return [int(r[0]) for r in conn.execute("SELECT value FROM out")]

        return read

    @pytest.fixture
    def commit_fault(self, monkeypatch: pytest.MonkeyPatch) -> Callable[[BaseException], None]:
        """arm(fault): the sink's next connection raises ``fault`` when it inserts rows (the
        kit then checks that commit fails and that the replayed batch lands once)."""
        from headrace_sqlite import sink

        real = sqlite3.connect

        def arm(fault: BaseException) -> None:
            class Faulty(sqlite3.Connection):
                def executemany(self, *args: Any, **kwargs: Any) -> sqlite3.Cursor:
                    raise fault

            def connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
                monkeypatch.setattr(sink.sqlite3, "connect", real)  # one faulty connection, then the real ones
                return real(*args, factory=Faulty, **kwargs)

            monkeypatch.setattr(sink.sqlite3, "connect", connect)

        return arm
