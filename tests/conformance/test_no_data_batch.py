"""The one difference in which batches run, against PySpark itself: when the watermark moves
after the last batch with data but closes no window (evicts no key), Spark still runs a batch
without data (its stateful operators' ``shouldRunAnotherBatch`` is "the watermark moved"), which
emits nothing; headrace runs none (``Operator.needs_batch_at``: a batch that would change nothing
is not run). Rows and every other progress field are the same; the test fails once the engines
agree (then remove ``TRAILING_NO_DATA_BATCH`` from tests/conformance/catalogue.py)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pyarrow as pa
import pytest

from tests.conformance.catalogue import TRAILING_NO_DATA_BATCH
from tests.conformance.generator import SCHEMA, STATIC_SCHEMA, Input
from tests.conformance.harness import Outcome, QuerySpec, Step, run_many, window

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
# window 10 s, delay 5 s: batch 0 at 100 s (watermark after it 95 s), batch 1 at 103 s
# (watermark 98 s): the window [100 s, 110 s) stays open, nothing is emitted or evicted
ROWS = [[(100, "a")], [(103, "a")]]
SPECS = [
    QuerySpec("tumbling", (Step("watermark", ("ts", "5 seconds")),
                           Step("group_by", ([window("ts", "10 seconds")], ["count(*) AS n"]))), mode)
    for mode in ("append", "update")
]  # fmt: skip


def _input() -> Input:
    batches = []
    for i, rows in enumerate(ROWS):
        ts = [T0 + dt.timedelta(seconds=s) for s, _ in rows]
        batches.append(pa.table({"ts": ts, "k": [k for _, k in rows], "id": [i], "v": [1.0], "n": [i]}, schema=SCHEMA))
    empty = SCHEMA.empty_table()
    return Input(0, tuple(batches), tuple(empty for _ in batches), STATIC_SCHEMA.empty_table())


@pytest.fixture(scope="module")
def outcomes(conformance_spark: Any) -> dict[str, Outcome]:
    return {o.spec.id: o for o in run_many(conformance_spark, SPECS, _input())}


@pytest.mark.parametrize("spec", SPECS, ids=[s.id for s in SPECS])
def test_spark_runs_a_batch_that_changes_nothing_headrace_does_not(spec: QuerySpec, outcomes: dict[str, Outcome]) -> None:
    outcome = outcomes[spec.id]
    assert outcome.differences == [
        "batch ids: spark ran [0, 1, 2], headrace ran [0, 1]",
        "batch 2 progress: only spark reported one",
    ], outcome.report(limit=20)
    assert all(TRAILING_NO_DATA_BATCH.explains(d) for d in outcome.differences)
