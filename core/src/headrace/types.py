"""Old home of Spark SQL type names and DDL schema strings, kept for one release: they live in
:mod:`headrace.sql_types`."""

from __future__ import annotations

from headrace.sql_types import arrow_to_spark_name, ddl_to_schema, parse_schema, parse_type

__all__ = ["arrow_to_spark_name", "ddl_to_schema", "parse_schema", "parse_type"]
