"""The state store's files: per-version changelogs and snapshots, checksummed Arrow IPC.

Layout of one operator's state folder (``<checkpoint>/state/<operator index>/``)::

    metadata                 JSON: format version, backend, key/value schema, operator description
                             (RocksDB: ``rocksdbKeys``, its key encoding)
    changelog/<version>      the rows put and removed by batch <version> (one file per batch)
    snapshot/<version>       every live row as of <version> (memory backend), written in the
                             background (see ``StateStore._snapshot_due``)
    rocksdb/...              the RocksDB backend's working database, and
    snapshot/<version>.rocksdb/  its RocksDB checkpoints (hard links to immutable SST files)

A changelog or snapshot file is an Arrow IPC stream, then what the file holds (JSON: the query
id, the operator, the partition, the kind -- ``changelog`` or ``snapshot`` -- and the version),
then a 24-byte trailer: the magic ``HRSTATE2``, the CRC-32 of the stream and that JSON, and
their lengths. Every file is written atomically (temporary file, fsync, rename), so a reader
sees a whole file or none; a file whose trailer or checksum does not match, that holds
another version, kind, operator, partition or query than the one its path and its store say
(a file copied over another), or that is not a file at all (a folder in its place), is refused
(``CheckpointError`` naming it), never guessed around. Files of the earlier format (magic
``HRSTATE1``, no identity) are read only where the folder's ``metadata`` allows it: versions
before the one from which the folder records identities (``identitySince``, set when a folder
written by an earlier headrace is first opened).

Rows in a file carry the key columns, the value columns, ``__order`` (the event time the store
evicts by, or null) and ``__op`` (0 = put, 1 = remove), in the order they were applied.
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
import zlib
from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from headrace.checkpoint import atomic_write
from headrace.errors import CheckpointError

__all__ = [
    "OP_COLUMN",
    "OP_PUT",
    "OP_REMOVE",
    "ORDER_COLUMN",
    "discard_after",
    "file_identity",
    "layout_problem",
    "list_versions",
    "purge",
    "read_state_file",
    "remove_quietly",
    "remove_temporaries",
    "write_state_file",
]

MAGIC = b"HRSTATE2"
TRAILER = struct.Struct(">8sIQI")  # magic, crc32 of stream and identity, stream length, identity length
LEGACY_MAGIC = b"HRSTATE1"
LEGACY_TRAILER = struct.Struct(">8sIQ")  # magic, crc32, payload length (no identity)
#: what a file's identity records, in this order
IDENTITY_FIELDS = ("query", "operator", "partition", "kind", "version")
ORDER_COLUMN = "__order"
OP_COLUMN = "__op"
OP_PUT = 0
OP_REMOVE = 1


def file_identity(query: str, operator: str, partition: int, kind: str, version: int) -> dict[str, Any]:
    """What a state file holds: written into it and compared when it is read back."""
    return {"query": query, "operator": operator, "partition": partition, "kind": kind, "version": version}


def write_state_file(
    path: str,
    schema: pa.Schema,
    tables: list[pa.Table],
    *,
    identity: Mapping[str, Any],
    durable: bool = True,
    sync_dir: bool = False,
) -> int:
    """Write ``tables`` (all of ``schema``) as one checksummed file recording ``identity``
    (:func:`file_identity`), atomically (with ``sync_dir`` the folder is fsynced after the
    rename, so the name survives a power loss too). Returns its size. Called by the store's
    commit (on a state I/O thread) and by snapshots (on a snapshot thread)."""
    sink = pa.BufferOutputStream()  # in Arrow's memory: no Python call per write, as io.BytesIO makes
    with pa.ipc.new_stream(sink, schema) as writer:
        for t in tables:
            if t.num_rows:
                writer.write_table(t)
    payload = sink.getvalue()
    ident = json.dumps({k: identity[k] for k in IDENTITY_FIELDS}, separators=(",", ":")).encode()
    trailer = TRAILER.pack(MAGIC, zlib.crc32(ident, zlib.crc32(payload)), payload.size, len(ident))
    atomic_write(path, [payload, ident, trailer], durable=durable, sync_dir=sync_dir)  # not joined: no copy
    return payload.size + len(ident) + len(trailer)


def read_state_file(path: str, expect: Mapping[str, Any] | None = None, *, legacy: bool = False) -> pa.Table:
    """Read and verify a file written by :func:`write_state_file`; with ``expect`` (a
    :func:`file_identity`) also that it holds what ``expect`` says. ``legacy``: a file of the
    earlier format without identity (``HRSTATE1``) is accepted (the store allows it for the
    versions an earlier headrace wrote). Called when a store restores or snapshots, on the
    thread doing that.

    Raises ``CheckpointError`` naming the file when it is missing, not a file, truncated,
    fails its checksum, or holds something else than ``expect``."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise CheckpointError(
            f"state file {path} is missing, but the checkpoint needs it to restore the operator's state; "
            "restore the file, or roll the query back with `headrace checkpoint reset <dir> --to-batch N` "
            "to a batch whose state is complete"
        ) from None
    except (IsADirectoryError, NotADirectoryError, PermissionError) as e:
        raise CheckpointError(
            f"state file {path} cannot be read ({e.strerror or e}: {layout_problem(path)}); the checkpoint's layout "
            "was changed outside headrace; restore the file from a backup, or start the query over with a new "
            "checkpointLocation"
        ) from None
    fix = (
        "it was not written whole by headrace's atomic writer (disk damage or an outside edit); restore it "
        "from a backup, or start the query over with a new checkpointLocation"
    )
    if len(data) >= LEGACY_TRAILER.size and data[-LEGACY_TRAILER.size : -LEGACY_TRAILER.size + 8] == LEGACY_MAGIC:
        if not legacy:
            raise CheckpointError(
                f"state file {path} is of the format of an earlier headrace (HRSTATE1), which does not record the "
                "query, operator and version it holds, in a state folder whose files must record them (a file "
                "copied from an older checkpoint?); restore this folder's own file, or start the query over with "
                "a new checkpointLocation"
            )
        magic, crc, length = LEGACY_TRAILER.unpack(data[-LEGACY_TRAILER.size :])
        payload, ident = data[: -LEGACY_TRAILER.size], b""
        if length != len(payload):
            raise CheckpointError(f"state file {path} is damaged (bad trailer); {fix}")
        if zlib.crc32(payload) != crc:
            raise CheckpointError(f"state file {path} is damaged (checksum mismatch); {fix}")
    else:
        if len(data) < TRAILER.size:
            raise CheckpointError(f"state file {path} is damaged (only {len(data)} bytes); {fix}")
        magic, crc, length, ident_len = TRAILER.unpack(data[-TRAILER.size :])
        body = data[: -TRAILER.size]
        if magic != MAGIC or length + ident_len != len(body):
            raise CheckpointError(f"state file {path} is damaged (bad trailer); {fix}")
        if zlib.crc32(body) != crc:
            raise CheckpointError(f"state file {path} is damaged (checksum mismatch); {fix}")
        payload, ident = body[:length], body[length:]
        if expect is not None:
            _check_identity(path, ident, expect, fix)
    try:
        return pa.ipc.open_stream(payload).read_all()
    except pa.ArrowInvalid as e:  # pragma: no cover - the checksum catches damage first
        raise CheckpointError(f"state file {path} is damaged ({e}); {fix}") from None


