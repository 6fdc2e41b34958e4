"""The source contract suite (see :mod:`headrace.testing.contract`)."""

from __future__ import annotations

import dataclasses
import json
import pickle
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import pyarrow as pa
import pytest

from headrace.plugins import registry
from headrace.protocols import Offset, ReadLimit, Source, SourceContext
from headrace.testing._checks import (
    KILLS,
    _discovered,
    _first,
    _typo_rejected,
    kill_marks,
    picklable,
    row_keys,
    run_kills,
)
from headrace.testing._kills import (
    landed,
)
from headrace.testing._pipeline import run_pipeline

__all__ = ["SourceContract"]


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
            picklable(p, f"partition {k} of [{a}, {end}) from partitions()",
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

    @kill_marks
    @pytest.mark.parametrize("crash", KILLS)
    def test_kill_and_restart_loses_nothing(
        self, crash: str, source_options: dict[str, Any], seed: Callable[[int], None], tmp_path: Path
    ) -> None:
        from headrace.connectors.files import read_files

        seed(self.seed_rows)
        spec = self.kill_spec(source_options, tmp_path)
        # the pipeline writes into the kit's files sink: its crash points are not the source's
        runs = run_kills(spec, crash, self.random_kills, self.kill_timeout, batch=0, ignore=("files_",))
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


