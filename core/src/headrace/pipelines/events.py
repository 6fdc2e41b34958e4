"""The event log: one JSON object per line in ``<storage>/event_log/events.jsonl``.

Shaped like Databricks' pipeline event log: ``id``, ``sequence``, ``timestamp``, ``origin``
(``pipeline_name``, ``update_id``, ``flow_name``, ``dataset_name``), ``level``,
``event_type``, ``message`` and ``details``. Event types:

- ``create_update``: a run starts (``details.create_update``: mode, refresh selection).
- ``update_progress``: the run's state (``RUNNING``, ``COMPLETED``, ``FAILED``, ``CANCELED``).
- ``flow_progress``: a flow's state (``STARTING``, ``RUNNING``, ``COMPLETED``, ``SKIPPED``,
  ``FAILED``, ``STOPPED``) and, per batch, ``metrics`` (``num_output_rows``, ``batch_id``,
  backlog) and ``data_quality`` (``dropped_records``, ``expectations`` with
  ``passed_records`` / ``failed_records`` each).
- ``full_refresh``: a dataset truncated and its flows' checkpoints reset.

Lines are appended and flushed one by one; a line cut by a crash is skipped when reading.
"""

from __future__ import annotations

import json
import os
import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

__all__ = ["EventLog", "format_event", "read_events"]


class EventLog:
    """Appends events for one run. Thread-safe."""

    def __init__(self, path: str, pipeline: str, update_id: str) -> None:
        self.path = path
        self.pipeline = pipeline
        self.update_id = update_id
        self._lock = threading.Lock()
        self._seq = 0
        os.makedirs(os.path.dirname(path), exist_ok=True)
        self._end_torn_line()

    def _end_torn_line(self) -> None:
        """A run killed mid-line left a partial last line: end it, so the next event starts a line."""
        try:
            with open(self.path, "rb") as f:
                f.seek(-1, os.SEEK_END)
                torn = f.read(1) != b"\n"
        except (FileNotFoundError, OSError):
            return
        if torn:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write("\n")

    def emit(
        self,
        event_type: str,
        message: str,
        *,
        level: str = "INFO",
        flow: str | None = None,
        dataset: str | None = None,
        details: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Append one event (called by the runner: per run, per flow state change, per batch)."""
        with self._lock:
            self._seq += 1
            origin: dict[str, Any] = {"pipeline_name": self.pipeline, "update_id": self.update_id}
            if flow:
                origin["flow_name"] = flow
            if dataset:
                origin["dataset_name"] = dataset
            event = {
                "id": str(uuid.uuid4()),
                "sequence": {"update_id": self.update_id, "seq": self._seq},
                "timestamp": datetime.now(UTC).isoformat(timespec="milliseconds"),
                "origin": origin,
                "level": level,
                "event_type": event_type,
                "message": message,
                "details": {event_type: details or {}},
            }
            line = json.dumps(event, default=str, separators=(",", ":")) + "\n"
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(line)
                f.flush()
            return event


def read_events(path: str) -> Iterator[dict[str, Any]]:
    """Every readable event of the log, oldest first (a torn last line is skipped)."""
    if not os.path.exists(path):
        return
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                continue


def format_event(e: dict[str, Any]) -> str:
    """One human line for ``headrace pipelines events``."""
    origin = e.get("origin", {})
    who = origin.get("flow_name") or origin.get("dataset_name") or origin.get("pipeline_name", "")
    extra = ""
    det = (e.get("details") or {}).get(e.get("event_type"), {}) or {}
    dq = det.get("data_quality")
    if dq and dq.get("expectations"):
        parts = [f"{x['name']} passed={x['passed_records']} failed={x['failed_records']}" for x in dq["expectations"]]
        extra = f"  [expectations: {'; '.join(parts)}; dropped={dq.get('dropped_records', 0)}]"
    return f"{e.get('timestamp', '')}  {e.get('level', ''):5}  {e.get('event_type', ''):16} {who:20} {e.get('message', '')}{extra}"
