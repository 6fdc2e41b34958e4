"""The harness itself, without Spark: the comparison catches what it must (and only that), the
generator covers the edge cases it promises, the same seed gives the same input."""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from tests.conformance.catalogue import CATALOGUE, KNOWN
from tests.conformance.generator import DELAY_S, SCHEMA, generate
from tests.conformance.harness import QuerySpec, Run, Step, compare, rows_of

SPEC = QuerySpec("t", (Step("where", ("true",)),))
TS = pa.timestamp("us", tz="UTC")


def _run(engine: str, tables: dict[int, pa.Table], progress: dict[int, dict] | None = None) -> Run:
    return Run(
        engine, tables, progress or {b: {"batchId": b, "numInputRows": t.num_rows} for b, t in tables.items()}
    )


def _table(ts: list, v: list, k: list | None = None, ts_type: pa.DataType = TS) -> pa.Table:
    return pa.table({"ts": pa.array(ts, ts_type), "v": pa.array(v, pa.float64()),
                     "k": pa.array(k or ["a"] * len(ts), pa.string())})  # fmt: skip


T = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def test_identical_runs_compare_identical_whatever_the_row_order_and_representation() -> None:
    a = _table([T, T + dt.timedelta(seconds=1)], [1.0, float("nan")], ["a", None])
    # other row order, large_string, naive-UTC milliseconds: the same rows
    b = pa.table({"ts": pa.array([T.replace(tzinfo=None) + dt.timedelta(seconds=1), T.replace(tzinfo=None)],
                                 pa.timestamp("ms")),
                  "v": pa.array([float("nan"), 1.0 + 1e-12]), "k": pa.array([None, "a"], pa.large_string())})  # fmt: skip
    assert compare(SPEC, 0, _run("spark", {0: a}), _run("headrace", {0: b})).identical


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        pytest.param(lambda t: t.set_column(1, "v", pc.add(t["v"], 1e-6)), "batch 0 rows", id="float-beyond-1e-9"),
        pytest.param(lambda t: t.set_column(0, "ts", pc.add(t["ts"], pa.scalar(1, pa.duration("us")))), "batch 0 rows",
                     id="timestamp-one-microsecond"),
        pytest.param(lambda t: t.slice(0, 1), "batch 0 rows: 2 on spark, 1 on headrace", id="row-missing"),
        pytest.param(lambda t: pa.concat_tables([t, t.slice(0, 1)]), "batch 0 rows", id="row-duplicated"),
        pytest.param(lambda t: t.rename_columns(["ts", "v", "key"]), "columns", id="column-renamed"),
        pytest.param(lambda t: t.set_column(1, "v", pc.cast(t["v"], pa.float32())), "columns", id="column-type"),
        pytest.param(lambda t: t.set_column(1, "v", pa.array([1.0, 0.0])), "batch 0 rows", id="nan-is-not-zero"),
    ],
)  # fmt: skip
def test_each_kind_of_difference_is_reported(change: Callable[[pa.Table], pa.Table], expected: str) -> None:
    a = _table([T, T + dt.timedelta(seconds=1)], [1.0, float("nan")])
    outcome = compare(SPEC, 7, _run("spark", {0: a}), _run("headrace", {0: change(a)}))
    assert not outcome.identical
    assert any(d.startswith(expected) for d in outcome.differences), outcome.differences
    assert "seed 7" in outcome.report()


