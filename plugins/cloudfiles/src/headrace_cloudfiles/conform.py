"""Fitting what a file holds to the stream's schema, rescuing what does not fit.

A reader hands over either an Arrow table in the file's own types (the fast path) or Python
rows (the slow path, for malformed records and mixed types). :func:`conform_table` and
:func:`conform_rows` cast each schema column to its type; a value that does not cast becomes
null and goes, with every field of a column the schema lacks (when rescued), into the rescued
data column as JSON, with ``_file_path``. Rows are never dropped.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

__all__ = ["Conformed", "conform_rows", "conform_table", "to_json_value", "stringify"]

MALFORMED_KEY = "_malformed_record"


def to_json_value(v: Any) -> Any:
    """A Python value from Arrow as something ``json.dumps`` takes."""
    if isinstance(v, dict):
        return {str(k): to_json_value(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        if v and all(isinstance(x, tuple) and len(x) == 2 for x in v):  # Arrow map -> list of pairs
            return {str(k): to_json_value(x) for k, x in v}
        return [to_json_value(x) for x in v]
    if isinstance(v, bytes):
        return base64.b64encode(v).decode()
    if isinstance(v, dt.datetime | dt.date | dt.time):
        return v.isoformat()
    if isinstance(v, decimal.Decimal):
        return str(v)
    if isinstance(v, dt.timedelta):
        return v.total_seconds()
    return v


def stringify(v: Any) -> str | None:
    """A value as Spark shows it in a string column: JSON for objects and arrays, ``true``..."""
    if v is None or isinstance(v, str):
        return v
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, dict | list):
        return json.dumps(to_json_value(v), separators=(",", ":"))
    if isinstance(v, bytes):
        return base64.b64encode(v).decode()
    if isinstance(v, dt.datetime | dt.date | dt.time):
        return v.isoformat()
    return str(v)


_ERRORS = (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError, ValueError, OverflowError)


def _lossy(v: Any, t: pa.DataType) -> bool:
    """pyarrow truncates 2.5 to 2 when building an integer array from Python: refuse that."""
    return isinstance(v, float) and pa.types.is_integer(t) and not v.is_integer()


def _cast_one(v: Any, t: pa.DataType) -> tuple[bool, Any]:
    """``(True, value)`` when ``v`` fits type ``t``, else ``(False, None)``."""
    if v is None:
        return True, None
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return True, stringify(v)
    try:
        return True, pa.array([v]).cast(t, safe=True)[0].as_py()
    except _ERRORS:
        pass
    if _lossy(v, t):
        return False, None
    try:
        return True, pa.array([v], type=t)[0].as_py()
    except _ERRORS:
        return False, None


@dataclass
class Conformed:
    """A file's rows in the schema's data columns, with what was rescued and what was new.

    ``rescued[i]`` is the dict of rescued fields of row ``i`` (or None); ``new_fields`` are
    columns the file has and the schema does not, with the file's type.
    """

    columns: dict[str, pa.Array | pa.ChunkedArray]
    num_rows: int
    rescued: list[dict[str, Any] | None] | None = None
    new_fields: list[pa.Field] = field(default_factory=list)

    def rescue(self, row: int, name: str, value: Any) -> None:
        if self.rescued is None:
            self.rescued = [None] * self.num_rows
        d = self.rescued[row]
        if d is None:
            d = self.rescued[row] = {}
        d[name] = value


def _column_from_values(name: str, values: list[Any], t: pa.DataType, out: Conformed, rescue: bool) -> pa.Array:
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return pa.array([stringify(v) for v in values], type=t)
    try:
        arr = pa.array(values)
        return arr if arr.type == t else arr.cast(t, safe=True)
    except _ERRORS:
        pass
    fixed = []
    for i, v in enumerate(values):
        ok, x = _cast_one(v, t)
        fixed.append(x)
        if not ok and rescue:
            out.rescue(i, name, to_json_value(v))
    return pa.array(fixed, type=t)


def _string_column(col: pa.ChunkedArray) -> pa.ChunkedArray | pa.Array:
    t = col.type
    if pa.types.is_string(t):
        return col
    if pa.types.is_large_string(t) or pa.types.is_integer(t) or pa.types.is_boolean(t) or pa.types.is_null(t):
        return col.cast(pa.string())
    return pa.array([stringify(v) for v in col.to_pylist()], type=pa.string())


def conform_table(table: pa.Table, data_schema: pa.Schema, *, rescue: bool) -> Conformed:
    """Fit an Arrow table read from a file to ``data_schema`` (fast path).

    Columns the schema lacks are reported in ``new_fields`` and, when ``rescue``, put into the
    rescued data per row. Values that do not cast are nulls and rescued (when ``rescue``).
    """
    n = table.num_rows
    out = Conformed({}, n)
    for f in data_schema:
        if f.name not in table.column_names:
            out.columns[f.name] = pa.nulls(n, f.type)
            continue
        col = table.column(f.name)
        if col.type == f.type:
            out.columns[f.name] = col
            continue
        if pa.types.is_string(f.type):
            out.columns[f.name] = _string_column(col)
            continue
        try:
            out.columns[f.name] = col.cast(f.type, safe=True)
            continue
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
            pass
        out.columns[f.name] = _column_from_values(f.name, col.to_pylist(), f.type, out, rescue)
    known = set(data_schema.names)
    for name in table.column_names:
        if name in known:
            continue
        col = table.column(name)
        out.new_fields.append(pa.field(name, pa.string() if pa.types.is_null(col.type) else col.type))
        if rescue:
            for i, v in enumerate(col.to_pylist()):
                if v is not None:
                    out.rescue(i, name, to_json_value(v))
    return out


def _infer_type(values: Sequence[Any]) -> pa.DataType:
    try:
        t = pa.array(list(values)).type
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
        return pa.string()
    return pa.string() if pa.types.is_null(t) else t


def conform_rows(
    rows: Sequence[dict[str, Any] | None],
    malformed: Sequence[str | None],
    data_schema: pa.Schema,
    *,
    rescue: bool,
) -> Conformed:
    """Fit Python rows (slow path) to ``data_schema``. ``rows[i]`` is None when record ``i``
    was malformed; ``malformed[i]`` then holds its text, which is rescued (when ``rescue``)."""
    n = len(rows)
    out = Conformed({}, n)
    empty: dict[str, Any] = {}
    for f in data_schema:
        values = [(r or empty).get(f.name) for r in rows]
        out.columns[f.name] = _column_from_values(f.name, values, f.type, out, rescue)
    known = set(data_schema.names)
    extra: dict[str, list[Any]] = {}
    for i, r in enumerate(rows):
        if r is None:
            if rescue and malformed[i] is not None:
                out.rescue(i, MALFORMED_KEY, malformed[i])
            continue
        for k, v in r.items():
            if k in known:
                continue
            extra.setdefault(k, [None] * n)[i] = v
            if rescue and v is not None:
                out.rescue(i, k, to_json_value(v))
    for name, values in extra.items():
        out.new_fields.append(pa.field(name, _infer_type(values)))
    return out
