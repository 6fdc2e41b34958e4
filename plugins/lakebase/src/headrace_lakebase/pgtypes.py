"""Arrow types <-> PostgreSQL types: DDL for new tables, fit checks against existing tables.

======================================  ==============================
Arrow                                   PostgreSQL (new table)
======================================  ==============================
bool                                    boolean
int8, int16, uint8                      smallint
int32, uint16                           integer
int64, uint32                           bigint
uint64                                  numeric(20,0)
float16, float32                        real
float64                                 double precision
decimal128/256(p, s)                    numeric(p, s)
string, large_string, string_view       text
binary, large_binary, fixed_size_binary bytea
date32, date64                          date
timestamp (with tz)                     timestamp with time zone
timestamp (no tz)                       timestamp without time zone
time32, time64                          time without time zone
duration                                interval
list/large_list/fixed_size_list of a    <type of a>[] (one dimension)
primitive (not of lists or structs)
struct, map, list of nested values      jsonb
null                                    text
======================================  ==============================
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

__all__ = ["ColumnInfo", "arrow_to_pg", "fits", "is_comparable", "is_json"]


@dataclass(frozen=True)
class ColumnInfo:
    """A column of an existing table: name, ``format_type`` text, type oid, element type
    category (``pg_type.typcategory``: N numeric, S string, D date/time, B bool, U user/bytea, A
    array...), not-null and has-default flags."""

    name: str
    type_name: str
    oid: int
    category: str
    not_null: bool
    has_default: bool
    base_oid: int = 0


def is_json(t: pa.DataType) -> bool:
    """True when ``t`` is stored as jsonb (structs, maps, lists of nested values)."""
    if pa.types.is_struct(t) or pa.types.is_map(t):
        return True
    if _is_list(t):
        v = t.value_type
        return _is_list(v) or pa.types.is_struct(v) or pa.types.is_map(v)
    return False


def _is_list(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t) or (
        hasattr(pa.types, "is_list_view") and (pa.types.is_list_view(t) or pa.types.is_large_list_view(t))
    )


def is_comparable(t: pa.DataType) -> bool:
    """Whether a column of type ``t`` can be an upsert key (no structs, maps, lists, json)."""
    return not (is_json(t) or _is_list(t) or pa.types.is_null(t))


def arrow_to_pg(t: pa.DataType) -> str:
    """The PostgreSQL type of a new column for Arrow type ``t``. Raises TypeError for types
    with no mapping (naming the type)."""
    if pa.types.is_boolean(t):
        return "boolean"
    if pa.types.is_int8(t) or pa.types.is_int16(t) or pa.types.is_uint8(t):
        return "smallint"
    if pa.types.is_int32(t) or pa.types.is_uint16(t):
        return "integer"
    if pa.types.is_int64(t) or pa.types.is_uint32(t):
        return "bigint"
    if pa.types.is_uint64(t):
        return "numeric(20,0)"
    if pa.types.is_float16(t) or pa.types.is_float32(t):
        return "real"
    if pa.types.is_float64(t):
        return "double precision"
    if pa.types.is_decimal(t):
        return f"numeric({t.precision},{t.scale})"
    if pa.types.is_string(t) or pa.types.is_large_string(t) or _is(t, "is_string_view") or pa.types.is_null(t):
        return "text"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t) or _is(t, "is_binary_view"):
        return "bytea"
    if pa.types.is_date(t):
        return "date"
    if pa.types.is_timestamp(t):
        return "timestamp with time zone" if t.tz else "timestamp without time zone"
    if pa.types.is_time(t):
        return "time without time zone"
    if pa.types.is_duration(t):
        return "interval"
    if is_json(t):
        return "jsonb"
    if _is_list(t):
        return arrow_to_pg(t.value_type) + "[]"
    if pa.types.is_dictionary(t):
        return arrow_to_pg(t.value_type)
    raise TypeError(f"Arrow type {t} has no PostgreSQL mapping; cast the column (map_batches) to a supported type")


def _is(t: pa.DataType, name: str) -> bool:
    fn = getattr(pa.types, name, None)
    return bool(fn is not None and fn(t))


# typcategory of the target column -> Arrow type predicates that may be written into it
_NUMERIC_OIDS = {20, 21, 23, 700, 701, 1700, 26}
_TEXT_OIDS = {25, 1043, 1042, 19, 18}


def fits(t: pa.DataType, col: ColumnInfo) -> bool:
    """Whether Arrow values of type ``t`` can be written into the existing column ``col``
    (without silently changing their meaning)."""
    oid = col.base_oid or col.oid
    if pa.types.is_null(t):
        return True
    if pa.types.is_dictionary(t):
        return fits(t.value_type, col)
    if pa.types.is_boolean(t):
        return oid == 16
    if pa.types.is_integer(t):
        return oid in _NUMERIC_OIDS
    if pa.types.is_floating(t):
        return oid in (700, 701, 1700)
    if pa.types.is_decimal(t):
        return oid in (1700, 700, 701)
    if pa.types.is_string(t) or pa.types.is_large_string(t) or _is(t, "is_string_view"):
        return oid in _TEXT_OIDS or oid in (114, 3802)  # text into json/jsonb: already JSON text
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t) or _is(t, "is_binary_view"):
        return oid == 17
    if pa.types.is_date(t):
        return oid in (1082, 1114, 1184)
    if pa.types.is_timestamp(t):
        return oid in (1114, 1184)
    if pa.types.is_time(t):
        return oid in (1083, 1266)
    if pa.types.is_duration(t):
        return oid == 1186
    if is_json(t):
        return oid in (114, 3802)
    if _is_list(t):
        return col.category == "A" or oid in (114, 3802)
    return False
