"""The filters Spark evaluates below a watermark (headrace.transforms.watermark_filters): which
ones each ``with_watermark`` step learns, and that the rows they drop do not move the query's
watermark while every row still reaches the filters as written. The same queries run against
PySpark in tests/conformance (catalogue cases ``filter-below-watermark``,
``join-static-after-watermark``, ``ss-join-*``)."""

from __future__ import annotations

import datetime as dt
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import headrace as hr
from headrace.testing import memory_stream
from headrace.transforms.join import StreamStaticJoinOperator
from headrace.transforms.stateless import (
    MapBatchesOperator,
    RenameColumnOperator,
    SqlOperator,
    WithColumnOperator,
    select_expr_query,
    where_query,
)
from headrace.transforms.watermark import WatermarkOperator
from headrace.transforms.watermark_filters import assign_measure_filters

TS = pa.timestamp("us", tz="UTC")
SCHEMA = pa.schema([("ts", TS), ("k", pa.string()), ("id", pa.int64())])
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def chain(*ops: Any) -> list[tuple[Any, pa.Schema]]:
    out, schema = [], SCHEMA
    for op in ops:
        out.append((op, schema))
        schema = op.output_schema(schema)
    return out


def measured(*ops: Any) -> str | None:
    steps = chain(*ops)
    assign_measure_filters(steps)
    return next(op.measure_filter for op, _ in steps if isinstance(op, WatermarkOperator))


def wm() -> WatermarkOperator:
    return WatermarkOperator("ts", "5 seconds")


def where(cond: str) -> SqlOperator:
    return SqlOperator(where_query(cond), what=f"where({cond!r})")


@pytest.mark.parametrize(
    ("ops", "expected"),
    [
        pytest.param(lambda: [wm(), where("k IS NOT NULL")], '(NOT "k" IS NULL)', id="where-without-event-time"),
        pytest.param(lambda: [wm(), where("k IS NOT NULL AND ts > TIMESTAMP '2026-01-01'")], '(NOT "k" IS NULL)',
                     id="conjunct-with-event-time-stays-above"),
        pytest.param(lambda: [wm(), SqlOperator(select_expr_query(["ts", "k AS key", "id"]), what="s"),
                              where("key <> 'x'")], "(\"k\" <> 'x')", id="through-a-renaming-projection"),
        pytest.param(lambda: [wm(), RenameColumnOperator("k", "key"), where("key = 'a'")], "(\"k\" = 'a')",
                     id="through-with_column_renamed"),
        pytest.param(lambda: [wm(), WithColumnOperator("id2", "id * 2"), where("id2 > 4")], '(("id" * 2) > 4)',
                     id="through-with_column"),
        pytest.param(lambda: [wm(), where("random() < 2")], None, id="nondeterministic-stays"),
        pytest.param(lambda: [wm(), MapBatchesOperator(lambda t: t, schema=SCHEMA), where("k IS NOT NULL")], None,
                     id="map_batches-stops"),
        pytest.param(lambda: [wm(), WithColumnOperator("r", "random()"), where("k IS NOT NULL")], None,
                     id="nondeterministic-projection-stops"),
        pytest.param(lambda: [wm(), StreamStaticJoinOperator(pa.table({"k": ["a"], "x": [1]}), ["k"], "inner")],
                     '(NOT "k" IS NULL)', id="static-inner-join-key"),
        pytest.param(lambda: [wm(), StreamStaticJoinOperator(pa.table({"k": ["a"], "x": [1]}), ["k"], "left")],
                     None, id="static-left-join-filters-nothing"),
        pytest.param(lambda: [where("k IS NOT NULL"), wm()], None, id="filter-before-is-not-measured-again"),
    ],
)
def test_which_filters_a_watermark_measures_through(ops: Any, expected: str | None) -> None:
    assert measured(*ops()) == expected


def test_the_filter_is_evaluated_on_the_watermarks_input() -> None:
    op = wm()
    op.set_measure_filter('(NOT "k" IS NULL)')
    table = pa.table({"ts": pa.array([T0 + dt.timedelta(seconds=s) for s in (10, 50)], TS),
                      "k": ["a", None], "id": [1, 2]})  # fmt: skip
    op.open(None)  # type: ignore[arg-type]
    assert op.process(table, None) is table  # type: ignore[arg-type]
    assert op.stats.max == int((T0 + dt.timedelta(seconds=10)).timestamp() * 1000)
    assert op.stats.count == 1


def test_rows_a_pushed_filter_drops_do_not_move_the_watermark(tmp_path: Path) -> None:
    name = uuid.uuid4().hex
    source = memory_stream(name, SCHEMA)
    frame = (hr.read_stream.format("memory").option("name", name).schema(SCHEMA).load()
             .with_watermark("ts", "5 seconds").where("k IS NOT NULL")
             .group_by(hr.window("ts", "10 seconds")).agg("count(*) AS n"))  # fmt: skip
    out: list[pa.Table] = []
    q = (frame.write_stream.foreach_batch(lambda t, b: out.append(t)).output_mode("append")
         .option("checkpointLocation", str(tmp_path)).start())  # fmt: skip
    try:
        source.add([{"ts": T0 + dt.timedelta(seconds=3), "k": "a", "id": 1},
                    {"ts": T0 + dt.timedelta(seconds=100), "k": None, "id": 2}])  # fmt: skip
        q.process_all_available(60)
        source.add([{"ts": T0 + dt.timedelta(seconds=4), "k": "a", "id": 3}])
        q.process_all_available(60)
    finally:
        q.stop()
    assert q.exception() is None, q.exception()
    marks = [p["eventTime"].get("watermark") for p in q.recent_progress]
    # the NULL-key row at 100 s is filtered below the watermark (as Spark plans it): the
    # watermark stays below the first window's end, so the row at 4 s is not late and the
    # window stays open
    assert all(m is None or m < "2026-01-01T00:00:10" for m in marks), marks
    assert sum(p["numInputRows"] for p in q.recent_progress) == 3
    assert sum(t.num_rows for t in out) == 0
