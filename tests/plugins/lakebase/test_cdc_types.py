"""Which column type changes the change source casts (widenings) and which it refuses."""

from __future__ import annotations

import pytest

from headrace_lakebase.cdc_types import describe_type, is_widening

INT2, INT4, INT8, FLOAT4, FLOAT8, VARCHAR, TEXT, NUMERIC = 21, 23, 20, 700, 701, 1043, 25, 1700


def numeric(precision: int, scale: int) -> int:
    return ((precision << 16) | scale) + 4


@pytest.mark.parametrize(
    ("old", "new", "widening"),
    [
        ((INT4, -1), (INT8, -1), True),
        ((INT2, -1), (INT4, -1), True),
        ((INT2, -1), (INT8, -1), True),
        ((INT8, -1), (INT4, -1), False),
        ((FLOAT4, -1), (FLOAT8, -1), True),
        ((FLOAT8, -1), (FLOAT4, -1), False),
        ((VARCHAR, 14), (TEXT, -1), True),
        ((VARCHAR, 14), (VARCHAR, 24), True),
        ((VARCHAR, 24), (VARCHAR, 14), False),
        ((NUMERIC, numeric(6, 2)), (NUMERIC, numeric(14, 2)), True),
        ((NUMERIC, numeric(6, 2)), (NUMERIC, numeric(8, 4)), True),
        ((NUMERIC, numeric(6, 2)), (NUMERIC, numeric(6, 3)), False),
        ((NUMERIC, numeric(6, 2)), (NUMERIC, -1), False),
        ((INT4, -1), (TEXT, -1), False),
        ((TEXT, -1), (INT4, -1), False),
        ((INT4, -1), (INT4, -1), False),
    ],
    ids=["int-bigint", "smallint-int", "smallint-bigint", "bigint-int", "real-double", "double-real",
         "varchar-text", "varchar-longer", "varchar-shorter", "numeric-precision-up", "numeric-scale-and-precision-up",
         "numeric-scale-up-only", "numeric-unconstrained", "int-text", "text-int", "same"],
)
def test_is_widening(old: tuple[int, int], new: tuple[int, int], widening: bool) -> None:
    assert is_widening(*old, *new) is widening


def test_describe_type() -> None:
    assert describe_type(INT8, -1) == "bigint"
    assert describe_type(VARCHAR, 14) == "varchar(10)"
    assert describe_type(NUMERIC, numeric(12, 2)) == "numeric(12,2)"
    assert describe_type(99999, -1) == "type oid 99999"
