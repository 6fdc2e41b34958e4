"""Helpers for the delta plugin's tests: tables made with deltalake, streams run to the end."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any, Literal

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

import headrace as hr

__all__ = ["append", "read_values", "run_stream", "wait_for"]


def append(
    path: str,
    values: list[int],
    *,
    mode: Literal["error", "append", "overwrite", "ignore"] = "append",
    **columns: Any,
) -> None:
    """Write rows ``v`` (int64) plus extra columns (lists or scalars) in one commit."""
    data: dict[str, Any] = {"v": pa.array(values, pa.int64())}
    for name, col in columns.items():
        if name in ("partition_by", "schema_mode", "storage_options", "configuration"):
            continue
        data[name] = col if isinstance(col, list | pa.Array) else [col] * len(values)
    kw = {k: columns[k] for k in ("partition_by", "schema_mode", "storage_options", "configuration") if k in columns}
    write_deltalake(path, pa.table(data), mode=mode, **kw)


def read_values(path: str, column: str = "v", **kw: Any) -> list[int]:
    """The ``column`` values of the table's current snapshot, sorted."""
    return sorted(DeltaTable(path, **kw).to_pyarrow_table().column(column).to_pylist())


def run_stream(
    path: str,
    checkpoint: str | None = None,
    *,
    trigger: dict[str, Any] | None = None,
    **options: Any,
) -> list[tuple[int, pa.Table]]:
    """Run a delta source to a memory of batches with ``trigger`` (available_now by default);
    returns ``[(batch_id, table), ...]``. Raises the query's exception."""
    got: list[tuple[int, pa.Table]] = []
    lock = threading.Lock()

    def collect(table: pa.Table, batch_id: int) -> None:
        with lock:
            got.append((batch_id, table))

    writer = hr.read_stream.format("delta").options(options).load(path).write_stream.foreach_batch(collect)
    if checkpoint is not None:
        writer = writer.option("checkpointLocation", checkpoint)
    q = writer.query_name("delta-test").trigger(**(trigger or {"available_now": True})).start()
    q.await_termination(60)
    return got


def rows(batches: list[tuple[int, pa.Table]], column: str = "v") -> list[Any]:
    return [x for _, t in batches if t.num_rows for x in t.column(column).to_pylist()]


def wait_for(cond: Callable[[], bool], timeout: float = 20.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def data_files(path: str) -> list[str]:
    out = []
    for root, dirs, files in os.walk(path):
        dirs[:] = [d for d in dirs if not d.startswith("_")]
        out += [os.path.join(root, f) for f in files if f.endswith(".parquet")]
    return out


_Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"


def _z85(data: bytes) -> str:
    data = data + b"\0" * (-len(data) % 4)
    out = []
    for i in range(0, len(data), 4):
        n = int.from_bytes(data[i : i + 4], "big")
        chunk = []
        for _ in range(5):
            n, r = divmod(n, 85)
            chunk.append(_Z85[r])
        out.append("".join(reversed(chunk)))
    return "".join(out)


def _roaring(rows: list[int]) -> bytes:
    """Delta's RoaringBitmapArray (magic, one 32-bit portable roaring bitmap, one array container)."""
    import struct

    rows = sorted(rows)
    body = struct.pack("<II", 12346, 1) + struct.pack("<HH", 0, len(rows) - 1)
    body += struct.pack("<I", len(body) + 4) + b"".join(struct.pack("<H", r) for r in rows)
    return struct.pack("<iq", 1681511377, 1) + struct.pack("<i", 0) + body


def delete_with_deletion_vector(path: str, rows: list[int]) -> int:
    """Commit a DELETE as Spark/Databricks do with deletion vectors (delta-rs cannot write them):
    the first data file is removed and re-added with an inline deletion vector of ``rows``.
    Returns the new version."""
    import json

    dt = DeltaTable(path)
    version = dt.version() + 1
    add = pa.table(dt.get_add_actions(flatten=True)).to_pylist()[0]
    raw = _roaring(rows)
    dv = {"storageType": "i", "pathOrInlineDv": _z85(raw), "sizeInBytes": len(raw), "cardinality": len(rows)}
    actions = [
        {"commitInfo": {"timestamp": int(time.time() * 1000), "operation": "DELETE"}},
        {"protocol": {"minReaderVersion": 3, "minWriterVersion": 7, "readerFeatures": ["deletionVectors"],
                      "writerFeatures": ["deletionVectors"]}},
        {"remove": {"path": add["path"], "dataChange": True, "deletionTimestamp": 1, "size": add["size_bytes"]}},
        {"add": {"path": add["path"], "partitionValues": {}, "size": add["size_bytes"],
                 "modificationTime": add["modification_time"], "dataChange": True, "deletionVector": dv,
                 "stats": json.dumps({"numRecords": add["num_records"]})}},
    ]
    with open(os.path.join(path, "_delta_log", f"{version:020d}.json"), "x") as f:
        f.write("\n".join(json.dumps(a) for a in actions) + "\n")
    return version
