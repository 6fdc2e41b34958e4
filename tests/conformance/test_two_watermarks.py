"""Spark's two watermarks per batch (since Spark 3.4), against PySpark itself: input rows are
dropped as late by the previous batch's watermark (``eventTimeWatermarkForLateEvents``) while
windows are emitted and state evicted by the current one (``eventTimeWatermarkForEviction``);
``numRowsDroppedByWatermark`` counts late groups after the partial aggregation; session
windows drop late rows in complete mode too and run no batch without data there.

The input is made by hand so each batch has rows between the two watermarks (kept by Spark,
dropped by a single watermark), rows behind both (dropped, several of one group), and
watermark moves that leave nothing to emit. A second input, two streams of a union with a
watermark each, checks ``spark.sql.streaming.multipleWatermarkPolicy`` (min and max).
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

import pyarrow as pa
import pytest

from tests.conformance.conftest import selected_cases
from tests.conformance.generator import SCHEMA, STATIC_SCHEMA, Input
from tests.conformance.harness import Outcome, QuerySpec, Step, run_many, session_window, window

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
_WM = Step("watermark", ("ts", "5 seconds"))
_TUMBLE = window("ts", "10 seconds")
_SLIDE = window("ts", "10 seconds", "5 seconds")
_SESSION = session_window("ts", "4 seconds")


def _batch(rows: list[tuple[float, str | None]], first_id: int) -> pa.Table:
    ts = [T0 + dt.timedelta(seconds=s) for s, _ in rows]
    ids = list(range(first_id, first_id + len(rows)))
    return pa.table({"ts": ts, "k": [k for _, k in rows], "id": ids, "v": [float(i) for i in ids], "n": ids},
                    schema=SCHEMA)  # fmt: skip


#: the rows of each batch: (seconds after T0, key)
Rows = list[list[tuple[float, str | None]]]

# (seconds after T0, key) per batch; watermark after each batch (delay 5 s): 96, 115, 125, 125
BATCHES: Rows = [
    [(100, "a"), (101, "b")],
    # 85, 86: behind the new watermark (96) but not the previous one (0): kept, emitted at once
    [(85, "a"), (86, "a"), (97, "b"), (120, "a")],
    # 88 x3 (one group) and 91: behind the previous batch's watermark (96 >= their window's
    # end 90? no: 91's tumbling window ends at 100): 88s are late, 91 is kept; 95, 96 kept
    [(88, "a"), (88, "a"), (88, "a"), (91, "b"), (95, "a"), (96, "b"), (130, "b")],
    # duplicates of earlier rows, one late by both watermarks, one only by the current one
    [(100, "a"), (120, "a"), (126, "a"), (126, "a")],
]


def _input() -> Input:
    batches, next_id = [], 1
    for rows in BATCHES:
        batches.append(_batch(rows, next_id))
        next_id += len(rows)
    empty = SCHEMA.empty_table()
    return Input(0, tuple(batches), tuple(empty for _ in batches), STATIC_SCHEMA.empty_table())


# the union of two watermarked streams: ``a`` (the main input, delay 5 s) runs ahead of ``b``
# (the second, delay 2 s); per batch, a's rows and b's. Their watermarks after each batch: a's
# 96, 100, 107, 120 and b's 48, 95, 99, 109 (the query's: min or max of the two); a batch's
# rows are late by the previous batch's: b's rows at 55, 58 and 96 by max only (their windows
# closed), and windows close earlier by max
UNION_A: Rows = [[(100, "a"), (101, "b")], [(105, "a")], [(112, "b")], [(125, "a")]]
UNION_B: Rows = [
    [(50, "a"), (45, "b")],
    [(55, "a"), (93, "b"), (97, "a")],
    [(99, "b"), (101, "a"), (58, "b")],
    [(103, "a"), (111, "b"), (96, "a")],
]


def _union_input() -> Input:
    first, next_id = [], 1
    for rows in UNION_A:
        first.append(_batch(rows, next_id))
        next_id += len(rows)
    second = []
    for rows in UNION_B:
        second.append(_batch(rows, next_id))
        next_id += len(rows)
    return Input(0, tuple(first), tuple(second), STATIC_SCHEMA.empty_table())


def _q(name: str, *steps: Step, mode: str = "append", conf: tuple[tuple[str, str], ...] = ()) -> QuerySpec:
    return QuerySpec(name, tuple(steps), mode, conf=conf)


SPECS = [
    *(_q("tumbling-keyed", _WM, Step("group_by", ([_TUMBLE, "k"], ["count(*) AS n", "sum(id) AS ids"])), mode=m)
      for m in ("append", "update")),
    *(_q("sliding", _WM, Step("group_by", ([_SLIDE, "k"], ["count(*) AS n"])), mode=m) for m in ("append", "update")),
    *(_q("session", _WM, Step("group_by", ([_SESSION, "k"], ["count(*) AS n", "sum(id) AS ids"])), mode=m)
      for m in ("append", "complete")),
    _q("dedup-event-time", _WM, Step("drop_duplicates", ("k", "ts"))),
    _q("dedup-within-watermark", _WM, Step("drop_duplicates_within_watermark", ("k",))),
]  # fmt: skip

# two watermarked inputs of a union, then a windowed aggregation, under each
# ``spark.sql.streaming.multipleWatermarkPolicy``: min follows the slower input, max the faster
# one (the slower input's rows behind it dropped as late)
_UNION_WM = Step("union_stream", ((Step("watermark", ("ts", "2 seconds")),),))
UNION_SPECS = [
    _q(f"union-{policy}-policy", _WM, _UNION_WM, Step("group_by", ([_TUMBLE, "k"], ["count(*) AS n", "sum(id) AS ids"])),
       mode=mode, conf=(("spark.sql.streaming.multipleWatermarkPolicy", policy),))
    for policy in ("min", "max") for mode in ("append", "update")
]  # fmt: skip


@pytest.fixture(scope="module")
def outcomes(conformance_spark: Any, request: pytest.FixtureRequest) -> dict[str, Outcome]:
    selected = selected_cases(request)
    return {o.spec.id: o for o in run_many(conformance_spark, [s for s in SPECS if s.id in selected], _input())}


@pytest.fixture(scope="module")
def union_outcomes(conformance_spark: Any, request: pytest.FixtureRequest) -> dict[str, Outcome]:
    selected = selected_cases(request)
    specs = [s for s in UNION_SPECS if s.id in selected]
    return {o.spec.id: o for o in run_many(conformance_spark, specs, _union_input())}


# differences allowed for reasons other than the watermarks (none left); anything else must be identical
OTHER: dict[str, str] = {}


@pytest.mark.parametrize("spec", SPECS, ids=[s.id for s in SPECS])
def test_same_as_spark(spec: QuerySpec, outcomes: dict[str, Outcome]) -> None:
    _check(spec, outcomes)


@pytest.mark.parametrize("spec", UNION_SPECS, ids=[s.id for s in UNION_SPECS])
def test_union_of_two_watermarked_streams_same_as_spark(
    spec: QuerySpec, union_outcomes: dict[str, Outcome]
) -> None:
    _check(spec, union_outcomes)


def _check(spec: QuerySpec, outcomes: dict[str, Outcome]) -> None:
    outcome = outcomes[spec.id]
    allowed = OTHER.get(spec.id)
    left = [d for d in outcome.differences if allowed is None or not re.search(allowed, d)]
    assert not left, f"headrace differs from Spark:\n{outcome.report(limit=40)}"
