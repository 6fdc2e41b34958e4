"""``PlanRunner.source_columns``: which source columns a plan reads (``Operator.input_columns``,
asked last step to first), for ``Source.prune_columns``."""

from __future__ import annotations

import pyarrow as pa
import pytest

from headrace.engine.plan import PlanRunner
from headrace.transforms.from_json import FromJson
from headrace.transforms.operator import Operator
from headrace.transforms.stateless import (
    DropColumnsOperator,
    MapBatchesOperator,
    RenameColumnOperator,
    SelectColumnsOperator,
    SqlOperator,
)

KAFKA = pa.schema([("key", pa.binary()), ("value", pa.binary()), ("topic", pa.string()), ("partition", pa.int32()),
                   ("offset", pa.int64()), ("timestamp", pa.timestamp("us", tz="UTC"))])  # fmt: skip


def parse() -> MapBatchesOperator:
    return MapBatchesOperator(FromJson("value", "id BIGINT, v BIGINT"))


CASES: dict[str, tuple[list[Operator], frozenset[str] | None]] = {
    "from_json then a select of parsed fields": (
        [parse(), SelectColumnsOperator(["id", "v"]), SqlOperator("SELECT * FROM batch WHERE v > 1", what="where")],
        frozenset({"value", "topic", "partition", "offset"}),
    ),
    "from_json then a select keeping a source column": (
        [parse(), SelectColumnsOperator(["id", "timestamp"])],
        frozenset({"value", "topic", "partition", "offset", "timestamp"}),
    ),
    "a select first": ([SelectColumnsOperator(["value"]), parse()], frozenset({"value"})),
    "a rename then a select of the new name": (
        [RenameColumnOperator("key", "k"), SelectColumnsOperator(["k"])],
        frozenset({"key"}),
    ),
    "a drop then a select": (
        [DropColumnsOperator(["key"]), SelectColumnsOperator(["value", "topic"])],
        frozenset({"value", "topic"}),
    ),
    "from_json last (the sink gets every column)": ([parse()], None),
    "from_json then SQL (cannot say)": ([parse(), SqlOperator("SELECT * FROM batch WHERE v > 1", what="where")], None),
    "a plain map_batches before a select": (
        [MapBatchesOperator(lambda t: t), SelectColumnsOperator(["value"])],
        None,
    ),
    "a select of every column": ([SelectColumnsOperator(KAFKA.names)], None),
    "no step": ([], None),
}


@pytest.mark.parametrize("ops,want", list(CASES.values()), ids=list(CASES))
def test_source_columns(ops: list[Operator], want: frozenset[str] | None) -> None:
    assert PlanRunner(ops, KAFKA).source_columns() == want


def test_a_plan_reading_two_sources_prunes_nothing() -> None:
    ops = [parse(), SelectColumnsOperator(["id"])]
    assert PlanRunner(ops, KAFKA, [KAFKA, KAFKA]).source_columns() is None


def test_from_json_reads_its_column_and_the_location_columns() -> None:
    fj = FromJson("value", "id BIGINT, s STRING")
    assert fj.input_columns(None) is None
    got = fj.input_columns(frozenset({"id", "timestamp"}))
    assert got is not None and {"value", "timestamp", "topic", "partition", "offset"} <= got and "id" not in got
