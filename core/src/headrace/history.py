"""Progress history kept with the checkpoint: the last N progress records of a query.

Layout::

    <checkpoint>/progress/
      <batchId>.json      one progress record (``QueryProgress.to_dict()``), secrets redacted
      run.json            the current (or last) run: id, runId, name, pid, startedAt
      terminated.json     how the last run ended: runId, exception, batchId, timestamp

Records are written by a background thread (never on the batch's critical path) without
fsync: the history is for people and dashboards, not for recovery, so a record lost in a crash
is acceptable while a slower batch is not. Like the offsets log it is bounded: when batch ``n``
is written, ``n - keep`` is removed, so its size does not grow with the query's age. A damaged
or foreign file is skipped by the readers (with a warning), never fatal.

``run.json`` + ``terminated.json`` are how ``headrace ui`` tells a running query from a finished
one without touching anything outside the checkpoint: a run is live while ``run.json`` names a
run that ``terminated.json`` does not and its process is alive.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Mapping
from typing import Any

from headrace.checkpoint import atomic_write
from headrace.options import PassThrough

__all__ = ["HISTORY_DIR", "ProgressHistory", "query_state", "read_history", "redact"]

log = logging.getLogger(__name__)

HISTORY_DIR = "progress"
_SECRET_MARKERS = PassThrough("").secret_markers


def redact(value: Any) -> Any:
    """A copy of a JSON-like value with every value under a credential-looking key
    (password, secret, token, ...) replaced by ``***``. Applied to every record written."""
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            lower = str(k).lower()
            out[k] = "***" if any(m in lower for m in _SECRET_MARKERS) and v not in (None, "") else redact(v)
        return out
    if isinstance(value, list | tuple):
        return [redact(v) for v in value]
    return value


class ProgressHistory:
    """Writes a query's progress records into ``<checkpoint>/progress/``.

    Created by the engine once per query run (``start``), fed once per batch (``append``, cheap:
    it only queues the record) and closed when the query ends (``finish``, which waits for the
    pending writes). ``keep`` bounds the number of records on disk.
    """

    def __init__(self, checkpoint_location: str, *, keep: int = 100) -> None:
        self.folder = os.path.join(checkpoint_location, HISTORY_DIR)
        self.keep = max(1, keep)
        self._pending: deque[dict[str, Any]] = deque()
        self._cond = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None
        self._last_batch: int | None = None
        self._run_id = ""

    def start(self, *, id: str, run_id: str, name: str) -> None:
        """Record the run (``run.json``) and start the writer thread. Called once per run."""
        os.makedirs(self.folder, exist_ok=True)
        doc = {"id": id, "runId": run_id, "name": name, "pid": os.getpid(), "startedAt": int(time.time() * 1000)}
        self._write("run.json", doc)
        self._run_id = run_id
        _active_runs.add(run_id)
        self._thread = threading.Thread(target=self._work, name="headrace-history", daemon=True)
        self._thread.start()

    def append(self, progress: Mapping[str, Any]) -> None:
        """Queue one progress record (``QueryProgress.to_dict()``). Called once per batch."""
        with self._cond:
            self._pending.append(dict(progress))
            while len(self._pending) > self.keep:  # fell behind: the oldest would be purged anyway
                self._pending.popleft()
            self._cond.notify()

    def finish(self, *, run_id: str, exception: str | None, batch_id: int | None) -> None:
        """Write the pending records and ``terminated.json`` (``batchId``: the batch that failed,
        or the last one run); stop the writer. Idempotent."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(30)
        if not os.path.isdir(self.folder):
            _active_runs.discard(self._run_id)
            return
        doc = {"runId": run_id, "exception": exception, "batchId": batch_id,
               "timestamp": int(time.time() * 1000)}  # fmt: skip
        with contextlib.suppress(OSError):
            self._write("terminated.json", doc)
        _active_runs.discard(self._run_id)

    # ------------------------------------------------------------------ writer thread
    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closed:
                    self._cond.wait()
                if not self._pending and self._closed:
                    return
                batch = list(self._pending)
                self._pending.clear()
            for record in batch:
                try:
                    self._store(record)
                except Exception as e:  # history must never fail a query
                    log.warning("could not write progress history to %s: %s", self.folder, e)

    def _store(self, record: dict[str, Any]) -> None:
        batch_id = int(record.get("batchId", -1))
        if batch_id < 0:
            return
        self._write(f"{batch_id}.json", redact(record))
        first = self._last_batch is None
        self._last_batch = batch_id
        old = batch_id - self.keep
        if first:  # a restart (or a reset) may have left records out of the window
            for n in _ids(self.folder):
                if n <= old or n > batch_id:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(os.path.join(self.folder, f"{n}.json"))
        elif old >= 0:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(self.folder, f"{old}.json"))

    def _write(self, name: str, doc: Mapping[str, Any]) -> None:
        atomic_write(os.path.join(self.folder, name), json.dumps(doc, default=str).encode(), durable=False)


