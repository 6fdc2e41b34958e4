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
a did-you-mean, offsets that survive a JSON round trip, empty ranges, the read limit, range
boundaries (``[a,b) + [b,c) == [a,c)``, no row read twice or lost at ``b``, no partition
reading past its end), deterministic replay, picklable partitions and commit messages, the
available-now cap, kill-and-restart (SIGKILL at every engine crash point, at the connector's
own crash points found by tracing a run, and at random moments timed from a measured run, each
checked to have landed; then a clean run) with every row exactly once for exactly-once pairs and
at least once otherwise, rows invisible until commit, idempotent re-commit of a batch id across
runs, several writers committing one batch, abort, empty batches, and a clean, idempotent
``close``. Every failure says what is wrong and where (offsets, batch, crash point).

Kill tests are marked ``slow`` and ``headrace_kill`` (registered by the kit's pytest plugin):
``pytest -m "not slow"`` skips them.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import pickle
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

import pyarrow as pa
import pytest

from headrace.errors import OptionsError
from headrace.options import suggest
from headrace.plugins import ENTRY_POINT_GROUP, registry
from headrace.protocols import Offset, ReadLimit, Sink, SinkContext, Source, SourceContext
from headrace.testing._kills import (
    CRASH_POINTS,
    connector_points,
    kill_at_point,
    landed,
    measured_run,
    random_kills,
)
from headrace.testing._pipeline import PipelineResult, _load, run_pipeline

__all__ = ["CRASH_POINTS", "SinkContract", "SourceContract", "row_keys"]

KILLS = [*CRASH_POINTS, "connector-points", "random-kills"]


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


def _first(keys: Sequence[str], n: int = 3) -> str:
    return ", ".join(sorted(keys)[:n])


def _kill_marks(fn: Callable[..., Any]) -> Callable[..., Any]:
    return pytest.mark.slow(pytest.mark.headrace_kill(fn))


class SourceContract:
    """Subclass with ``connector``, and fixtures ``source_options`` and ``seed``.

    ``source_options`` must make a new stream start at the beginning of the (initially empty)
    stream, so seeded rows are all read (e.g. ``startingOffsets=earliest``). Rows seeded must be
    distinct. ``limit`` must split ``seed_rows`` rows into three batches or more (the kill tests
    run the pipeline with it as the source's read limit).
    """

    connector: ClassVar[str] = ""
    limit: ClassVar[ReadLimit] = ReadLimit(max_rows=10)
    seed_rows: ClassVar[int] = 30
    kill_timeout: ClassVar[float] = 120.0
    random_kills: ClassVar[int] = 2

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

    def read_to_end(self, src: Source, start: Offset, limit: ReadLimit) -> Offset:
        end = start
        for _ in range(1000):
            nxt = src.latest_offset(end, limit)
            if nxt == end:
                break
            end = nxt
        return end

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
        assert json.loads(json.dumps(start)) == start, f"initial_offset() {start!r} does not survive JSON"
        end = source.latest_offset(start, ReadLimit.all_available())
        assert json.loads(json.dumps(end)) == end, f"latest_offset() {end!r} does not survive JSON"

    def test_empty_range_has_no_partitions(self, source: Source, seed: Callable[[int], None]) -> None:
        start = source.initial_offset()
        assert list(source.partitions(start, start)) == [], f"partitions({start}, {start}) of an empty range is not []"
        seed(3)
        end = source.latest_offset(start, ReadLimit.all_available())
        assert list(source.partitions(end, end)) == [], f"partitions({end}, {end}) of an empty range is not []"

    def test_ranges_are_associative_and_replay_is_deterministic(self, source: Source, seed: Callable[[int], None]) -> None:
        n = self.seed_rows
        seed(n)
        a = source.initial_offset()
        b = source.latest_offset(a, self.limit)
        assert b != a, f"latest_offset({a}, {self.limit}) returned its start although {n} rows were seeded"
        c = self.read_to_end(source, b, ReadLimit.all_available())
        # each partition of [a, c) on its own: partitions must not overlap (read past their end)
        parts = list(source.partitions(a, c))
        got = [set(row_keys(pa.Table.from_batches(list(source.read(p)), schema=source.schema))) for p in parts]
        for j in range(len(parts)):
            for i in range(j):
                both_ = got[i] & got[j]
                if not both_:
                    continue
                if len(both_) == len(got[j]) or len(both_) == len(got[i]):
                    raise AssertionError(
                        f"a partition read past its end: partition {i} ({parts[i]!r}) and partition {j} "
                        f"({parts[j]!r}) of [{a}, {c}) both returned {len(both_)} rows (e.g. {_first(list(both_))}); "
                        "read() must stop at the partition's end offset"
                    )
                raise AssertionError(
                    f"off-by-one at the range boundary between partition {i} ({parts[i]!r}) and partition {j} "
                    f"({parts[j]!r}) of [{a}, {c}): {len(both_)} row(s) read by both (e.g. {_first(list(both_))}); "
                    "a partition's end offset is exclusive, its start inclusive"
                )
        ab, bc, ac = self.read_range(source, a, b), self.read_range(source, b, c), self.read_range(source, a, c)
        kab, kbc, kac = Counter(row_keys(ab)), Counter(row_keys(bc)), Counter(row_keys(ac))
        both = kab & kbc
        if both and bc.num_rows and sum(both.values()) == bc.num_rows:
            raise AssertionError(
                f"a partition read past its end: reading [{a}, {b}) returned all {bc.num_rows} rows of the next "
                f"range [{b}, {c}) too (e.g. {_first(list(both))}); read() must stop at the partition's end offset {b}"
            )
        if both:
            raise AssertionError(
                f"off-by-one at the range boundary {b}: {sum(both.values())} row(s) read both in [{a}, {b}) and in "
                f"[{b}, {c}) (e.g. {_first(list(both))}); the end offset of a range is exclusive, the start inclusive"
            )
        lost = kac - (kab + kbc)
        if lost:
            raise AssertionError(
                f"off-by-one at the range boundary {b}: {sum(lost.values())} row(s) of [{a}, {c}) are in neither "
                f"[{a}, {b}) nor [{b}, {c}) (e.g. {_first(list(lost))}); the end offset of a range is exclusive, "
                "the start inclusive"
            )
        extra = (kab + kbc) - kac
        assert not extra, f"[{a}, {b}) + [{b}, {c}) returned rows that [{a}, {c}) did not: {_first(list(extra))}"
        if ab.num_rows >= n:
            raise AssertionError(
                f"the read limit is ignored: latest_offset({a}, {self.limit}) returned {b}, a batch of all "
                f"{ab.num_rows} seeded rows; the limit must split {n} rows into several batches (check `limit` "
                "fits this source if it is meant to)"
            )
        assert ac.num_rows == n, f"[{a}, {c}) holds {ac.num_rows} rows, but {n} were seeded"
        assert len(kac) == n, f"[{a}, {c}) holds {n - len(kac)} duplicate rows"
        again = self.read_range(source, a, c)
        assert row_keys(again) == row_keys(ac), f"reading [{a}, {c}) twice gave different rows: replay is not deterministic"
        seed(5)
        after = self.read_range(source, a, c)
        late = Counter(row_keys(after)) - kac
        if late:
            raise AssertionError(
                f"a partition read past its end: re-reading [{a}, {c}) after 5 more rows were seeded returned "
                f"{sum(late.values())} of them (e.g. {_first(list(late))}); read() must stop at the range's end offset"
            )

    def test_partitions_are_picklable(self, source: Source, seed: Callable[[int], None]) -> None:
        seed(5)
        a = source.initial_offset()
        end = source.latest_offset(a, ReadLimit.all_available())
        parts = list(source.partitions(a, end))
        assert parts, f"partitions({a}, {end}) is empty although 5 rows were seeded"
        for k, p in enumerate(parts):
            _picklable(p, f"partition {k} of [{a}, {end}) from partitions()",
                       "the engine reads partitions in threads and headrace.spark ships them to executors: keep "
                       "offsets and names in it, and open connections in read()")  # fmt: skip
        copies = pickle.loads(pickle.dumps(parts))
        rows = sum(b.num_rows for p in copies for b in source.read(p))
        assert rows == 5, f"reading unpickled copies of the partitions of [{a}, {end}) gave {rows} rows, not 5"

    def test_available_now_stops_at_what_was_there(self, source: Source, seed: Callable[[int], None]) -> None:
        n = self.seed_rows
        seed(n)
        a = source.initial_offset()
        if not source.prepare_for_available_now():
            pytest.skip("the source does not support available-now (prepare_for_available_now() returned False): "
                        "the engine runs one unlimited batch instead")  # fmt: skip
        seed(7)  # arrives after the available-now run started
        c = self.read_to_end(source, a, self.limit)
        got = self.read_range(source, a, c).num_rows
        if got > n:
            raise AssertionError(
                f"the available-now cap is ignored: after prepare_for_available_now() the source read {got} rows, "
                f"{got - n} of them seeded after it was called (offsets {a} .. {c}); an available-now run must "
                "stop at what was available when it started"
            )
        assert got == n, f"an available-now run read {got} of the {n} rows present at its start (offsets {a} .. {c})"

    def test_close_is_idempotent(self, source_options: dict[str, Any], tmp_path: Path) -> None:
        src = self.make_source(source_options, tmp_path / "s2")
        src.close()
        src.close()

    # -------------------------------------------------------------- kill tests
    def kill_spec(self, source_options: dict[str, Any], tmp_path: Path) -> dict[str, Any]:
        return {
            "source": {"format": self.connector, "options": source_options},
            "transform": "headrace.testing._pipeline:split_rows",  # so every batch passes mid_write
            "sink": {"format": "files", "options": {"path": str(tmp_path / "out"), "format": "arrow"}},
            "checkpoint": str(tmp_path / "chk"),
            "trigger": {"available_now": True},
            "read_limit": {k: v for k, v in dataclasses.asdict(self.limit).items() if v is not None},
        }

    @_kill_marks
    @pytest.mark.parametrize("crash", KILLS)
    def test_kill_and_restart_loses_nothing(
        self, crash: str, source_options: dict[str, Any], seed: Callable[[int], None], tmp_path: Path
    ) -> None:
        from headrace.connectors.files import read_files

        seed(self.seed_rows)
        spec = self.kill_spec(source_options, tmp_path)
        runs = _kills(spec, crash, self.random_kills, self.kill_timeout, batch=0)
        run_pipeline(spec, timeout=self.kill_timeout).check()
        table = read_files(str(tmp_path / "out"), "arrow")
        keys = row_keys(table.select(sorted(table.column_names)))
        replayable = getattr(registry().get(self.connector).load_source(), "replayable", False)
        where = landed(runs)
        assert len(set(keys)) == self.seed_rows, (
            f"after kills ({where}) and a clean run the output holds {len(set(keys))} distinct rows, "
            f"not the {self.seed_rows} seeded"
        )
        if replayable:
            assert len(keys) == self.seed_rows, f"after kills ({where}): {len(keys) - self.seed_rows} duplicated rows"


def _picklable(obj: Any, what: str, why: str) -> None:
    try:
        pickle.loads(pickle.dumps(obj))
    except Exception as e:
        raise AssertionError(f"{what} cannot be pickled ({type(obj).__name__}: {type(e).__name__}: {e}); {why}") from None


def _kills(spec: dict[str, Any], crash: str, n_random: int, timeout: float, *, batch: int) -> list[PipelineResult]:
    if crash == "random-kills":
        return random_kills(spec, n_random, timeout=timeout)
    if crash == "connector-points":
        measured, _ = measured_run(spec, timeout=timeout)
        points = connector_points(measured)
        if not points:
            pytest.skip("the connector marks no crash points of its own (headrace.engine.crash.crash_point) in the "
                        "traced run; mark one between every two steps of a commit that must happen together")  # fmt: skip
        runs = [measured]
        for k, (point, first) in enumerate(points):
            # the connector's own count (a batch id, or e.g. a segment number) one step on per kill
            at = first + 1 + k
            runs.append(kill_at_point(spec, point, at, timeout=timeout,
                                      why=f"It was passed with {first} in batch 0 of a traced run; the run after "
                                          f"must pass it with {at}."))  # fmt: skip
        return runs
    return [kill_at_point(spec, crash, batch, timeout=timeout)]


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
    random_kills: ClassVar[int] = 3

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
        _picklable(msg, f"the commit message of write({batch_id})", "commit may run in another process (under Spark)")
        sink.commit(batch_id, [msg])

    def assert_values(self, got: list[int], expected: range, *, exactly_once: bool, context: str = "") -> None:
        counts = Counter(got)
        where = f"{context}: " if context else ""
        missing = [v for v in expected if counts[v] == 0]
        assert not missing, f"{where}{len(missing)} values missing, e.g. {missing[:10]}"
        if exactly_once:
            dup = [v for v, n in counts.items() if n > 1]
            assert not dup, f"{where}{len(dup)} values written more than once, e.g. {sorted(dup)[:10]}"
            extra = set(counts) - set(expected)
            assert not extra, f"{where}unexpected values {sorted(extra)[:10]}"

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
        self.assert_values(read_back(), range(10), exactly_once=True, context="write() then commit() of batch 0")

    def test_rows_invisible_until_commit(
        self, sink_options: dict[str, Any], read_back: Callable[[], list[int]], tmp_path: Path
    ) -> None:
        if not self.supports_abort:
            pytest.skip("at-least-once sink (supports_abort = False): rows may become visible in write()")
        sink = self.make_sink(sink_options, tmp_path / "s")
        msg = sink.write(0, iter(self.rows(0, 10).to_batches()))
        early = read_back()
        if early:
            raise AssertionError(
                f"rows written before commit: {len(early)} rows were visible after write() and before commit(); "
                "write() must only stage (a crash before commit would leave them, and abort could not take them "
                "back). Stage them, return what commit needs in the message, and make them visible in commit(); "
                "or, for an at-least-once sink, set supports_abort = False in the test class"
            )
        sink.commit(0, [msg])
        sink.close()
        self.assert_values(read_back(), range(10), exactly_once=True, context="commit() after write()")

    def test_recommitting_a_batch_does_not_duplicate(
        self, sink_options: dict[str, Any], read_back: Callable[[], list[int]], tmp_path: Path
    ) -> None:
        first = self.make_sink(sink_options, tmp_path / "s")
        self.write_commit(first, 0, 0, 10)
        if self.idempotent():
            self.write_commit(first, 0, 0, 10)  # the same run commits batch 0 again
            dup = [v for v, k in Counter(read_back()).items() if k > 1]
            if dup:
                raise AssertionError(
                    f"replay not skipped: committing batch 0 a second time wrote its rows again ({len(dup)} values "
                    "twice); an idempotent_commit sink must record the batch ids it committed (keyed by "
                    "context.query_id) and skip a batch id it has already committed"
                )
        first.close()
        again = self.make_sink(sink_options, tmp_path / "s")  # a restarted query (same query_id, new run_id)
        self.write_commit(again, 0, 0, 10)
        again.close()
        got = read_back()
        if self.idempotent() and any(k > 1 for k in Counter(got).values()):
            raise AssertionError(
                "bookkeeping keyed by the run: re-committing batch 0 from a restarted run of the same query "
                "(same context.query_id, new context.run_id) wrote its rows again, although re-committing from the "
                "same run did not; key the record of committed batches by context.query_id and the batch id, never "
                "by run_id (it changes at every restart)"
            )
        self.assert_values(got, range(10), exactly_once=self.idempotent(), context="batch 0 committed by two runs")

    def test_several_writers_one_commit(
        self, sink_options: dict[str, Any], read_back: Callable[[], list[int]], tmp_path: Path
    ) -> None:
        # as under Spark: one writer per task, then commit on a fresh instance
        msgs = []
        for lo, hi in ((0, 5), (5, 12)):
            w = self.make_sink(sink_options, tmp_path / "s")
            msg = w.write(0, iter(self.rows(lo, hi).to_batches()))
            _picklable(msg, "a commit message", "under Spark, write() runs in an executor and commit() on the driver")
            msgs.append(pickle.loads(pickle.dumps(msg)))
            w.close()
        committer = self.make_sink(sink_options, tmp_path / "s")
        committer.commit(0, msgs)
        committer.close()
        got = read_back()
        if sorted(set(got)) == list(range(5)):
            raise AssertionError(
                "only the first writer's message committed: commit(0, messages) got the messages of 2 writers "
                "(rows 0-4 and 5-11, as two Spark tasks send) but made only the first one's rows visible; commit "
                "must apply every message"
            )
        self.assert_values(got, range(12), exactly_once=True, context="two writers, one commit")

    def test_abort_discards_the_batch(
        self, sink_options: dict[str, Any], read_back: Callable[[], list[int]], tmp_path: Path
    ) -> None:
        sink = self.make_sink(sink_options, tmp_path / "s")
        self.write_commit(sink, 0, 0, 5)
        msg = sink.write(1, iter(self.rows(100, 110).to_batches()))
        sink.abort(1, [msg])
        sink.close()
        got = read_back()
        self.assert_values(got, range(5), exactly_once=self.supports_abort, context="batch 0 committed, batch 1 aborted")
        if self.supports_abort:
            assert not set(got) & set(range(100, 110)), "aborted rows became visible: abort() must discard what write() staged"

    def test_empty_batch(self, sink_options: dict[str, Any], read_back: Callable[[], list[int]], tmp_path: Path) -> None:
        sink = self.make_sink(sink_options, tmp_path / "s")
        self.write_commit(sink, 0, 0, 3)
        sink.commit(1, [sink.write(1, iter([]))])
        sink.close()
        self.assert_values(read_back(), range(3), exactly_once=True, context="an empty batch 1 after batch 0")

    def test_close_is_idempotent(self, sink_options: dict[str, Any], tmp_path: Path) -> None:
        sink = self.make_sink(sink_options, tmp_path / "s")
        sink.close()
        sink.close()

    # -------------------------------------------------------------- kill tests
    def kill_spec(self, sink_options: dict[str, Any], tmp_path: Path) -> dict[str, Any]:
        return {
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

    @_kill_marks
    @pytest.mark.parametrize("crash", KILLS)
    def test_kill_and_restart_loses_nothing(
        self, crash: str, sink_options: dict[str, Any], read_back: Callable[[], list[int]], tmp_path: Path
    ) -> None:
        spec = self.kill_spec(sink_options, tmp_path)
        runs = _kills(spec, crash, self.random_kills, self.kill_timeout, batch=1)
        run_pipeline(spec, timeout=self.kill_timeout).check()
        what = f"after SIGKILLs ({landed(runs)}) and a restart"
        if crash == "connector-points":
            what += (": the steps of commit around these crash points are not atomic (e.g. rows and the record "
                     "of the committed batch in separate transactions); commit them in one transaction")  # fmt: skip
        self.assert_values(read_back(), range(self.kill_rows), exactly_once=self.idempotent(), context=what)