def _check_identity(path: str, ident: bytes, expect: Mapping[str, Any], fix: str) -> None:
    try:
        got = json.loads(ident)
    except ValueError as e:
        raise CheckpointError(f"state file {path} is damaged (its identity is not JSON: {e}); {fix}") from None
    if not isinstance(got, dict):
        raise CheckpointError(f"state file {path} is damaged (its identity is not a JSON object); {fix}")
    wrong = [f"{k} {got.get(k)!r} (expected {expect[k]!r})" for k in IDENTITY_FIELDS if got.get(k) != expect[k]]
    if wrong:
        raise CheckpointError(
            f"state file {path} is not the file this path must hold: it records {', '.join(wrong)}, so it was "
            "copied or moved here from another version, operator, partition or query; restore this path's own "
            "file from a backup, or roll the query back with `headrace checkpoint reset <dir> --to-batch N` to a "
            "batch before it, or start the query over with a new checkpointLocation"
        )


def layout_problem(path: str) -> str:
    """What is in the way at ``path`` (for errors about a damaged layout)."""
    if os.path.isdir(path):
        return "a folder where a file belongs"
    parent = os.path.dirname(path)
    while parent and not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if parent and not os.path.isdir(parent):
        return f"{parent} is a file where a folder belongs"
    return "not readable"


def _listdir(folder: str) -> list[str]:
    """``os.listdir``, with a file where the folder belongs refused as ``CheckpointError``."""
    try:
        return os.listdir(folder)
    except NotADirectoryError:
        raise CheckpointError(
            f"state folder {folder} is a file, not a folder; the checkpoint's layout was changed outside headrace; "
            "restore the folder from a backup, or start the query over with a new checkpointLocation"
        ) from None


def list_versions(folder: str, suffix: str = "") -> list[int]:
    """The versions with a file (``<n><suffix>``) in ``folder``, ascending (temporary files
    are skipped: see :func:`remove_temporaries`)."""
    out = []
    try:
        names = _listdir(folder)
    except FileNotFoundError:
        return []
    for n in names:
        if n.endswith(".tmp"):
            continue
        stem = n[: len(n) - len(suffix)] if suffix and n.endswith(suffix) else (n if not suffix else "")
        if stem.isdigit():
            out.append(int(stem))
    return sorted(out)


def discard_after(state: str, version: int) -> None:
    """Delete the changelogs and snapshots of versions after ``version`` in the state folder
    ``state`` (written by a run that died before its batch committed)."""
    for sub in ("changelog", "snapshot"):
        folder = os.path.join(state, sub)
        for name in _listdir(folder):
            stem = name.split(".", 1)[0]
            if stem.isdigit() and int(stem) > version:
                remove_quietly(os.path.join(folder, name))


def purge(state: str, oldest: int, snapshots: list[int]) -> None:
    """Retention: keep what restores any version from ``oldest`` on — the newest of
    ``snapshots`` at or before it and every changelog after that snapshot; delete the rest."""
    if oldest <= 0:
        return
    older = [s for s in snapshots if s <= oldest]
    if not older:
        return
    base = older[-1]
    folder = os.path.join(state, "snapshot")
    for name in _listdir(folder):
        stem = name.split(".", 1)[0]
        if stem.isdigit() and int(stem) < base:
            remove_quietly(os.path.join(folder, name))
    changelogs = os.path.join(state, "changelog")
    for v in list_versions(changelogs):
        if v <= base:
            remove_quietly(os.path.join(changelogs, str(v)))


def remove_temporaries(folder: str) -> None:
    """Delete the temporary files (``*.tmp``) an interrupted write left in ``folder``. Only
    when no write can be under way (a background snapshot writes one while it runs)."""
    try:
        names = _listdir(folder)
    except FileNotFoundError:
        return
    for n in names:
        if n.endswith(".tmp"):
            remove_quietly(os.path.join(folder, n))


def remove_quietly(path: str) -> None:
    """Delete a file or a folder, ignoring one that is already gone."""
    import shutil

    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
