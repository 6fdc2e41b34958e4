"""Spark SQL type names <-> Arrow types, and DDL schema strings (``"a INT, b STRING"``)."""

from __future__ import annotations

import re

import pyarrow as pa

__all__ = ["arrow_to_spark_name", "ddl_to_schema", "parse_schema", "parse_type"]

_SIMPLE: dict[str, pa.DataType] = {
    "string": pa.string(),
    "varchar": pa.string(),
    "char": pa.string(),
    "text": pa.string(),
    "binary": pa.binary(),
    "boolean": pa.bool_(),
    "bool": pa.bool_(),
    "tinyint": pa.int8(),
    "byte": pa.int8(),
    "smallint": pa.int16(),
    "short": pa.int16(),
    "int": pa.int32(),
    "integer": pa.int32(),
    "bigint": pa.int64(),
    "long": pa.int64(),
    "float": pa.float32(),
    "real": pa.float32(),
    "double": pa.float64(),
    "date": pa.date32(),
    "timestamp": pa.timestamp("us", tz="UTC"),
    "timestamp_ltz": pa.timestamp("us", tz="UTC"),
    "timestamp_ntz": pa.timestamp("us"),
}


def _split_top(text: str, sep: str = ",") -> list[str]:
    """Split on ``sep`` outside of <>, () brackets."""
    out: list[str] = []
    depth = 0
    cur: list[str] = []
    for ch in text:
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth -= 1
        if ch == sep and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if "".join(cur).strip():
        out.append("".join(cur))
    return [p.strip() for p in out]


def parse_type(text: str) -> pa.DataType:
    """A Spark SQL type name (``INT``, ``DECIMAL(10,2)``, ``ARRAY<STRING>``, ``MAP<STRING,INT>``,
    ``STRUCT<a: INT, b: STRING>``) as an Arrow type. Raises ValueError naming the bad type."""
    t = text.strip()
    low = t.lower()
    if low in _SIMPLE:
        return _SIMPLE[low]
    m = re.fullmatch(r"(?:decimal|numeric|dec)\s*(?:\(\s*(\d+)\s*(?:,\s*(\d+)\s*)?\))?", low)
    if m:
        return pa.decimal128(int(m.group(1) or 10), int(m.group(2) or 0))
    m = re.fullmatch(r"(?:varchar|char)\s*\(\s*\d+\s*\)", low)
    if m:
        return pa.string()
    m = re.fullmatch(r"array\s*<(.*)>", t, flags=re.I | re.S)
    if m:
        return pa.list_(parse_type(m.group(1)))
    m = re.fullmatch(r"map\s*<(.*)>", t, flags=re.I | re.S)
    if m:
        kv = _split_top(m.group(1))
        if len(kv) != 2:
            raise ValueError(f"MAP needs a key and a value type: {text!r}")
        return pa.map_(parse_type(kv[0]), parse_type(kv[1]))
    m = re.fullmatch(r"struct\s*<(.*)>", t, flags=re.I | re.S)
    if m:
        fields = []
        for part in _split_top(m.group(1)):
            name, _, typ = part.partition(":") if ":" in part.split("<")[0] else part.partition(" ")
            fields.append(pa.field(name.strip().strip("`"), parse_type(typ)))
        return pa.struct(fields)
    raise ValueError(
        f"unknown type {text!r}; use a Spark SQL type such as STRING, INT, BIGINT, DOUBLE, BOOLEAN, "
        "DATE, TIMESTAMP, DECIMAL(p,s), BINARY, ARRAY<T>, MAP<K,V>, STRUCT<a: T>"
    )


def ddl_to_schema(ddl: str) -> pa.Schema:
    """``"a INT, b STRING NOT NULL"`` as a ``pyarrow.Schema``. Raises ValueError naming the part."""
    fields = []
    for part in _split_top(ddl):
        m = re.fullmatch(r"(`[^`]+`|[^\s:]+)\s*:?\s+(.+?)(\s+not\s+null)?", part.strip(), flags=re.I | re.S)
        if not m:
            raise ValueError(f"cannot read column definition {part!r}; write it as 'name TYPE', e.g. 'id BIGINT'")
        name = m.group(1).strip("`")
        fields.append(pa.field(name, parse_type(m.group(2)), nullable=m.group(3) is None))
    return pa.schema(fields)


def arrow_to_spark_name(t: pa.DataType) -> str:
    """The Spark SQL name of an Arrow type (for messages and docs)."""
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "STRING"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return "BINARY"
    for name, typ in _SIMPLE.items():
        if typ == t and name.upper() in {"BOOLEAN", "TINYINT", "SMALLINT", "INT", "BIGINT", "FLOAT", "DOUBLE",
                                         "DATE", "TIMESTAMP", "TIMESTAMP_NTZ"}:  # fmt: skip
            return name.upper()
    if pa.types.is_timestamp(t):
        return "TIMESTAMP" if t.tz else "TIMESTAMP_NTZ"
    if pa.types.is_decimal(t):
        return f"DECIMAL({t.precision},{t.scale})"
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return f"ARRAY<{arrow_to_spark_name(t.value_type)}>"
    if pa.types.is_map(t):
        return f"MAP<{arrow_to_spark_name(t.key_type)},{arrow_to_spark_name(t.item_type)}>"
    if pa.types.is_struct(t):
        return "STRUCT<" + ", ".join(f"{f.name}: {arrow_to_spark_name(f.type)}" for f in t) + ">"
    return str(t).upper()


def parse_schema(schema: pa.Schema | str) -> pa.Schema:
    """A ``pyarrow.Schema``, or a DDL string like ``"a INT, b STRING, c TIMESTAMP"``. Called when
    a frame or a reader is given a schema (once per call, on the caller's thread)."""
    if isinstance(schema, pa.Schema):
        return schema
    return ddl_to_schema(schema)
