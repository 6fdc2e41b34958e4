"""Rows as Python values for psycopg's ``write_row``: the COPY path for types the vectorised
encoder (``copy_binary``) does not cover (numeric, json/jsonb, arrays, time, interval...)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa

__all__ = ["jsonable", "python_rows"]


def python_rows(table: pa.Table, oids: Sequence[int]) -> Iterator[tuple[Any, ...]]:
    """Rows as Python values for psycopg's ``write_row`` (the path for types the vectorised
    encoder does not cover: numeric, json/jsonb, arrays, time, interval...)."""
    from psycopg.types.json import Json, Jsonb  # only this slow path needs them

    cols: list[list[Any]] = []
    for col, oid in zip(table.columns, oids, strict=True):
        values = col.to_pylist()
        if oid in (114, 3802):
            wrap = Jsonb if oid == 3802 else Json
            if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
                values = [None if v is None else wrap(json.loads(v)) for v in values]
            else:
                values = [None if v is None else wrap(jsonable(v)) for v in values]
        cols.append(values)
    return zip(*cols, strict=True)


def jsonable(v: Any) -> Any:
    """Arrow's Python values made JSON-friendly: maps (lists of pairs) become objects, bytes
    become hex, dates and decimals become strings."""
    if isinstance(v, dict):
        return {str(k): jsonable(x) for k, x in v.items()}
    if isinstance(v, list):
        if v and all(isinstance(x, tuple) and len(x) == 2 for x in v):
            return {str(k): jsonable(x) for k, x in v}
        return [jsonable(x) for x in v]
    if isinstance(v, bytes):
        return v.hex()
    if v is None or isinstance(v, bool | int | float | str):
        return v
    return str(v)
