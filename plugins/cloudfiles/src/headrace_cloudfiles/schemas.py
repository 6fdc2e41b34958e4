"""Schema versions under ``cloudFiles.schemaLocation`` (``_schemas/0``, ``_schemas/1``, ...).

Each version is a small JSON document: the data columns (as Arrow IPC, base64, and as DDL for
people), the partition columns, why it was written and when. Version 0 is the inferred schema;
schema evolution (``addNewColumns``) writes the next version and fails the batch, and a restart
reads the latest one. Writes are atomic (temporary file + rename).
"""

from __future__ import annotations

import base64
import json
import os
import threading
import time
from dataclasses import dataclass

import pyarrow as pa

from headrace.errors import HeadraceError
from headrace.helpers.durable import atomic_write
from headrace.sql_types import arrow_to_spark_name, ddl_to_schema

__all__ = ["SchemaStore", "SchemaVersion", "apply_hints"]


@dataclass(frozen=True)
class SchemaVersion:
    """One stored version: data columns (before hints) and partition column names."""

    version: int
    data: pa.Schema
    partition_columns: tuple[str, ...]


def _encode(schema: pa.Schema) -> str:
    return base64.b64encode(schema.serialize().to_pybytes()).decode()


def _decode(text: str) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text)))


def ddl(schema: pa.Schema) -> str:
    """``a BIGINT, b STRING`` for a schema (for people reading the stored versions)."""
    return ", ".join(f"`{f.name}` {arrow_to_spark_name(f.type)}" for f in schema)


def apply_hints(schema: pa.Schema, hints: str | None) -> pa.Schema:
    """``schema`` with the types of ``cloudFiles.schemaHints`` (``"a INT, b STRING"``); hinted
    columns the schema lacks are added. Raises HeadraceError naming a bad hint."""
    if not hints:
        return schema
    try:
        hinted = ddl_to_schema(hints)
    except ValueError as e:
        raise HeadraceError(f"cloudFiles.schemaHints {hints!r}: {e}") from e
    fields = {f.name: f for f in schema}
    for h in hinted:
        fields[h.name] = pa.field(h.name, h.type)
    return pa.schema(list(fields.values()))


class SchemaStore:
    """The schema versions in ``<location>/_schemas``. Local folders only."""

    def __init__(self, location: str) -> None:
        if "://" in location and not location.startswith("file://"):
            raise HeadraceError(
                f"cloudFiles.schemaLocation {location!r}: only local folders are supported so far; "
                "use a local folder (e.g. next to the checkpoint)"
            )
        self.folder = os.path.join(os.path.abspath(location.removeprefix("file://")), "_schemas")
        self._lock = threading.RLock()

    def _versions(self) -> list[int]:
        if not os.path.isdir(self.folder):
            return []
        return sorted(int(n) for n in os.listdir(self.folder) if n.isdigit())

    def latest(self) -> SchemaVersion | None:
        """The newest stored version, or None when nothing is stored yet."""
        versions = self._versions()
        if not versions:
            return None
        path = os.path.join(self.folder, str(versions[-1]))
        try:
            with open(path, encoding="utf-8") as f:
                doc = json.load(f)
            return SchemaVersion(int(doc["version"]), _decode(doc["schema"]), tuple(doc.get("partitionColumns", ())))
        except (OSError, ValueError, KeyError, pa.ArrowInvalid) as e:
            raise HeadraceError(
                f"schema file {path} is unreadable ({e}); fix or delete it (the previous version is then used)"
            ) from e

    def write(self, data: pa.Schema, partition_columns: tuple[str, ...], reason: str) -> SchemaVersion:
        """Store a new version (the next number) and return it."""
        with self._lock:
            try:
                os.makedirs(self.folder, exist_ok=True)
            except OSError as e:
                raise HeadraceError(
                    f"cloudFiles.schemaLocation: cannot create {self.folder} ({e.strerror or e}); give a folder this "
                    "process can create and write"
                ) from None
            versions = self._versions()
            n = versions[-1] + 1 if versions else 0
            doc = {
                "version": n,
                "ddl": ddl(data),
                "schema": _encode(data),
                "partitionColumns": list(partition_columns),
                "reason": reason,
                "createdAt": int(time.time() * 1000),
            }
            atomic_write(os.path.join(self.folder, str(n)), json.dumps(doc, indent=1).encode())
            return SchemaVersion(n, data, partition_columns)

    def add_columns(self, new: list[pa.Field], reason: str) -> tuple[SchemaVersion, list[str]]:
        """Add the columns of ``new`` the latest version lacks; returns the latest version and
        the names actually added (none when another reader added them first)."""
        with self._lock:
            cur = self.latest()
            if cur is None:
                raise HeadraceError(f"no schema stored in {self.folder} to evolve")
            missing = [f for f in new if f.name not in cur.data.names and f.name not in cur.partition_columns]
            if not missing:
                return cur, []
            evolved = pa.schema([*cur.data, *missing])
            return self.write(evolved, cur.partition_columns, reason), [f.name for f in missing]
