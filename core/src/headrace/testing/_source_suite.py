"""The source contract suite (see :mod:`headrace.testing.contract`)."""

from __future__ import annotations

import copy
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
    baseline_batches,
    kill_marks,
    picklable,
    row_keys,
    run_kills,
)
from headrace.testing._kills import landed, seed_note
from headrace.testing._pipeline import run_pipeline

__all__ = ["SourceContract"]


def _lim(limit: ReadLimit) -> str:
    """``ReadLimit(max_rows=7)``: the limits set, for messages."""
    return "ReadLimit(" + ", ".join(f"{k}={v}" for k, v in dataclasses.asdict(limit).items() if v is not None) + ")"


def _check_schema(got: pa.Schema, declared: pa.Schema, what: str) -> None:
    if got.equals(declared, check_metadata=False):
        return
    diffs = []
    names = {f.name for f in declared}
    for f in declared:
        if f.name not in got.names:
            diffs.append(f"column {f.name!r} missing")
        elif got.field(f.name).type != f.type:
            diffs.append(f"column {f.name!r} is {got.field(f.name).type}, declared {f.type}")
        elif got.field(f.name).nullable != f.nullable:
            diffs.append(f"column {f.name!r} nullable={got.field(f.name).nullable}, declared nullable={f.nullable}")
    diffs += [f"column {n!r} not declared" for n in got.names if n not in names]
    if not diffs and got.names != declared.names:
        diffs.append(f"columns in the order {got.names}, declared {declared.names}")
    raise AssertionError(
        f"the schema of {what} differs from the source's declared schema: {'; '.join(diffs) or got}; build every "
        "record batch with schema=self.schema (an inferred schema, e.g. pa.RecordBatch.from_pylist(rows), follows "
        "the values and differs from it)"
    )


