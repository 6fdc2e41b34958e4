"""The state store's files: per-version changelogs and snapshots, checksummed Arrow IPC.

Layout of one operator's state folder (``<checkpoint>/state/<operator index>/``)::

    metadata                 JSON: format version, backend, key/value schema, operator description
                             (RocksDB: ``rocksdbKeys``, its key encoding)
    changelog/<version>      the rows put and removed by batch <version> (one file per batch)
    snapshot/<version>       every live row as of <version> (memory backend), written in the
                             background (see ``StateStore._snapshot_due``)
    rocksdb/...              the RocksDB backend's working database, and
    snapshot/<version>.rocksdb/  its RocksDB checkpoints (hard links to immutable SST files)

A changelog or snapshot file is an Arrow IPC stream followed by a 20-byte trailer: the magic
``HRSTATE1``, the CRC-32 of the stream and its length. Every file is written atomically
(temporary file, fsync, rename), so a reader sees a whole file or none; a file whose trailer or
checksum does not match is refused (``CheckpointError`` naming it), never guessed around.

Rows in a file carry the key columns, the value columns, ``__order`` (the event time the store
evicts by, or null) and ``__op`` (0 = put, 1 = remove), in the order they were applied.
"""

from __future__ import annotations

import contextlib
import os
import struct
import zlib

import pyarrow as pa

from headrace.checkpoint import atomic_write
from headrace.errors import CheckpointError

__all__ = [
    "OP_COLUMN",
    "OP_PUT",
    "OP_REMOVE",
    "ORDER_COLUMN",
    "discard_after",
    "list_versions",
    "purge",
    "read_state_file",
    "remove_quietly",
    "remove_temporaries",
    "write_state_file",
]

MAGIC = b"HRSTATE1"
TRAILER = struct.Struct(">8sIQ")  # magic, crc32, payload length
ORDER_COLUMN = "__order"
OP_COLUMN = "__op"
OP_PUT = 0
OP_REMOVE = 1


def write_state_file(
    path: str, schema: pa.Schema, tables: list[pa.Table], *, durable: bool = True, sync_dir: bool = False
) -> int:
    """Write ``tables`` (all of ``schema``) as one checksummed file, atomically (with ``sync_dir``
    the folder is fsynced after the rename, so the name survives a power loss too). Returns its
    size."""
    sink = pa.BufferOutputStream()  # in Arrow's memory: no Python call per write, as io.BytesIO makes
    with pa.ipc.new_stream(sink, schema) as writer:
        for t in tables:
            if t.num_rows:
                writer.write_table(t)
    payload = sink.getvalue()
    trailer = TRAILER.pack(MAGIC, zlib.crc32(payload), payload.size)
    atomic_write(path, [payload, trailer], durable=durable, sync_dir=sync_dir)  # not joined: no copy
    return payload.size + len(trailer)


def read_state_file(path: str) -> pa.Table:
    """Read and verify a file written by :func:`write_state_file`.

    Raises ``CheckpointError`` naming the file when it is missing, truncated, or fails its
    checksum."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise CheckpointError(
            f"state file {path} is missing, but the checkpoint needs it to restore the operator's state; "
            "restore the file, or roll the query back with `headrace checkpoint reset <dir> --to-batch N` "
            "to a batch whose state is complete"
        ) from None
    fix = (
        "it was not written whole by headrace's atomic writer (disk damage or an outside edit); restore it "
        "from a backup, or start the query over with a new checkpointLocation"
    )
    if len(data) < TRAILER.size:
        raise CheckpointError(f"state file {path} is damaged (only {len(data)} bytes); {fix}")
    magic, crc, length = TRAILER.unpack(data[-TRAILER.size :])
    payload = data[: -TRAILER.size]
    if magic != MAGIC or length != len(payload):
        raise CheckpointError(f"state file {path} is damaged (bad trailer); {fix}")
    if zlib.crc32(payload) != crc:
        raise CheckpointError(f"state file {path} is damaged (checksum mismatch); {fix}")
    try:
        return pa.ipc.open_stream(payload).read_all()
    except pa.ArrowInvalid as e:  # pragma: no cover - the checksum catches damage first
        raise CheckpointError(f"state file {path} is damaged ({e}); {fix}") from None


def list_versions(folder: str, suffix: str = "") -> list[int]:
    """The versions with a file (``<n><suffix>``) in ``folder``, ascending (temporary files
    are skipped: see :func:`remove_temporaries`)."""
    out = []
    try:
        names = os.listdir(folder)
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
        for name in os.listdir(folder):
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
    for name in os.listdir(folder):
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
        names = os.listdir(folder)
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
