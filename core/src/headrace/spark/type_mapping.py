"""Arrow <-> Spark schema conversion for ``headrace.spark``.

Connectors produce Arrow data; Spark's Python data source API accepts Arrow record batches only
when they match the query's Spark schema *exactly* (as ``to_arrow_schema(schema,
timezone="UTC")`` renders it): every field nullable, ``string`` not ``large_string``,
``timestamp[us, tz=UTC]``, ``list<element: ...>``. This module maps every Arrow type a plugin
can produce to the Spark type that holds it, and casts batches to that exact shape.

====================================  ======================================  ==========================
Arrow (from a connector)              Spark                                   note
====================================  ======================================  ==========================
null                                  VOID (NullType)
bool                                  BOOLEAN
int8 / int16 / int32 / int64          TINYINT / SMALLINT / INT / BIGINT
uint8 / uint16 / uint32               SMALLINT / INT / BIGINT                 widened, exact
uint64                                DECIMAL(20,0)                           widened, exact
float16 / float32 / float64           FLOAT / FLOAT / DOUBLE
decimal32/64/128/256, precision<=38   DECIMAL(p,s)                            more than 38 digits: error
string / large_string / string_view   STRING
binary / large_binary / binary_view   BINARY
fixed_size_binary                     BINARY
date32 / date64                       DATE                                    date64's time of day dropped
timestamp(any unit, tz)               TIMESTAMP                               to microseconds, UTC
timestamp(any unit, no tz)            TIMESTAMP_NTZ                           to microseconds
time32 / time64                       TIME                                    (Spark 4.1+)
duration                              INTERVAL DAY TO SECOND                  to microseconds
list / large_list / fixed_size_list   ARRAY<T>
map                                   MAP<K,V>
struct                                STRUCT<...>
dictionary<K, V>                      the Spark type of V                     decoded
====================================  ======================================  ==========================

Types Spark cannot hold (unions, ``month_day_nano_interval``, extension types, run-end encoded
arrays, decimals of more than 38 digits) raise :class:`headrace.errors.UnsupportedError`
naming the column and the fix. Sub-microsecond precision is truncated, as Spark's own readers do.

All functions here are pure and run wherever they are called (driver or executor).
"""

from __future__ import annotations

from collections.abc import Iterable

import pyarrow as pa
from pyspark.errors import PySparkException
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DateType,
    DayTimeIntervalType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    NullType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from headrace.errors import SchemaChangedError, UnsupportedError

__all__ = [
    "arrow_to_spark_schema",
    "arrow_to_spark_type",
    "conform_batch",
    "spark_to_arrow_schema",
]

_MAX_DECIMAL_PRECISION = 38


def _unsupported(path: str, t: pa.DataType, why: str, fix: str) -> UnsupportedError:
    return UnsupportedError(f"column '{path}' has Arrow type {t}, which Spark cannot hold: {why}; fix: {fix}")


def arrow_to_spark_type(t: pa.DataType, path: str = "value") -> DataType:
    """The Spark type that holds Arrow type ``t`` (``path`` names the column in errors).

    Nested fields are all nullable (``containsNull`` / ``valueContainsNull`` true), as Spark's
    Arrow exchange expects. Raises :class:`UnsupportedError` for a type Spark cannot hold.
    """
    if pa.types.is_dictionary(t):
        return arrow_to_spark_type(t.value_type, path)
    if isinstance(t, pa.ExtensionType):
        raise _unsupported(path, t, "it is an Arrow extension type", f"cast it to its storage type {t.storage_type} in the connector")
    if pa.types.is_null(t):
        return NullType()
    if pa.types.is_boolean(t):
        return BooleanType()
    simple: dict[pa.DataType, DataType] = {
        pa.int8(): ByteType(), pa.int16(): ShortType(), pa.int32(): IntegerType(), pa.int64(): LongType(),
        pa.uint8(): ShortType(), pa.uint16(): IntegerType(), pa.uint32(): LongType(),
        pa.uint64(): DecimalType(20, 0),
        pa.float16(): FloatType(), pa.float32(): FloatType(), pa.float64(): DoubleType(),
        pa.date32(): DateType(), pa.date64(): DateType(),
    }  # fmt: skip
    if t in simple:
        return simple[t]
    if pa.types.is_decimal(t):
        if t.precision > _MAX_DECIMAL_PRECISION:
            raise _unsupported(path, t, f"Spark's DECIMAL holds at most {_MAX_DECIMAL_PRECISION} digits",
                               "cast it to DECIMAL(38, s) or to STRING in the connector")  # fmt: skip
        return DecimalType(t.precision, t.scale)
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return StringType()
    if (pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_binary_view(t)
            or pa.types.is_fixed_size_binary(t)):  # fmt: skip
        return BinaryType()
    if pa.types.is_timestamp(t):
        return TimestampType() if t.tz else TimestampNTZType()
    if pa.types.is_time(t):
        try:
            from pyspark.sql.types import TimeType
        except ImportError:  # pragma: no cover - Spark < 4.1
            raise _unsupported(path, t, "this Spark has no TIME type", "cast it to STRING or use Spark 4.1+") from None
        return TimeType()
    if pa.types.is_duration(t):
        return DayTimeIntervalType()
    if pa.types.is_interval(t):
        raise _unsupported(path, t, "Spark's calendar intervals are not exchanged over Arrow",
                           "cast it to a duration (INTERVAL DAY TO SECOND) or a STRING in the connector")  # fmt: skip
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t) or _is_list_view(t):
        return ArrayType(arrow_to_spark_type(t.value_type, f"{path}[]"), containsNull=True)
    if pa.types.is_map(t):
        return MapType(arrow_to_spark_type(t.key_type, f"{path}.key"),
                       arrow_to_spark_type(t.item_type, f"{path}.value"), valueContainsNull=True)  # fmt: skip
    if pa.types.is_struct(t):
        return StructType([StructField(f.name, arrow_to_spark_type(f.type, f"{path}.{f.name}"), nullable=True) for f in t])
    if pa.types.is_union(t):
        raise _unsupported(path, t, "Spark has no union type", "split it into one nullable column per variant")
    if pa.types.is_run_end_encoded(t):
        raise _unsupported(path, t, "run-end encoded arrays are not exchanged with Spark",
                           "decode it in the connector (pyarrow.compute.run_end_decode)")  # fmt: skip
    raise _unsupported(path, t, "there is no Spark type for it", "cast it to a supported type (see headrace.spark.type_mapping)")


