"""Delta schemas (the log's ``schemaString``) as Arrow schemas, and column mapping."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import re
from collections.abc import Mapping
from typing import Any

import pyarrow as pa

__all__ = [
    "PHYSICAL_NAME",
    "SUPPORTED_READER_FEATURES",
    "VARIANT",
    "check_protocol",
    "delta_schema_to_arrow",
    "parse_partition_value",
    "physical_names",
    "schema_mismatch_hint",
]

PHYSICAL_NAME = "delta.columnMapping.physicalName"

SUPPORTED_READER_FEATURES = frozenset(
    {"columnMapping", "deletionVectors", "timestampNtz", "v2Checkpoint", "vacuumProtocolCheck", "typeWidening",
     "typeWidening-preview", "variantType", "variantType-preview"}
)  # fmt: skip

VARIANT = pa.struct([pa.field("metadata", pa.binary(), nullable=False), pa.field("value", pa.binary(), nullable=False)])
"""How a Delta ``variant`` column (Spark 4, table feature ``variantType``) is read: the Parquet
struct of its two binaries, ``metadata`` and ``value``, in the Variant binary encoding (decode
with any Variant library, or hand it back to Spark/Delta as is). pyarrow (26) has no Python
variant type to use instead. Shredded variants are a separate reader feature, refused."""

_PRIMITIVE: dict[str, pa.DataType] = {
    "string": pa.string(),
    "long": pa.int64(),
    "integer": pa.int32(),
    "short": pa.int16(),
    "byte": pa.int8(),
    "float": pa.float32(),
    "double": pa.float64(),
    "boolean": pa.bool_(),
    "binary": pa.binary(),
    "date": pa.date32(),
    "timestamp": pa.timestamp("us", tz="UTC"),
    "timestamp_ntz": pa.timestamp("us"),
    "variant": VARIANT,
}


def _type(t: Any) -> pa.DataType:
    if isinstance(t, str):
        if t in _PRIMITIVE:
            return _PRIMITIVE[t]
        m = re.fullmatch(r"decimal\((\d+),\s*(\d+)\)", t)
        if m:
            return pa.decimal128(int(m.group(1)), int(m.group(2)))
        raise ValueError(f"Delta type {t!r} is not supported by headrace-delta")
    kind = t.get("type")
    if kind == "struct":
        return pa.struct([_field(f) for f in t["fields"]])
    if kind == "array":
        return pa.list_(pa.field("element", _type(t["elementType"]), nullable=bool(t.get("containsNull", True))))
    if kind == "map":
        return pa.map_(_type(t["keyType"]), pa.field("value", _type(t["valueType"]), nullable=bool(t.get("valueContainsNull", True))))
    raise ValueError(f"Delta type {t!r} is not supported by headrace-delta")


def _field(f: Mapping[str, Any]) -> pa.Field:
    meta = f.get("metadata") or {}
    arrow_meta = {PHYSICAL_NAME: str(meta[PHYSICAL_NAME])} if PHYSICAL_NAME in meta else None
    return pa.field(f["name"], _type(f["type"]), nullable=bool(f.get("nullable", True)), metadata=arrow_meta)


def delta_schema_to_arrow(schema_string: str | Mapping[str, Any]) -> pa.Schema:
    """The Arrow schema of a Delta ``schemaString`` (logical names; the physical name of each
    column under column mapping is kept in the field metadata)."""
    doc = json.loads(schema_string) if isinstance(schema_string, str) else schema_string
    return pa.schema([_field(f) for f in doc["fields"]])


def physical_names(schema: pa.Schema) -> dict[str, str]:
    """Top-level logical name -> physical name (identity without column mapping)."""
    out = {}
    for f in schema:
        meta = f.metadata or {}
        out[f.name] = meta.get(PHYSICAL_NAME.encode(), f.name.encode()).decode()
    return out


def plain(schema: pa.Schema) -> pa.Schema:
    """``schema`` without the column-mapping metadata (what rows are emitted with)."""
    return pa.schema([_strip(f) for f in schema])


def _strip(f: pa.Field) -> pa.Field:
    t = f.type
    if pa.types.is_struct(t):
        t = pa.struct([_strip(c) for c in t])
    return pa.field(f.name, t, nullable=f.nullable)


def check_protocol(protocol: Mapping[str, Any], where: str) -> None:
    """Fail clearly when the table needs a reader feature this reader cannot honour."""
    version = int(protocol.get("minReaderVersion", 1))
    if version > 3:
        raise ValueError(
            f"{where} needs Delta reader version {version}; headrace-delta reads versions 1-3. "
            "Upgrade headrace-delta or read the table with an engine that supports it."
        )
    features = set(protocol.get("readerFeatures") or ())
    missing = sorted(features - SUPPORTED_READER_FEATURES)
    if missing:
        raise ValueError(
            f"{where} uses reader feature(s) {', '.join(missing)}, which headrace-delta cannot honour "
            f"(it supports {', '.join(sorted(SUPPORTED_READER_FEATURES))}); reading it would return wrong rows. "
            "Read the table with an engine that supports them, or disable the feature."
        )


def parse_partition_value(text: str | None, t: pa.DataType) -> Any:
    """A partition value as serialized in ``partitionValues`` (a string or null) as a Python value."""
    if text is None or (text == "" and not pa.types.is_string(t)):
        return None
    if pa.types.is_string(t):
        return text
    if pa.types.is_integer(t):
        return int(text)
    if pa.types.is_floating(t):
        return float(text)
    if pa.types.is_boolean(t):
        return text.lower() == "true"
    if pa.types.is_date(t):
        return dt.date.fromisoformat(text)
    if pa.types.is_decimal(t):
        return decimal.Decimal(text)
    if pa.types.is_binary(t):
        return text.encode("latin-1")
    if pa.types.is_timestamp(t):
        v = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
        if t.tz is not None:
            v = v.replace(tzinfo=dt.UTC) if v.tzinfo is None else v.astimezone(dt.UTC)
        return v
    raise ValueError(f"partition column of type {t} is not supported")


def schema_mismatch_hint(table: pa.Schema, data: pa.Schema, *, merge_schema: bool) -> str:
    """What differs between a Delta table's columns and a batch's, and the fix, for the error of
    a write the table refused (deltalake says only "Cannot cast schema, number of fields does not
    match: 4 vs 3"). Names compare case-insensitively, as Delta's do. Called when a write fails."""
    have = {f.name.lower(): f for f in table}
    got = {f.name.lower(): f for f in data}
    new = [f"{f.name} ({f.type})" for k, f in got.items() if k not in have]
    missing = [have[k].name for k in have if k not in got]
    changed = [f"{f.name} is {f.type} in the batch but {have[k].type} in the table" for k, f in got.items()
               if k in have and not _same_type(f.type, have[k].type)]  # fmt: skip
    renamed = [f"{f.name} to {have[k].name}" for k, f in got.items() if k in have and f.name != have[k].name]
    parts = []
    if renamed:  # deltalake refuses a second spelling of a column (Spark would take it as the same one)
        parts.append(f"column(s) spelled differently from the table's: {', '.join(renamed)}")
    if new:
        parts.append(f"new column(s) {', '.join(new)}")
    if missing:
        parts.append(f"column(s) {', '.join(missing)} missing from the batch")
    if not parts:  # the same columns: a type deltalake cannot cast (one it can is no mismatch)
        parts = changed or ["the column types differ"]
    what = "; ".join(parts)
    if (new or missing) and not merge_schema:
        fix = ("set the sink option mergeSchema=true, as Spark's Delta writer asks (.option(\"mergeSchema\", \"true\"); "
               "in a pipeline file: options = { mergeSchema = true } under [sink]): new columns are added to the "
               "table and columns missing from a batch are written as null")  # fmt: skip
    else:
        fix = ("cast the column(s) to the table's type in the query, or replace the table's schema with "
               "overwriteSchema=true (output mode 'complete')")  # fmt: skip
    if renamed:
        fix = f"rename {', '.join(renamed)} in the query" + (f"; {fix}" if new or missing else "")
    return f"the batch's columns do not match the table's: {what}. Fix: {fix}"


def _same_type(a: pa.DataType, b: pa.DataType) -> bool:
    """Equal up to the string and binary flavours Delta does not tell apart."""
    def norm(t: pa.DataType) -> pa.DataType:
        if pa.types.is_large_string(t) or pa.types.is_string_view(t):
            return pa.string()
        if pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
            return pa.binary()
        return t

    return bool(norm(a) == norm(b))
