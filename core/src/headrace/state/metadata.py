"""A state folder's ``metadata`` file: what wrote it (format version, backend, key and value
schemas, the operator and its description, backend fields such as the RocksDB key encoding),
checked when a store opens so that state is never read by a different operator, a changed
query or another backend.

The operator's description (``operatorSpec``) is a small JSON object each stateful operator
builds (``StatefulOperator.state_spec``): what its state means (aggregate functions and their
inputs, the window, the grouping or deduplication keys, the event-time column state is evicted
by, the output mode where it decides what state keeps). Two descriptions are equal exactly when
the state one wrote is right for the other; a folder whose description differs from the
query's is refused, naming each field that changed. A folder written before descriptions
existed has none: the query's is recorded in it on its first start (docs/decisions.md).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Mapping
from typing import Any

import pyarrow as pa

from headrace.checkpoint import atomic_write
from headrace.errors import CheckpointError

__all__ = ["FORMAT_VERSION", "SPEC_FIELD", "check_metadata", "schema_doc", "spec_changes"]

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
#: the metadata field holding the operator's description
SPEC_FIELD = "operatorSpec"

_START_OVER = (
    "start the changed query with a new checkpointLocation (its state then starts empty, and its sources start "
    "where their starting options say), or run the query unchanged on this checkpoint; `headrace checkpoint reset` "
    "does not help (it rolls batches back; the state folder keeps the operator that wrote it)"
)


def schema_doc(schema: pa.Schema) -> list[list[str]]:
    return [[f.name, str(f.type)] for f in schema]


def spec_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """The fields in which two operator descriptions differ, as ``"field: OLD before, NEW now"``
    (in the stored description's order, then the new fields). Pure; called by
    :func:`check_metadata` when a store opens."""
    out = []
    for k in [*old, *(k for k in new if k not in old)]:
        a, b = old.get(k), new.get(k)
        if a != b:
            out.append(f"{k}: {_show(a)} before, {_show(b)} now")
    return out


def _show(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, list):
        return "[" + ", ".join(_show(v) for v in value) + "]"
    return str(value)


def check_metadata(
    folder: str, doc: dict[str, Any], *, durable: bool = True, write: Callable[[str, bytes], None] | None = None
) -> dict[str, Any]:
    """Write ``doc`` as ``<folder>/metadata`` when there is none, else check the stored one
    against it: backend, the operator's description (``operatorSpec``, when ``doc`` has one),
    key and value schemas. Returns the folder's document (the stored one: backend fields keep
    the values the folder was created with). Raises ``CheckpointError`` with the fix when it
    does not match or cannot be read. Called once per store open, on the thread opening it.

    A stored document without a description (written before descriptions existed) is
    accepted when its backend and schemas match, and ``doc``'s description is recorded in it
    (an atomic write), so that a later change of the query is refused.

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
    if not isinstance(old, dict):
        raise CheckpointError(
            f"state metadata {path} is corrupt (a JSON {type(old).__name__}, not an object); restore it or use a new "
            "checkpointLocation"
        )
    fix = "use a new checkpointLocation for the changed query (state cannot be carried over)"
    if old.get("backend") != doc["backend"]:
        raise CheckpointError(
            f"state in {folder} was written by the '{old.get('backend')}' state store, and this query uses "
            f"'{doc['backend']}'; set the writer option stateStore={old.get('backend')!r}, or {fix}"
        )
    spec = doc.get(SPEC_FIELD)
    old_spec = old.get(SPEC_FIELD)
    if spec is not None:
        spec = json.loads(json.dumps(spec))  # as it reads back (lists, not tuples)
        if old_spec is not None and not isinstance(old_spec, dict):
            raise CheckpointError(
                f"state metadata {path} is corrupt ({SPEC_FIELD} is {old_spec!r}, not an object); restore it or use "
                "a new checkpointLocation"
            )
        if old_spec is not None and old_spec != spec:
            raise CheckpointError(
                f"state in {folder} was written by a different query: {'; '.join(spec_changes(old_spec, spec))} "
                f"(the stored operator: {old.get('operator')}; this query's: {doc.get('operator')}), and its state "
                f"cannot be carried over. Fix: {_START_OVER}"
            )
    if old.get("keySchema") != doc["keySchema"] or old.get("valueSchema") != doc["valueSchema"]:
        raise CheckpointError(
            f"state in {folder} was written by a different stateful operator ({old.get('operator')!r}, keys "
            f"{old.get('keySchema')}, values {old.get('valueSchema')}); this query's is {doc['operator']!r} "
            f"(keys {doc['keySchema']}, values {doc['valueSchema']}); {fix}"
        )
    if spec is not None and old_spec is None:
        if old.get("operator") != doc.get("operator"):
            log.warning(
                "state in %s has no operator description (written by an older headrace) and was written by %r; this "
                "query's operator is %r. Its keys and values match, so it is used, and this query's description is "
                "recorded: if the query changed what it aggregates, restart it with a new checkpointLocation",
                folder, old.get("operator"), doc.get("operator"),
            )  # fmt: skip
        old = {**old, SPEC_FIELD: spec}
        atomic_write(path, json.dumps(old, indent=1).encode(), durable=durable)
        log.info("state in %s: recorded the operator description %s", folder, spec)
    return dict(old)
