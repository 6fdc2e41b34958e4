"""Where a pipeline keeps its data: the storage root's layout and the Delta table operations.

::

    <storage>/tables/<dataset>/              Delta tables (streaming tables, materialized views)
    <local>/checkpoints/<target>/<flow>/     each flow's checkpoint
    <local>/schemas/<flow>/<i>/              cloudFiles schema locations the pipeline manages
    <local>/event_log/events.jsonl           the event log
    <local>/refresh/<dataset>                a full refresh in progress (redone after a crash)

``<local>`` is the storage root itself when it is a local folder. With an ``s3://`` root the
tables live in S3 and the checkpoints (local files, as every headrace checkpoint) in
``configuration["pipelines.localStorage"]`` (default ``<spec folder>/.headrace/<name>``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa

from headrace.checkpoint import atomic_write
from headrace.errors import HeadraceError

__all__ = ["PipelineStorage"]

log = logging.getLogger(__name__)


def _safe(name: str) -> str:
    from headrace.pipelines.elements import name_problem

    problem = name_problem(name)
    if problem:
        raise HeadraceError(f"dataset or flow name {problem}: it cannot name a folder; use letters, digits, _ and .")
    return name


class PipelineStorage:
    """The storage root of one pipeline (local folder or ``s3://`` URI)."""

    def __init__(self, root: str, local_root: str, storage_options: Mapping[str, str] | None = None) -> None:
        self.root = root.rstrip("/")
        self.local_root = local_root
        self.storage_options = dict(storage_options or {})
        self.remote = "://" in self.root and not self.root.startswith("file://")

    # ------------------------------------------------------------------ layout
    def table_path(self, name: str) -> str:
        base = self.root[len("file://"):] if self.root.startswith("file://") else self.root
        return f"{base}/tables/{_safe(name)}"

    def checkpoint(self, target: str, flow: str) -> str:
        return os.path.join(self.local_root, "checkpoints", _safe(target), _safe(flow))

    def schema_location(self, flow: str, index: int) -> str:
        return os.path.join(self.local_root, "schemas", _safe(flow), str(index))

    @property
    def event_log(self) -> str:
        return os.path.join(self.local_root, "event_log", "events.jsonl")

    def delta_options(self) -> dict[str, str]:
        """Options for the delta source and sink (``storage.*``)."""
        return {f"storage.{k}": v for k, v in self.storage_options.items()}

    # ------------------------------------------------------------------ refresh markers
    def _marker(self, name: str) -> str:
        return os.path.join(self.local_root, "refresh", _safe(name))

    def mark_full_refresh(self, name: str) -> None:
        os.makedirs(os.path.dirname(self._marker(name)), exist_ok=True)
        atomic_write(self._marker(name), json.dumps({"dataset": name, "at": datetime.now(UTC).isoformat()}).encode())

    def pending_full_refreshes(self) -> set[str]:
        folder = os.path.join(self.local_root, "refresh")
        return set(os.listdir(folder)) if os.path.isdir(folder) else set()

    def clear_full_refresh(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.remove(self._marker(name))

    def reset_flow(self, target: str, flow: str) -> None:
        """Forget a flow's progress: its checkpoint, managed schema locations and once marker."""
        shutil.rmtree(self.checkpoint(target, flow), ignore_errors=True)
        shutil.rmtree(os.path.join(self.local_root, "schemas", _safe(flow)), ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            os.remove(self._once(flow))

    def _once(self, flow: str) -> str:
        return os.path.join(self.local_root, "once", _safe(flow))

    def once_done(self, flow: str) -> bool:
        """A ``once=True`` flow already ran (since the last full refresh of its target)."""
        return os.path.exists(self._once(flow))

    def mark_once_done(self, flow: str) -> None:
        os.makedirs(os.path.dirname(self._once(flow)), exist_ok=True)
        atomic_write(self._once(flow), b"done\n")

    # ------------------------------------------------------------------ Delta tables
    def _dt(self, name: str) -> Any:
        from deltalake import DeltaTable

        path = self.table_path(name)
        if not DeltaTable.is_deltatable(path, storage_options=self.storage_options or None):
            return None
        return DeltaTable(path, storage_options=self.storage_options or None)

    def exists(self, name: str) -> bool:
        return self._dt(name) is not None

    def version(self, name: str) -> int | None:
        dt = self._dt(name)
        return None if dt is None else int(dt.version())

    def read(self, name: str) -> pa.Table:
        dt = self._dt(name)
        if dt is None:
            raise HeadraceError(f"table {name!r} has no data yet ({self.table_path(name)} is not a Delta table)")
        return dt.to_pyarrow_table()

    def truncate(self, name: str) -> bool:
        """Delete every row (one Delta commit; the schema and history stay). False if no table."""
        dt = self._dt(name)
        if dt is None:
            return False
        dt.delete()
        return True

    def overwrite(self, name: str, table: pa.Table, partition_by: list[str] | None = None) -> None:
        """Replace the table's content and schema in one Delta commit (materialized views)."""
        from deltalake import write_deltalake

        write_deltalake(self.table_path(name), table, mode="overwrite", schema_mode="overwrite",
                        partition_by=partition_by, storage_options=self.storage_options or None)  # fmt: skip

    def stats(self, name: str) -> dict[str, Any] | None:
        """Row count (from the log's file statistics, no data read), version and last update."""
        dt = self._dt(name)
        if dt is None:
            return None
        rows: int | None = None
        try:
            actions = pa.table(dt.get_add_actions(flatten=True))
            if "num_records" in actions.column_names:
                rows = int(sum(v or 0 for v in actions.column("num_records").to_pylist()))
        except Exception as e:  # statistics are a nicety
            log.debug("no row statistics for %s: %s", name, e)
        hist = dt.history(1)
        ts = hist[0].get("timestamp") if hist else None
        updated = datetime.fromtimestamp(ts / 1000, UTC).isoformat(timespec="seconds") if ts else None
        return {"rows": rows, "version": int(dt.version()), "last_update": updated}
