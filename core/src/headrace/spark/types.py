"""Old home of the Arrow <-> Spark type mapping, kept for one release: it lives in
:mod:`headrace.spark.type_mapping`."""

from __future__ import annotations

from headrace.spark.type_mapping import (
    arrow_to_spark_schema,
    arrow_to_spark_type,
    conform_batch,
    spark_to_arrow_schema,
)

__all__ = ["arrow_to_spark_schema", "arrow_to_spark_type", "conform_batch", "spark_to_arrow_schema"]