class SourceContract:
    """Subclass with ``connector``, and fixtures ``source_options`` and ``seed``.

    ``source_options`` must make a new stream start at the beginning of the (initially empty)
    stream, so seeded rows are all read (e.g. ``startingOffsets=earliest``). Rows seeded must be
    distinct. ``limit`` must split ``seed_rows`` rows into three batches or more (the kill tests
    run the pipeline with it as the source's read limit). ``page_rows`` rows (default 5,000,
    enough to cross a few pages of typical clients) are seeded for the paging test.
    """

    connector: ClassVar[str] = ""
    limit: ClassVar[ReadLimit] = ReadLimit(max_rows=10)
    seed_rows: ClassVar[int] = 30
    page_rows: ClassVar[int] = 5000
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

    def read_range(self, src: Source, start: Offset, end: Offset, what: str = "") -> pa.Table:
        """The rows of ``[start, end)``, every record batch checked against ``src.schema``
        (``what`` names the batch in messages, e.g. ``"batch 2"``)."""
        batches = []
        for k, p in enumerate(src.partitions(start, end)):
            for b in src.read(p):
                _check_schema(b.schema, src.schema, f"{what or f'the batch [{start}, {end})'} (partition {k}: {p!r})")
                batches.append(b)
        return pa.Table.from_batches(batches, schema=src.schema) if batches else src.schema.empty_table()

    def supported_limits(self) -> list[ReadLimit]:
        """One small read limit per kind the source supports: the kinds its options map to
        (``Option(read_limit=...)``) and those set in ``limit``; values from ``limit``, else small
        (7 rows, 1 file, 1 byte)."""
        spec = registry().get(self.connector)
        kinds = {o.read_limit for o in spec.source_options.options if o.read_limit}
        kinds |= {k for k, v in dataclasses.asdict(self.limit).items() if v is not None}
        small = {"max_rows": 7, "max_files": 1, "max_bytes": 1}
        return [ReadLimit(**{k: getattr(self.limit, k) or small[k]}) for k in sorted(kinds) if k in small]

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
        assert b != a, f"latest_offset({a}, {_lim(self.limit)}) returned its start although {n} rows were seeded"
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
                f"the read limit is ignored: latest_offset({a}, {_lim(self.limit)}) returned {b}, a batch of all "
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

    def test_every_read_limit_is_exact(self, source: Source, source_options: dict[str, Any], seed: Callable[[int], None],
                                       tmp_path: Path) -> None:  # fmt: skip
        """For each read limit the source supports: batches of at most the limit (all partitions
        together), more than zero rows while rows are left, every seeded row once, offsets that
        survive JSON and a restart (a new source instance goes on from them), ``start`` unchanged."""
        limits = self.supported_limits()
        if not limits:
            pytest.skip("the source declares no read limit (no option with read_limit=..., and `limit` sets none)")
        n = self.seed_rows
        start = source.initial_offset()
        src = source
        for limit in limits:
            seed(n)
            seen: Counter[str] = Counter()
            a, k, restarted = start, 0, False
            for _ in range(20 * n + 20):
                before = copy.deepcopy(a)
                b = src.latest_offset(a, limit)
                if a != before:
                    raise AssertionError(
                        f"latest_offset changed its start argument: latest_offset({before}, {_lim(limit)}) left it as {a}; "
                        "return a new offset and never modify the one passed in (the engine keeps it as the start "
                        "of the batch, in the offsets log)"
                    )
                assert json.loads(json.dumps(b)) == b, f"latest_offset({a}, {_lim(limit)}) returned {b!r}: it does not survive JSON"
                if b == a:
                    break
                rows = self.read_range(src, a, b, what=f"batch {k} [{a}, {b}) under {_lim(limit)}")
                keys = row_keys(rows)
                if limit.max_rows is not None and rows.num_rows > limit.max_rows:
                    raise AssertionError(
                        f"batch {k} read {rows.num_rows} rows under a limit of {limit.max_rows} (latest_offset({a}, "
                        f"{_lim(limit)}) returned {b}; rows {_first(keys)}...); a batch holds at most max_rows rows: of "
                        "all its partitions (streams, shards) together, and its end offset never rounded past the limit"
                    )
                seen.update(keys)
                if rows.num_rows == 0 and sum(seen.values()) < n:
                    # an empty batch may be real (e.g. a commit without rows), but not twice in a row
                    c = src.latest_offset(b, limit)
                    if c != b and self.read_range(src, b, c).num_rows == 0:
                        raise AssertionError(
                            f"batches {k} [{a}, {b}) and {k + 1} [{b}, {c}) read 0 rows under {_lim(limit)} although "
                            f"{n - sum(seen.values())} seeded rows were left: a batch must hold rows while rows are left"
                        )
                a, k = json.loads(json.dumps(b)), k + 1
                if k == 2 and not restarted:  # a restart: a new instance goes on from the offset in the log
                    restarted = True
                    if src is not source:
                        src.close()
                    src = self.make_source(source_options, tmp_path / "state")
            dup = [r for r, c in seen.items() if c > 1]
            assert not dup, f"under {_lim(limit)}, {len(dup)} rows were read by two batches (e.g. {_first(dup)})"
            if sum(seen.values()) != n:
                raise AssertionError(
                    f"under {_lim(limit)}, the batches from {start} to {a} read {sum(seen.values())} rows, but {n} were seeded "
                    f"(after a restart at batch 2 from the JSON round trip of its offset): latest_offset stopped "
                    "advancing before all rows were read, or a restarted source resumed at the wrong place"
                )
            start = a
        if src is not source:
            src.close()

    def test_many_small_ranges_read_what_one_large_range_reads(self, source: Source, seed: Callable[[int], None]) -> None:
        """``page_rows`` rows (enough to cross a few pages of a client's reads): one range over
        all of them, and many small ones (``limit`` scaled up), each row exactly once."""
        n = self.page_rows
        seed(n)
        a = source.initial_offset()
        c = self.read_to_end(source, a, ReadLimit.all_available())
        large = self.read_range(source, a, c, what=f"the one range [{a}, {c})")
        counts = Counter(row_keys(large))
        dup = sorted(r for r, k in counts.items() if k > 1)
        if dup:
            raise AssertionError(
                f"reading [{a}, {c}) in one range returned {len(dup)} of the {n} seeded rows twice (e.g. {_first(dup)}): "
                "a read that pages through its range re-reads the entry at a page boundary; start each page after "
                "the last entry of the one before (exclusive)"
            )
        if len(counts) != n:
            raise AssertionError(
                f"reading [{a}, {c}) in one range returned {len(counts)} distinct rows, not the {n} seeded: a read "
                "that pages through its range skips entries at page boundaries, or stops after its first page"
            )
        scale = max(1, n // (self.seed_rows * 6))  # ranges of a sixth of the kill tests' batches: about 20
        small = ReadLimit(**{k: (v * scale if v is not None and k in ("max_rows", "max_files", "max_bytes") else v)
                             for k, v in dataclasses.asdict(self.limit).items()})  # fmt: skip
        got: Counter[str] = Counter()
        lo, ranges = a, 0
        for _ in range(10_000):
            hi = source.latest_offset(lo, small)
            if hi == lo:
                break
            part = Counter(row_keys(self.read_range(source, lo, hi, what=f"small range {ranges} [{lo}, {hi})")))
            both = got & part
            if both:
                raise AssertionError(
                    f"small range {ranges} [{lo}, {hi}) under {_lim(small)} re-read {sum(both.values())} row(s) of the ranges "
                    f"before it (e.g. {_first(list(both))}): the start offset of a range is inclusive, its end exclusive"
                )
            got += part
            lo, ranges = hi, ranges + 1
        lost, extra = counts - got, got - counts
        if lost or extra:
            raise AssertionError(
                f"{ranges} small ranges from {a} to {lo} under {_lim(small)} read {sum(got.values())} rows, the one range "
                f"[{a}, {c}) {n}: {sum(lost.values())} only in the large one (e.g. {_first(list(lost))}), "
                f"{sum(extra.values())} only in the small ones (e.g. {_first(list(extra))})"
            )

    def test_commit_releases_only_what_is_before_its_end(self, source: Source, seed: Callable[[int], None]) -> None:
        """The engine plans and reads batches ahead of the one it commits: ``commit(b)`` must
        leave every row at or after ``b`` readable."""
        seed(self.seed_rows)
        a = source.initial_offset()
        b = source.latest_offset(a, self.limit)
        c = self.read_to_end(source, b, self.limit)
        self.read_range(source, a, b)
        ahead = Counter(row_keys(self.read_range(source, b, c)))
        source.commit(b)
        after = Counter(row_keys(self.read_range(source, b, c)))
        lost = ahead - after
        if lost:
            raise AssertionError(
                f"Source.commit({b}) deleted data at or after its end: [{b}, {c}), planned before the commit, held "
                f"{sum(ahead.values())} rows before commit({b}) and {sum(after.values())} after (lost e.g. "
                f"{_first(list(lost))}); the engine plans and reads the batches after a batch before it commits "
                "it, so commit(end) may release (acknowledge, delete) only what is before end"
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

    def test_pruned_read_gives_the_same_rows(self, source: Source, seed: Callable[[int], None]) -> None:
        """``prune_columns``: a pruned read yields every column or exactly the ones asked for (in
        the schema's order, with its types), and the same rows as a full read, projected."""
        if not source.replayable:
            pytest.skip("a source that is not replayable cannot read a range twice")
        seed(5)
        a = source.initial_offset()
        end = source.latest_offset(a, ReadLimit.all_available())
        names = source.schema.names  # after the seed: a source may infer its schema from the data
        if len(names) < 2:
            pytest.skip("a source with one column has nothing to prune")
        parts = list(source.partitions(a, end))
        full = [pa.Table.from_batches(list(source.read(p)), schema=source.schema) for p in parts]
        asked = names[1::2]  # every second column: a strict subset, not a prefix
        source.prune_columns(frozenset(asked))
        kept = pa.schema([source.schema.field(n) for n in asked])
        for k, (p, whole) in enumerate(zip(parts, full, strict=True)):
            batches = list(source.read(p))
            for b in batches:
                if b.schema.equals(source.schema, check_metadata=False):
                    continue  # the source ignores the pruning: always correct
                _check_schema(b.schema, kept, f"partition {k} ({p!r}) after prune_columns({sorted(asked)})")
            got = [b.select(asked) for b in batches]
            pruned = pa.Table.from_batches(got, schema=kept) if got else kept.empty_table()
            assert row_keys(pruned) == row_keys(whole.select(asked)), (
                f"after prune_columns({sorted(asked)}), partition {k} ({p!r}) gave other rows than a full read "
                "of it, projected; build the asked columns from the same records as a full read"
            )

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
        """A kill-free baseline run first (its loss is reported as a loss, not blamed on a kill);
        then as many rows again, the kills, a clean run, and every row of both in the files sink."""
        from headrace.connectors.files import read_files

        n = self.seed_rows
        replayable = getattr(registry().get(self.connector).load_source(), "replayable", False)
        seed(n)
        spec = self.kill_spec(source_options, tmp_path)
        baseline = run_pipeline(spec, timeout=self.kill_timeout, trace=True).check()
        first = baseline_batches(baseline)
        keys = self._output(read_files(str(tmp_path / "out"), "arrow"))
        if len(set(keys)) != n or (replayable and len(keys) != n):
            raise AssertionError(
                f"the kill-free baseline run lost rows: with no kill, its {first} batches wrote {len(set(keys))} "
                f"distinct rows ({len(keys)} in all) of the {n} seeded; the loss is not a kill's. Look for data "
                "released upstream too early (Source.commit(end) deleting or acknowledging at or after end: the "
                "engine plans and reads later batches before it commits earlier ones), or a read limit that skips rows"
            )
        seed(n)  # the kill runs go on with the same query, from batch `first`
        # the pipeline writes into the kit's files sink: its crash points are not the source's
        runs = run_kills(spec, crash, self.random_kills, self.kill_timeout, batch=first, ignore=("files_",))
        run_pipeline(spec, timeout=self.kill_timeout).check()
        keys = self._output(read_files(str(tmp_path / "out"), "arrow"))
        where = landed(runs)
        if crash == "random-kills":
            where += f"; {seed_note()}"
        assert len(set(keys)) == 2 * n, (
            f"after kills ({where}) and a clean run the output holds {len(set(keys))} distinct rows, "
            f"not the {2 * n} seeded (the kill-free baseline run before them wrote all of its {n})"
        )
        if replayable:
            assert len(keys) == 2 * n, f"after kills ({where}): {len(keys) - 2 * n} duplicated rows"

    @staticmethod
    def _output(table: pa.Table) -> list[str]:
        return row_keys(table.select(sorted(table.column_names)))