def _is_list_view(t: pa.DataType) -> bool:
    fn = getattr(pa.types, "is_list_view", None)
    fn_large = getattr(pa.types, "is_large_list_view", None)
    return bool((fn is not None and fn(t)) or (fn_large is not None and fn_large(t)))


def arrow_to_spark_schema(schema: pa.Schema) -> StructType:
    """The Spark schema of a connector's Arrow schema: every column nullable.

    Called on the driver when Spark asks a ``headrace.*`` data source for its schema (once per
    ``load()``). Raises :class:`UnsupportedError` naming the first column Spark cannot hold.
    """
    return StructType([StructField(f.name, arrow_to_spark_type(f.type, f.name), nullable=True) for f in schema])


def spark_to_arrow_schema(schema: StructType) -> pa.Schema:
    """The Arrow schema Spark exchanges for ``schema``: timestamps as ``timestamp[us, tz=UTC]``,
    ``string`` and ``binary`` (not the large variants), nullability as Spark declares it.

    This is the exact schema Spark accepts from a data source's ``read`` and the one a headrace
    sink sees under Spark. Raises :class:`UnsupportedError` for Spark types that have no Arrow
    form (e.g. ``CALENDAR INTERVAL``).
    """
    try:
        return to_arrow_schema(schema, timezone="UTC", error_on_duplicated_field_names_in_struct=True)
    except PySparkException as e:
        raise UnsupportedError(
            f"the Spark schema {schema.simpleString()} cannot be exchanged as Arrow ({e}); fix: cast the "
            "column to a supported type (e.g. STRING) before writing to a headrace sink"
        ) from None


def _names(schema: pa.Schema) -> list[str]:
    return list(schema.names)


def conform_batch(batch: pa.RecordBatch, target: pa.Schema, *, connector: str = "?") -> pa.RecordBatch:
    """``batch`` cast to exactly ``target`` (matched by column name).

    A column missing from ``batch`` is filled with nulls (a source whose schema grew after the
    query started); a column that ``target`` does not have is an error (Spark fixed the schema
    when the query started: restart it to pick up the new column). Called once per record
    batch, on executors (reads) or in write tasks; costs nothing when the schemas already match.
    """
    if batch.schema.equals(target):
        return batch
    names = _names(batch.schema)
    extra = [n for n in names if target.get_field_index(n) < 0]
    if extra:
        raise SchemaChangedError(
            f"source '{connector}' produced column(s) {', '.join(extra)} that the Spark query's schema "
            f"({', '.join(target.names)}) does not have; restart the query so Spark picks up the new schema"
        )
    cols: list[pa.Array] = []
    for f in target:
        idx = batch.schema.get_field_index(f.name)
        if idx < 0:
            cols.append(pa.nulls(batch.num_rows, f.type))
            continue
        col = batch.column(idx)
        if col.type != f.type:
            col = _cast(col, f.type, f.name, connector)
        cols.append(col)
    return pa.RecordBatch.from_arrays(cols, schema=target)


def _cast(col: pa.Array, to: pa.DataType, name: str, connector: str) -> pa.Array:
    if pa.types.is_dictionary(col.type):
        col = col.dictionary_decode()
        if col.type == to:
            return col
    try:
        # safe=False: the mapping only widens, except sub-microsecond time precision, which
        # Spark cannot hold and which is truncated (as Spark's own readers do).
        import pyarrow.compute as pc  # imported when first needed: ~35 ms in each fresh Spark Python process

        return pc.cast(col, to, safe=False)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        raise UnsupportedError(
            f"column '{name}' of '{connector}' ({col.type}) cannot be converted to Spark's {to}: {e}; "
            "fix: cast it in the connector to a type listed in headrace.spark.type_mapping"
        ) from None


def conform_batches(batches: Iterable[pa.RecordBatch], target: pa.Schema, *, connector: str = "?") -> Iterable[pa.RecordBatch]:
    """Every batch through :func:`conform_batch`, skipping empty ones."""
    for b in batches:
        if b.num_rows:
            yield conform_batch(b, target, connector=connector)
