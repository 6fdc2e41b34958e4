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


class _FaultySqlite:
    """Stands in for the ``sqlite3`` module in the sink's modules: its next connection raises
    the kit's fault from ``executemany`` (the row insert), then the real module is back."""

    def __init__(self, fault: BaseException, restore: Callable[[], None]) -> None:
        self._fault, self._restore = fault, restore

    def __getattr__(self, name: str) -> Any:
        return getattr(sqlite3, name)

    def connect(self, *args: Any, **kwargs: Any) -> sqlite3.Connection:
        fault = self._fault
        self._restore()

        class Faulty(sqlite3.Connection):
            def executemany(self, *a: Any, **k: Any) -> sqlite3.Cursor:
                raise fault

        return sqlite3.connect(*args, factory=Faulty, **kwargs)


class _Sink(SinkContract):
    @pytest.fixture
    def sink_options(self, tmp_path: Path) -> dict[str, Any]:
        return {"path": str(tmp_path / "sink.db"), "table": "out"}

    @pytest.fixture
    def commit_fault(self, monkeypatch: pytest.MonkeyPatch) -> Callable[[BaseException], None]:
        """arm(fault): the sink's next connection raises ``fault`` when it inserts rows."""
        import headrace_sqlite.sink
        from tests.core.testing import broken_sqlite

        def arm(fault: BaseException) -> None:
            def restore() -> None:
                for module in (headrace_sqlite.sink, broken_sqlite):
                    monkeypatch.setattr(module, "sqlite3", sqlite3)

            for module in (headrace_sqlite.sink, broken_sqlite):
                monkeypatch.setattr(module, "sqlite3", _FaultySqlite(fault, restore))

        return arm

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


class TestChunkedCommit(_Sink):
    connector = "broken-chunked-commit"


class TestSwallowsCommitError(_Sink):
    connector = "broken-swallows-commit-error"


class TestBatchKeyed(_Sink):
    connector = "broken-batch-keyed"


class TestPerPartitionLimit(_Source):
    connector = "broken-per-partition-limit"


class TestRoundsPastLimit(_Source):
    connector = "broken-rounds-past-limit"


class TestPageReread(_Source):
    connector = "broken-page-reread"


class TestCommitsAhead(_Source):
    connector = "broken-commits-ahead"


class TestInferredSchema(_Source):
    connector = "broken-inferred-schema"


class TestMutatesStart(_Source):
    connector = "broken-mutates-start"


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
