"""PostgreSQL types -> Arrow types, and pgoutput's text values -> Arrow arrays (the way back of
:mod:`headrace_lakebase.pgtypes`).

========================================  =======================================
PostgreSQL                                Arrow
========================================  =======================================
boolean                                   bool
smallint / integer / bigint / oid         int16 / int32 / int64 / int64
real / double precision                   float32 / float64
numeric(p, s)                             decimal128(p, s) (decimal256 past 38 digits)
numeric (no precision)                    string (exact text, NaN and infinities kept)
text, varchar, char, name, uuid, json,    string
jsonb, enums, inet, and any other type
bytea                                     binary
date                                      date32
timestamp / timestamptz                   timestamp[us] / timestamp[us, UTC]
time                                      time64[us]
interval                                  duration[us] (months count as 30 days)
<type>[] (one dimension)                  list<type>
========================================  =======================================

Common types are converted column-wise with Arrow casts of the text; the others go through
psycopg's own text loaders. The decoding session runs with ``TimeZone=UTC``,
``DateStyle=ISO``, ``IntervalStyle=postgres`` and ``extra_float_digits=3`` so that the text is
exact and parseable (see :data:`SESSION_SETTINGS`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from headrace.errors import HeadraceError

__all__ = ["SESSION_SETTINGS", "PgColumn", "arrow_type", "to_arrow"]

SESSION_SETTINGS = {
    "TimeZone": "UTC",
    "DateStyle": "ISO, MDY",
    "IntervalStyle": "postgres",
    "extra_float_digits": "3",
    "bytea_output": "hex",
}
"""GUCs of every session that decodes changes or reads snapshot rows."""

_STRING_OIDS = {25, 1043, 1042, 19, 18, 114, 3802, 2950}


class PgColumn:
    """A table column: name, type oid (the domain's base type for domains), typmod, the
    element type oid for arrays (0 otherwise), ``format_type`` text."""

    __slots__ = ("elem_oid", "name", "oid", "type_name", "typmod")

    def __init__(self, name: str, oid: int, typmod: int, elem_oid: int, type_name: str) -> None:
        self.name = name
        self.oid = oid
        self.typmod = typmod
        self.elem_oid = elem_oid
        self.type_name = type_name

    def __repr__(self) -> str:
        return f"PgColumn({self.name} {self.type_name})"


def _numeric(typmod: int) -> pa.DataType:
    if typmod < 4:
        return pa.string()
    precision = ((typmod - 4) >> 16) & 0xFFFF
    scale = (typmod - 4) & 0xFFFF
    if scale > precision or scale > 0x7FFF:  # negative scales (PG 15) have no Arrow decimal
        return pa.string()
    return pa.decimal128(precision, scale) if precision <= 38 else pa.decimal256(precision, scale)


def _scalar_type(oid: int, typmod: int) -> pa.DataType:
    if oid == 16:
        return pa.bool_()
    if oid == 21:
        return pa.int16()
    if oid == 23:
        return pa.int32()
    if oid in (20, 26):
        return pa.int64()
    if oid == 700:
        return pa.float32()
    if oid == 701:
        return pa.float64()
    if oid == 1700:
        return _numeric(typmod)
    if oid == 17:
        return pa.binary()
    if oid == 1082:
        return pa.date32()
    if oid == 1114:
        return pa.timestamp("us")
    if oid == 1184:
        return pa.timestamp("us", tz="UTC")
    if oid == 1083:
        return pa.time64("us")
    if oid == 1186:
        return pa.duration("us")
    return pa.string()


def arrow_type(col: PgColumn) -> pa.DataType:
    """The Arrow type of a column (see the module table)."""
    if col.elem_oid:
        return pa.list_(_scalar_type(col.elem_oid, col.typmod))
    return _scalar_type(col.oid, col.typmod)


_CAST_OK = (pa.types.is_integer, pa.types.is_floating, pa.types.is_decimal, pa.types.is_date, pa.types.is_timestamp)


def to_arrow(values: Sequence[Any], col: PgColumn, target: pa.DataType, transformer: Any) -> pa.Array:
    """The text values of one column (``bytes`` or ``None``) as an Arrow array of ``target``.

    Called once per column per decoded chunk. ``transformer`` is a ``psycopg.adapt.Transformer``
    of the decoding connection (for the types Arrow cannot parse). Raises HeadraceError naming
    the column and the value when a value cannot be represented (e.g. ``infinity`` dates).
    """
    raw = pa.array(values, pa.binary())
    if col.elem_oid == 0:
        if pa.types.is_binary(target) and col.oid == 17:
            return _bytea(values)
        text = raw.cast(pa.string())
        if pa.types.is_string(target):
            return text
        if pa.types.is_boolean(target):
            # pgoutput sends t/f, ::text gives true/false; NULL stays NULL
            return pc.if_else(pc.is_null(text), pa.scalar(None, pa.bool_()), pc.is_in(text, pa.array(["t", "true"])))
        if any(p(target) for p in _CAST_OK):
            try:
                return text.cast(target)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                pass  # 'infinity', BC dates, ...: the loaders below say which value
    return _via_loader(values, col, target, transformer)


def _bytea(values: Sequence[Any]) -> pa.Array:
    out: list[bytes | None] = []
    for v in values:
        if v is None:
            out.append(None)
        elif v[:2] == b"\\x":
            out.append(bytes.fromhex(v[2:].decode()))
        else:  # escape format (bytea_output=escape): let PostgreSQL's rules apply via psycopg
            from psycopg.types.string import ByteaLoader

            out.append(ByteaLoader(17).load(v))
    return pa.array(out, pa.binary())


def _via_loader(values: Sequence[Any], col: PgColumn, target: pa.DataType, transformer: Any) -> pa.Array:
    from psycopg import pq

    oid = col.oid
    loader = transformer.get_loader(oid, pq.Format.TEXT)
    py: list[Any] = []
    for v in values:
        if v is None:
            py.append(None)
            continue
        try:
            obj = loader.load(v)
        except Exception as e:
            raise HeadraceError(
                f"lakebase source: value {bytes(v)[:60]!r} of column {col.name} ({col.type_name}) cannot be read: {e}; "
                "cast the column in a view or change the value"
            ) from None
        py.append(_fit(obj, col))
    try:
        return pa.array(py, target)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as e:
        raise HeadraceError(
            f"lakebase source: column {col.name} ({col.type_name}) has a value Arrow type {target} cannot hold: {e}; "
            "e.g. 'infinity' timestamps or dates outside Arrow's range: change the value or the column type"
        ) from None


def _fit(obj: Any, col: PgColumn) -> Any:
    """Python values psycopg loads, made acceptable to ``pa.array`` for the column's type."""
    if isinstance(obj, list):
        return [_fit(x, col) for x in obj]
    if isinstance(obj, dict | bool | int | float | str | bytes) or obj is None:
        if isinstance(obj, dict):
            import json

            return json.dumps(obj)
        return obj
    if col.oid in (114, 3802) or (col.elem_oid in (114, 3802)):
        import json

        return json.dumps(obj)
    if hasattr(obj, "isoformat") or hasattr(obj, "as_tuple") or hasattr(obj, "total_seconds"):
        return obj
    return str(obj)
