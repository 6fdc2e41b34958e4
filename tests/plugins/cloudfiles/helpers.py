"""Helpers for the cloudFiles tests: writing files, running a query to the end, reading output."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pyarrow as pa

import headrace as hr
from headrace.connectors.files import read_files


def write_json(folder: Path | str, name: str, rows: list[dict[str, Any]], *, atomic: bool = True) -> Path:
    """Write newline-delimited JSON (atomically: temp file + rename, as producers should)."""
    path = Path(folder) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    data = "".join(json.dumps(r) + "\n" for r in rows)
    if atomic:
        tmp = path.parent / f".{path.name}.tmp"
        tmp.write_text(data)
        os.replace(tmp, path)
    else:
        path.write_text(data)
    return path


def run(
    path: str | Path,
    out: Path,
    chk: Path,
    *,
    schema: str | None = None,
    trigger: dict[str, Any] | None = None,
    **options: Any,
) -> hr.StreamingQuery:
    """Run ``cloudFiles`` -> ``files`` (arrow) with ``trigger`` (available_now) to the end."""
    reader = hr.read_stream.format("cloudFiles").options(options)
    if schema is not None:
        reader = reader.schema(schema)
    q = (
        reader.load(str(path))
        .write_stream.format("files")
        .option("format", "arrow")
        .option("checkpointLocation", str(chk))
        .trigger(**(trigger or {"available_now": True}))
        .start(str(out))
    )
    q.await_termination(60)
    return q


def output(out: Path) -> pa.Table:
    """Every row the files sink committed; files written with different schemas (schema
    evolution) are unified, missing columns as nulls."""
    parts = sorted(p for p in Path(out).rglob("part-*.arrow") if "_staging" not in p.parts)
    if not parts:
        return read_files(str(out), "arrow")
    tables = []
    for p in parts:
        with pa.memory_map(str(p)) as f:
            tables.append(pa.ipc.open_file(f).read_all())
    return pa.concat_tables(tables, promote_options="default")
