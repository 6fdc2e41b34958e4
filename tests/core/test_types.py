from __future__ import annotations

import pyarrow as pa
import pytest

from headrace.sql_types import arrow_to_spark_name, ddl_to_schema, parse_type


def test_ddl_to_schema() -> None:
    schema = ddl_to_schema("id BIGINT NOT NULL, name STRING, price DECIMAL(10,2), tags ARRAY<STRING>, "
                           "attrs MAP<STRING, INT>, pos STRUCT<x: DOUBLE, y: DOUBLE>, ts TIMESTAMP")  # fmt: skip
    assert schema.field("id").type == pa.int64() and not schema.field("id").nullable
    assert schema.field("price").type == pa.decimal128(10, 2)
    assert schema.field("tags").type == pa.list_(pa.string())
    assert schema.field("attrs").type == pa.map_(pa.string(), pa.int32())
    assert schema.field("pos").type == pa.struct([("x", pa.float64()), ("y", pa.float64())])
    assert schema.field("ts").type == pa.timestamp("us", tz="UTC")


def test_unknown_type_names_the_type() -> None:
    with pytest.raises(ValueError, match="unknown type 'INTEGRAL'"):
        parse_type("INTEGRAL")


@pytest.mark.parametrize("ddl", ["BIGINT", "STRING", "DECIMAL(10,2)", "ARRAY<INT>", "MAP<STRING,BIGINT>", "TIMESTAMP"])
def test_spark_names_round_trip(ddl: str) -> None:
    assert arrow_to_spark_name(parse_type(ddl)) == ddl
