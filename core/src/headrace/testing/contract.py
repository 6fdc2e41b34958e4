"""Contract test suites every connector opts into with one subclass.

Sources::

    from headrace.protocols import ReadLimit
    from headrace.testing import SourceContract

    class TestKafkaSourceContract(SourceContract):
        connector = "kafka"
        limit = ReadLimit(max_rows=7)          # splits the seeded rows into several batches

        @pytest.fixture
        def source_options(self, kafka, tmp_path):   # a fresh, empty stream; reads from its start
            ...
        @pytest.fixture
        def seed(self, source_options):              # seed(n) appends n new, distinct rows
            ...

Sinks::

    class TestDeltaSinkContract(SinkContract):
        connector = "delta"
        transform = None                       # or "module:function": Table(timestamp, value) -> your rows

        @pytest.fixture
        def sink_options(self, tmp_path): ...
        @pytest.fixture
        def read_back(self, sink_options):     # () -> the ``value`` ints the sink holds now
            ...

What they check: discovery through the ``headrace`` entry point, unknown options rejected with
a did-you-mean, offsets that survive a JSON round trip, empty ranges, range associativity
(``[a,b) + [b,c) == [a,c)``), deterministic replay, picklable partitions and commit messages,
kill-and-restart (SIGKILL at every engine crash point and at random times, then a clean run)
with every row exactly once for exactly-once pairs and at least once otherwise, idempotent
re-commit of a batch id, several writers committing one batch, abort, empty batches, and a
clean, idempotent ``close``.
"""

from __future__ import annotations

import importlib.metadata
import json
import pickle
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import pyarrow as pa
import pytest

from headrace.errors import OptionsError
from headrace.options import suggest
from headrace.plugins import ENTRY_POINT_GROUP, registry
from headrace.protocols import Offset, ReadLimit, Sink, SinkContext, Source, SourceContext
from headrace.testing._pipeline import _load, run_pipeline

__all__ = ["CRASH_POINTS", "SinkContract", "SourceContract", "row_keys"]

CRASH_POINTS = ("before_offsets", "after_offsets", "mid_write", "before_sink_commit", "after_sink_commit", "after_commit")


def row_keys(table: pa.Table) -> list[str]:
    """Each row as a canonical JSON string (hashable, order-independent comparison)."""
    return [json.dumps(r, sort_keys=True, default=repr) for r in table.to_pylist()]


def _discovered(connector: str) -> None:
    spec = registry().get(connector)
    dists = {
        ep.dist.name if ep.dist is not None else "?"
        for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
    }
    assert spec.distribution in dists, (
        f"connector {connector!r} comes from {spec.distribution!r}, not from a distribution with a "
        f"'{ENTRY_POINT_GROUP}' entry point ({sorted(dists)}); declare [project.entry-points.headrace]"
    )


def _typo_rejected(schema_names: list[str], parse: Callable[[dict[str, Any]], Any], base: dict[str, Any]) -> None:
    bogus = dict(base, noSuchOptionAnywhere="1")
    with pytest.raises(OptionsError) as e:
        parse(bogus)
    assert "noSuchOptionAnywhere" in str(e.value)
    longest = max((n for n in schema_names if len(n) >= 6 and n.lower() not in {k.lower() for k in base}), key=len, default=None)
    if longest is not None:
        typo = longest[:-1] + ("x" if longest[-1] != "x" else "y")
        if suggest(typo, schema_names) == longest:
            with pytest.raises(OptionsError) as e2:
                parse(dict(base, **{typo: "1"}))
            assert f"did you mean '{longest}'" in str(e2.value)


