"""A state folder's ``metadata`` file: what wrote it (format version, backend, key and value
schemas, the operator, backend fields such as the RocksDB key encoding), checked when a store
opens so that state is never read by a different operator or backend."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from headrace.checkpoint import atomic_write
from headrace.errors import CheckpointError

__all__ = ["FORMAT_VERSION", "check_metadata", "schema_doc"]

FORMAT_VERSION = 1


def schema_doc(schema: pa.Schema) -> list[list[str]]:
    return [[f.name, str(f.type)] for f in schema]


def check_metadata(
    folder: str, doc: dict[str, Any], *, durable: bool = True, write: Callable[[str, bytes], None] | None = None
) -> dict[str, Any]:
    """Write ``doc`` as ``<folder>/metadata`` when there is none, else check the stored one
    against it (backend, key and value schemas). Returns the folder's document (the stored
    one: backend fields keep the values the folder was created with). Raises
    ``CheckpointError`` with the fix when it does not match or cannot be read.

    ``write(path, data)``, when given, writes a new folder's file instead of an atomic write
    here (the store defers it to its I/O threads, ahead of its first changelog)."""
    path = os.path.join(folder, "metadata")
    try:
        with open(path, "rb") as f:
            old = json.loads(f.read())
    except FileNotFoundError:
        data = json.dumps(doc, indent=1).encode()
        if write is not None:
            write(path, data)
        else:
            atomic_write(path, data, durable=durable)
        return doc
    except ValueError as e:
        raise CheckpointError(f"state metadata {path} is corrupt ({e}); restore it or use a new checkpointLocation") from None
    fix = "use a new checkpointLocation for the changed query (state cannot be carried over)"
    if old.get("backend") != doc["backend"]:
        raise CheckpointError(
            f"state in {folder} was written by the '{old.get('backend')}' state store, and this query uses "
            f"'{doc['backend']}'; set the writer option stateStore={old.get('backend')!r}, or {fix}"
        )
    if old.get("keySchema") != doc["keySchema"] or old.get("valueSchema") != doc["valueSchema"]:
        raise CheckpointError(
            f"state in {folder} was written by a different stateful operator ({old.get('operator')!r}, keys "
            f"{old.get('keySchema')}, values {old.get('valueSchema')}); this query's is {doc['operator']!r} "
            f"(keys {doc['keySchema']}, values {doc['valueSchema']}); {fix}"
        )
    return dict(old)