def _ids(folder: str) -> list[int]:
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return []
    return sorted(int(n[:-5]) for n in names if n.endswith(".json") and n[:-5].isdigit())


def _load(path: str) -> dict[str, Any] | None:
    try:
        with open(path, "rb") as f:
            doc = json.loads(f.read())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        log.warning("skipping unreadable progress record %s: %s", path, e)
        return None
    return doc if isinstance(doc, dict) else None


def read_history(checkpoint_location: str, *, limit: int | None = None, after: int | None = None) -> list[dict[str, Any]]:
    """The progress records kept in a checkpoint, oldest first: the last ``limit`` of them,
    only those with a batch id greater than ``after`` when given. Never raises for a missing
    or damaged file (it is skipped)."""
    folder = os.path.join(checkpoint_location, HISTORY_DIR)
    ids = _ids(folder)
    if after is not None:
        ids = [i for i in ids if i > after]
    if limit is not None:
        ids = ids[-limit:] if limit > 0 else []
    out = []
    for i in ids:
        doc = _load(os.path.join(folder, f"{i}.json"))
        if doc is not None:
            out.append(doc)
    return out


def _alive(pid: Any) -> bool:
    try:
        os.kill(int(pid), 0)
    except (ProcessLookupError, ValueError, TypeError):
        return False
    except PermissionError:
        return True
    return True


def query_state(checkpoint_location: str) -> dict[str, Any]:
    """What the history says about a checkpoint's query: ``id``, ``name``, ``runId``,
    ``status`` (``running`` / ``finished`` / ``failed`` / ``killed`` / ``unknown``),
    ``exception`` and ``batchId`` (the failed batch, or the last one) of the last run."""
    folder = os.path.join(checkpoint_location, HISTORY_DIR)
    meta = _load(os.path.join(checkpoint_location, "metadata")) or {}
    run = _load(os.path.join(folder, "run.json")) or {}
    end = _load(os.path.join(folder, "terminated.json")) or {}
    state: dict[str, Any] = {
        "id": run.get("id") or meta.get("id"),
        "name": run.get("name") or meta.get("name") or "",
        "runId": run.get("runId"),
        "checkpoint": os.path.abspath(checkpoint_location),
        "startedAt": run.get("startedAt"),
        "exception": None,
        "batchId": None,
    }
    if not run:
        state["status"] = "unknown"
    elif end.get("runId") == run.get("runId"):
        state["status"] = "failed" if end.get("exception") else "finished"
        state["exception"] = end.get("exception")
        state["batchId"] = end.get("batchId")
        state["endedAt"] = end.get("timestamp")
    elif (_alive(run.get("pid")) and run.get("pid") != os.getpid()) or _in_process(run.get("runId")):
        state["status"] = "running"
    else:
        state["status"] = "killed"
    return state


# runs of this process that are active (the UI server may run beside them: `headrace run --ui`)
_active_runs: set[str] = set()


def _in_process(run_id: Any) -> bool:
    return run_id in _active_runs