class SourceContract:
    """Subclass with ``connector``, and fixtures ``source_options`` and ``seed``.

    ``source_options`` must make a new stream start at the beginning of the (initially empty)
    stream, so seeded rows are all read (e.g. ``startingOffsets=earliest``). Rows seeded must be
    distinct. ``limit`` must split ``seed_rows`` rows into more than one batch.
    """

    connector: ClassVar[str] = ""
    limit: ClassVar[ReadLimit] = ReadLimit(max_rows=10)
    seed_rows: ClassVar[int] = 30
    kill_timeout: ClassVar[float] = 120.0

    # -------------------------------------------------------------- helpers
    def make_source(self, options: dict[str, Any], state: Path) -> Source:
        spec = registry().get(self.connector)
        opts = spec.source_options.parse(options, connector=spec.name, role="source")
        state.mkdir(parents=True, exist_ok=True)
        ctx = SourceContext(query_id="contract", run_id=uuid.uuid4().hex, state_path=str(state))
        src: Source = spec.load_source()(opts, ctx)
        return src

    def read_range(self, src: Source, start: Offset, end: Offset) -> pa.Table:
        batches = [b for p in src.partitions(start, end) for b in src.read(p)]
        return pa.Table.from_batches(batches, schema=src.schema) if batches else src.schema.empty_table()

    @pytest.fixture
    def source(self, source_options: dict[str, Any], tmp_path: Path) -> Iterator[Source]:
        src = self.make_source(source_options, tmp_path / "state")
        yield src
        src.close()

    # -------------------------------------------------------------- tests
    def test_discovered_through_entry_point(self) -> None:
        _discovered(self.connector)
        assert registry().get(self.connector).source is not None

    def test_unknown_options_rejected_with_suggestion(self, source_options: dict[str, Any]) -> None:
        spec = registry().get(self.connector)
        names = [o.name for o in spec.source_options.options if not o.unsupported]
        _typo_rejected(names, lambda o: spec.source_options.parse(o, connector=spec.name, role="source"), source_options)

    def test_offsets_survive_json(self, source: Source, seed: Callable[[int], None]) -> None:
        seed(3)
        start = source.initial_offset()
        assert json.loads(json.dumps(start)) == start
        end = source.latest_offset(start, ReadLimit.all_available())
        assert json.loads(json.dumps(end)) == end

    def test_empty_range_has_no_partitions(self, source: Source, seed: Callable[[int], None]) -> None:
        start = source.initial_offset()
        assert list(source.partitions(start, start)) == []
        seed(3)
        end = source.latest_offset(start, ReadLimit.all_available())
        assert list(source.partitions(end, end)) == []

    def test_ranges_are_associative_and_replay_is_deterministic(self, source: Source, seed: Callable[[int], None]) -> None:
        seed(self.seed_rows)
        a = source.initial_offset()
        b = source.latest_offset(a, self.limit)
        assert b != a, "the source returned no data although rows were seeded"
        c = b
        for _ in range(1000):
            nxt = source.latest_offset(c, ReadLimit.all_available())
            if nxt == c:
                break
            c = nxt
        ab, bc, ac = self.read_range(source, a, b), self.read_range(source, b, c), self.read_range(source, a, c)
        assert 0 < ab.num_rows < self.seed_rows, f"limit {self.limit} did not split {self.seed_rows} rows"
        assert Counter(row_keys(ab)) + Counter(row_keys(bc)) == Counter(row_keys(ac))
        assert ac.num_rows == self.seed_rows
        assert len(set(row_keys(ac))) == self.seed_rows
        again = self.read_range(source, a, c)
        assert row_keys(again) == row_keys(ac), "reading the same range twice gave different rows"

    def test_partitions_are_picklable(self, source: Source, seed: Callable[[int], None]) -> None:
        seed(5)
        a = source.initial_offset()
        end = source.latest_offset(a, ReadLimit.all_available())
        parts = list(source.partitions(a, end))
        assert parts
        copies = pickle.loads(pickle.dumps(parts))
        rows = sum(b.num_rows for p in copies for b in source.read(p))
        assert rows == 5

    def test_close_is_idempotent(self, source_options: dict[str, Any], tmp_path: Path) -> None:
        src = self.make_source(source_options, tmp_path / "s2")
        src.close()
        src.close()

    @pytest.mark.slow
    @pytest.mark.parametrize("crash", [*CRASH_POINTS, "random-kills"])
    def test_kill_and_restart_loses_nothing(
        self, crash: str, source_options: dict[str, Any], seed: Callable[[int], None], tmp_path: Path
    ) -> None:
        from headrace.connectors.files import read_files

        seed(self.seed_rows)
        out = tmp_path / "out"
        spec = {
            "source": {"format": self.connector, "options": source_options},
            "sink": {"format": "files", "options": {"path": str(out), "format": "arrow"}},
            "checkpoint": str(tmp_path / "chk"),
            "trigger": {"available_now": True},
        }
        if crash == "random-kills":
            for delay in (0.4, 0.8, 1.2):
                run_pipeline(spec, kill_after=delay, timeout=self.kill_timeout)
        else:
            first = run_pipeline(spec, crash=f"{crash}:0", timeout=self.kill_timeout)
            if not first.killed and crash != "mid_write":
                first.check()
                raise AssertionError(f"the pipeline ran to the end without reaching crash point {crash}")
        run_pipeline(spec, timeout=self.kill_timeout).check()
        table = read_files(str(out), "arrow")
        keys = row_keys(table.select(sorted(table.column_names)))
        spec_ = registry().get(self.connector)
        replayable = getattr(spec_.load_source(), "replayable", False)
        assert len(set(keys)) == self.seed_rows, f"expected {self.seed_rows} distinct rows, got {len(set(keys))}"
        if replayable:
            assert len(keys) == self.seed_rows, f"{len(keys) - self.seed_rows} duplicated rows"