def test_batch_ids_and_progress_fields_are_compared() -> None:
    a = _table([T], [1.0])
    ops = [{"numRowsTotal": 1, "numRowsUpdated": 1, "numRowsDroppedByWatermark": 0, "memoryUsedBytes": 10}]
    sp = {
        0: {
            "batchId": 0,
            "numInputRows": 1,
            "eventTime": {"watermark": "2026-01-01T00:00:00.000Z"},
            "stateOperators": ops,
        }
    }
    hp: dict[int, dict[str, Any]] = {
        0: {"batchId": 0, "numInputRows": 1, "eventTime": {"watermark": "2026-01-01T00:00:00.000Z"},
            "stateOperators": [dict(ops[0], memoryUsedBytes=99)]}}  # fmt: skip
    assert compare(
        SPEC, 0, _run("spark", {0: a}, sp), _run("headrace", {0: a}, hp)
    ).identical  # memory: not compared
    hp[0]["stateOperators"][0]["numRowsDroppedByWatermark"] = 2
    hp[0]["eventTime"]["watermark"] = "2026-01-01T00:00:01.000Z"
    diffs = compare(SPEC, 0, _run("spark", {0: a}, sp), _run("headrace", {0: a}, hp)).differences
    assert "batch 0 watermark_ms: spark 1767225600000, headrace 1767225601000" in diffs
    assert "batch 0 stateOperators[0].numRowsDroppedByWatermark: spark 0, headrace 2" in diffs
    extra = compare(SPEC, 0, _run("spark", {0: a}), _run("headrace", {0: a, 1: a.slice(0, 0)})).differences
    assert extra[0] == "batch ids: spark ran [0], headrace ran [0, 1]"


def test_rows_are_canonical_values() -> None:
    window = pa.array([{"start": T, "end": T + dt.timedelta(seconds=10)}],
                      pa.struct([("start", TS), ("end", TS)]))  # fmt: skip
    rows = rows_of(pa.table({"window": window, "n": [3]}))
    us = int(T.timestamp()) * 1_000_000
    assert rows == [((("start", us), ("end", us + 10_000_000)), 3)]


def test_the_same_seed_gives_the_same_input_and_others_differ() -> None:
    a, b, c = generate(5), generate(5), generate(6)
    assert repr([t.to_pylist() for t in a.batches]) == repr([t.to_pylist() for t in b.batches])
    assert repr([t.to_pylist() for t in a.batches]) != repr([t.to_pylist() for t in c.batches])


@pytest.mark.parametrize("seed", [1, 2, 3, 42, 1000])
def test_the_generator_covers_its_edge_cases(seed: int) -> None:
    data = generate(seed)
    sizes = [t.num_rows for t in data.batches]
    assert sizes[0] > 0 and 0 in sizes and 1 in sizes
    rows = [r for t in data.batches for r in t.to_pylist()]
    assert all(t.schema == SCHEMA for t in data.batches)
    values = [r["v"] for r in rows]
    assert any(v is None for v in values) and any(v is not None and math.isnan(v) for v in values)
    assert any(r["k"] is None for r in rows) and any(r["n"] is None for r in rows)
    keyed = [(r["ts"], r["id"]) for r in rows]
    assert len(set(keyed)) < len(keyed)  # duplicates
    # out of order, and late by more than the delay behind the maximum seen before
    late = 0
    top = None
    for t in data.batches:
        times = [x for x in t.column("ts").to_pylist() if x is not None]
        if top is not None:
            late += sum(x < top - dt.timedelta(seconds=DELAY_S) for x in times)
        if times:
            top = max([top, *times]) if top else max(times)
    assert late > 0


def test_every_known_difference_names_a_catalogue_case() -> None:
    ids = {c.id for c in CATALOGUE}
    assert set(KNOWN) <= ids
    assert len(ids) == len(CATALOGUE)  # ids are unique


def test_every_ci_tier_case_exists() -> None:
    """A CI tier names case ids; a misspelled one would silently run nothing."""
    from tests.conformance.conftest import CI_TIER
    from tests.conformance.test_transform_with_state import CASES as TWS_CASES
    from tests.conformance.test_two_watermarks import SPECS, UNION_SPECS

    ids = {c.id for c in CATALOGUE}
    known = {"test_conformance.py": ids, "test_spark_engine.py": ids,
             "test_two_watermarks.py": {s.id for s in [*SPECS, *UNION_SPECS]}, "test_transform_with_state.py": set(TWS_CASES)}  # fmt: skip
    for module, tier in CI_TIER.items():
        assert tier <= known[module], f"{module}: no case {sorted(tier - known[module])}"