class SinkContract:
    """Subclass with ``connector`` and fixtures ``sink_options`` and ``read_back``.

    The input is ``rate-micro-batch`` rows ``(timestamp, value int64)``, passed through
    ``transform`` (``"module:function"``, Table -> Table) when set. ``read_back()`` returns the
    ``value`` ints the sink holds. ``supports_abort`` is False for sinks whose written rows
    cannot be taken back (at-least-once sinks).
    """

    connector: ClassVar[str] = ""
    transform: ClassVar[str | None] = None
    supports_abort: ClassVar[bool] = True
    output_mode: ClassVar[str] = "append"
    kill_rows: ClassVar[int] = 2000
    kill_rows_per_batch: ClassVar[int] = 400
    kill_timeout: ClassVar[float] = 120.0

    # -------------------------------------------------------------- helpers
    def rows(self, lo: int, hi: int) -> pa.Table:
        from headrace.connectors.rate import SCHEMA

        ts = pa.array([i * 1000 for i in range(lo, hi)], pa.int64()).cast(SCHEMA.field("timestamp").type)
        table = pa.Table.from_arrays([ts, pa.array(range(lo, hi), pa.int64())], schema=SCHEMA)
        if self.transform:
            table = _load(self.transform)(table)
        return table

    def make_sink(self, options: dict[str, Any], state: Path, query_id: str = "contract-query") -> Sink:
        spec = registry().get(self.connector)
        opts = spec.sink_options.parse(options, connector=spec.name, role="sink")
        state.mkdir(parents=True, exist_ok=True)
        ctx = SinkContext(query_id=query_id, run_id=uuid.uuid4().hex, query_name="contract",
                          output_mode=self.output_mode, state_path=str(state), schema=self.rows(0, 1).schema)  # fmt: skip
        sink: Sink = spec.load_sink()(opts, ctx)
        return sink

    def idempotent(self) -> bool:
        return bool(getattr(registry().get(self.connector).load_sink(), "idempotent_commit", False))

    def write_commit(self, sink: Sink, batch_id: int, lo: int, hi: int) -> None:
        msg = sink.write(batch_id, iter(self.rows(lo, hi).to_batches(max_chunksize=max(1, (hi - lo) // 3 or 1))))
        sink.commit(batch_id, [msg])

    def assert_values(self, got: list[int], expected: range, *, exactly_once: bool) -> None:
        counts = Counter(got)
        missing = [v for v in expected if counts[v] == 0]
        assert not missing, f"{len(missing)} values missing, e.g. {missing[:10]}"
        if exactly_once:
            dup = [v for v, n in counts.items() if n > 1]
            assert not dup, f"{len(dup)} values written more than once, e.g. {dup[:10]}"
            extra = set(counts) - set(expected)
            assert not extra, f"unexpected values {sorted(extra)[:10]}"

    # -------------------------------------------------------------- tests
    def test_discovered_through_entry_point(self) -> None:
        _discovered(self.connector)
        assert registry().get(self.connector).sink is not None

    def test_unknown_options_rejected_with_suggestion(self, sink_options: dict[str, Any]) -> None:
        spec = registry().get(self.connector)
        names = [o.name for o in spec.sink_options.options if not o.unsupported]
        _typo_rejected(names, lambda o: spec.sink_options.parse(o, connector=spec.name, role="sink"), sink_options)

    def test_write_then_commit(self, sink_options: dict[str, Any], read_back: Callable[[], list[int]], tmp_path: Path) -> None:
        sink = self.make_sink(sink_options, tmp_path / "s")
        self.write_commit(sink, 0, 0, 10)
        sink.close()
        self.assert_values(read_back(), range(10), exactly_once=True)

    def test_recommitting_a_batch_does_not_duplicate(
        self, sink_options: dict[str, Any], read_back: Callable[[], list[int]], tmp_path: Path
    ) -> None:
        first = self.make_sink(sink_options, tmp_path / "s")
        self.write_commit(first, 0, 0, 10)
        first.close()
        again = self.make_sink(sink_options, tmp_path / "s")  # a restarted query replays batch 0
        self.write_commit(again, 0, 0, 10)
        again.close()
        self.assert_values(read_back(), range(10), exactly_once=self.idempotent())

    def test_several_writers_one_commit(
        self, sink_options: dict[str, Any], read_back: Callable[[], list[int]], tmp_path: Path
    ) -> None:
        # as under Spark: one writer per task, then commit on a fresh instance
        msgs = []
        for lo, hi in ((0, 5), (5, 12)):
            w = self.make_sink(sink_options, tmp_path / "s")
            msgs.append(pickle.loads(pickle.dumps(w.write(0, iter(self.rows(lo, hi).to_batches())))))
            w.close()
        committer = self.make_sink(sink_options, tmp_path / "s")
        committer.commit(0, msgs)
        committer.close()
        self.assert_values(read_back(), range(12), exactly_once=True)

    def test_abort_discards_the_batch(
        self, sink_options: dict[str, Any], read_back: Callable[[], list[int]], tmp_path: Path
    ) -> None:
        sink = self.make_sink(sink_options, tmp_path / "s")
        self.write_commit(sink, 0, 0, 5)
        msg = sink.write(1, iter(self.rows(100, 110).to_batches()))
        sink.abort(1, [msg])
        sink.close()
        got = read_back()
        self.assert_values(got, range(5), exactly_once=self.supports_abort)
        if self.supports_abort:
            assert not set(got) & set(range(100, 110)), "aborted rows became visible"

    def test_empty_batch(self, sink_options: dict[str, Any], read_back: Callable[[], list[int]], tmp_path: Path) -> None:
        sink = self.make_sink(sink_options, tmp_path / "s")
        self.write_commit(sink, 0, 0, 3)
        sink.commit(1, [sink.write(1, iter([]))])
        sink.close()
        self.assert_values(read_back(), range(3), exactly_once=True)

    def test_close_is_idempotent(self, sink_options: dict[str, Any], tmp_path: Path) -> None:
        sink = self.make_sink(sink_options, tmp_path / "s")
        sink.close()
        sink.close()

    @pytest.mark.slow
    @pytest.mark.parametrize("crash", [*CRASH_POINTS, "random-kills"])
    def test_kill_and_restart_loses_nothing(
        self, crash: str, sink_options: dict[str, Any], read_back: Callable[[], list[int]], tmp_path: Path
    ) -> None:
        spec: dict[str, Any] = {
            # two partitions: each batch reaches the sink as two record batches, so mid_write is hit
            "source": {"format": "rate-micro-batch",
                       "options": {"rowsPerBatch": self.kill_rows_per_batch, "totalRows": self.kill_rows,
                                   "numPartitions": 2}},
            "transform": self.transform,
            "sink": {"format": self.connector, "options": sink_options},
            "checkpoint": str(tmp_path / "chk"),
            "name": "contract",
            "output_mode": self.output_mode,
            "trigger": {"available_now": True},
        }  # fmt: skip
        if crash == "random-kills":
            for delay in (0.5, 1.0, 1.5):
                run_pipeline(spec, kill_after=delay, timeout=self.kill_timeout)
        else:
            first = run_pipeline(spec, crash=f"{crash}:1", timeout=self.kill_timeout)
            assert first.killed, f"crash point {crash} was not reached:\n{first.stderr[-2000:]}"
        run_pipeline(spec, timeout=self.kill_timeout).check()
        self.assert_values(read_back(), range(self.kill_rows), exactly_once=self.idempotent())
