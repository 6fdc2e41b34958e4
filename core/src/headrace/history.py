"""Progress history kept with the checkpoint: the last N progress records of a query.

Layout::

    <checkpoint>/progress/
      <seq>.jsonl         segments of progress records (``QueryProgress.to_dict()``), one JSON
                          object per line, secrets redacted; a new segment per run and every
                          ``keep`` records
      run.json            the current (or last) run: id, runId, name, pid, startedAt
      terminated.json     how the last run ended: runId, exception and its traceback
                          (redacted), batchId, timestamp

Records are appended by a background thread (never on the batch's critical path), at most
every 50 ms and in one ``write`` per flush, without fsync: the history is for people and
dashboards, not for recovery, so a record lost in a crash is acceptable while a slower batch is
not. It is bounded like the offsets log: the oldest segments are removed as soon as the newer
ones hold ``keep`` records, so its size does not grow with the query's age. A line cut short by
a crash (or being written while a dashboard reads) is skipped by the readers, never fatal.

When a batch id comes again (the replay of an uncommitted batch after a restart, or a run after
``headrace checkpoint reset``), the newer record replaces the older ones from that batch on.

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
import traceback
from collections import deque
from collections.abc import Mapping
from typing import Any

from headrace.checkpoint import atomic_write
from headrace.redaction import SECRET_MARKERS
from headrace.redaction import redact as redact_text
from headrace.redaction import redact_record as redact  # re-exported for one release: use headrace.redaction

__all__ = ["HISTORY_DIR", "ProgressHistory", "query_state", "read_history", "redact"]

log = logging.getLogger(__name__)

HISTORY_DIR = "progress"
_FLUSH_EVERY = 0.05  # seconds between two appends: bounds the writer's share of a core


def _encode(record: Mapping[str, Any]) -> bytes:
    """One history line: the record as JSON, redacted. Encoded first; only when the text has a
    credential-looking key or a URL anywhere (``redact`` changes nothing otherwise) is it
    encoded again from :func:`redact`'s copy, so a batch's record costs one C-level encode."""
    text = json.dumps(record, default=str, separators=(",", ":"))
    lower = text.lower()
    if "://" in text or any(m in lower for m in SECRET_MARKERS):
        text = json.dumps(redact(record), default=str, separators=(",", ":"))
    return text.encode() + b"\n"


class ProgressHistory:
    """Writes a query's progress records into ``<checkpoint>/progress/``.

    Created by the engine once per query run (``start``), fed once per batch (``append``, cheap:
    it only queues the record) and closed when the query ends (``finish``, which waits for the
    pending writes). ``keep`` bounds the number of records kept (between ``keep`` and
    ``2 * keep`` lines on disk).
    """

    def __init__(self, checkpoint_location: str, *, keep: int = 100) -> None:
        self.folder = os.path.join(checkpoint_location, HISTORY_DIR)
        self.keep = max(1, keep)
        self._pending: deque[dict[str, Any]] = deque()
        self._cond = threading.Condition()
        self._closed = False
        self._waiting = False
        self._thread: threading.Thread | None = None
        self._run_id = ""
        self._segments: dict[int, int] = {}  # seq -> records in it
        self._fd: int | None = None
        self._seq = 0

    def start(self, *, id: str, run_id: str, name: str) -> None:
        """Record the run (``run.json``) and start the writer thread. Called once per run."""
        os.makedirs(self.folder, exist_ok=True)
        doc = {"id": id, "runId": run_id, "name": name, "pid": os.getpid(), "startedAt": int(time.time() * 1000)}
        self._write("run.json", doc)
        self._segments = {seq: _count_lines(os.path.join(self.folder, f"{seq}.jsonl")) for seq in _segments(self.folder)}
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
            if self._waiting:  # wake the writer only when it waits for records, not while it paces itself
                self._cond.notify()

    def finish(self, *, run_id: str, exception: str | BaseException | None, batch_id: int | None) -> None:
        """Write the pending records and ``terminated.json`` (``batchId``: the batch that failed,
        or the last one run; for an exception, its text and its traceback, both redacted); stop
        the writer. Called once when the query's thread ends. Idempotent."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(30)
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None
        if not os.path.isdir(self.folder):
            _active_runs.discard(self._run_id)
            return
        doc = {"runId": run_id, "exception": None if exception is None else redact_text(exception),
               "traceback": _traceback(exception), "batchId": batch_id,
               "timestamp": int(time.time() * 1000)}  # fmt: skip
        with contextlib.suppress(OSError):
            self._write("terminated.json", doc)
        _active_runs.discard(self._run_id)

    # ------------------------------------------------------------------ writer thread
    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closed:
                    self._waiting = True
                    self._cond.wait()
                    self._waiting = False
                if not self._pending and self._closed:
                    return
                batch = list(self._pending)
                self._pending.clear()
            try:
                self._store(batch)
            except Exception as e:  # history must never fail a query
                log.warning("could not write progress history to %s: %s", self.folder, e)
            with self._cond:
                if not self._closed:
                    self._cond.wait(_FLUSH_EVERY)

    def _store(self, records: list[dict[str, Any]]) -> None:
        lines: list[bytes] = []
        for r in records:
            if int(r.get("batchId", -1)) < 0:
                continue
            if self._fd is None or self._segments.get(self._seq, 0) + len(lines) >= self.keep:
                self._flush(lines)
                lines = []
                self._open_segment()
            lines.append(_encode(r))
        self._flush(lines)
        self._trim()

    def _open_segment(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
        self._seq = max(self._segments, default=0) + 1
        path = os.path.join(self.folder, f"{self._seq}.jsonl")
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._segments[self._seq] = 0

    def _flush(self, lines: list[bytes]) -> None:
        if not lines or self._fd is None:
            return
        os.write(self._fd, b"".join(lines))
        self._segments[self._seq] += len(lines)

    def _trim(self) -> None:
        """Remove the oldest segments once the newer ones hold ``keep`` records."""
        total = 0
        for seq in sorted(self._segments, reverse=True):
            if total >= self.keep:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(self.folder, f"{seq}.jsonl"))
                del self._segments[seq]
            else:
                total += self._segments[seq]

    def _write(self, name: str, doc: Mapping[str, Any]) -> None:
        atomic_write(os.path.join(self.folder, name), json.dumps(doc, default=str).encode(), durable=False)


def _traceback(exception: str | BaseException | None) -> str | None:
    """The traceback of a failure (of its cause chain), redacted as errors are."""
    if not isinstance(exception, BaseException):
        return None
    text = "".join(traceback.format_exception(exception)).rstrip()
    return redact_text(text) or None


def _segments(folder: str) -> list[int]:
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return []
    return sorted(int(n[:-6]) for n in names if n.endswith(".jsonl") and n[:-6].isdigit())


def _count_lines(path: str) -> int:
    try:
        with open(path, "rb") as f:
            return sum(1 for line in f if line.endswith(b"\n"))
    except OSError:
        return 0


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
    """The progress records kept in a checkpoint, oldest first: the last ``limit`` of them, only
    those with a batch id greater than ``after`` when given. A batch id that comes again replaces
    the records from it on. Never raises for a missing or damaged file or line (it is skipped).
    Reads at most two ``keep``-sized segments: O(keep)."""
    folder = os.path.join(checkpoint_location, HISTORY_DIR)
    out: list[dict[str, Any]] = []
    for seq in _segments(folder):
        try:
            with open(os.path.join(folder, f"{seq}.jsonl"), "rb") as f:
                data = f.read()
        except OSError:
            continue
        for line in data.split(b"\n"):
            if not line.strip():
                continue
            try:
                doc = json.loads(line)
                batch_id = int(doc["batchId"])
            except (ValueError, KeyError, TypeError):
                continue  # a line cut short by a crash or being written now
            while out and int(out[-1]["batchId"]) >= batch_id:
                out.pop()
            out.append(doc)
    if after is not None:
        out = [r for r in out if int(r["batchId"]) > after]
    if limit is not None:
        out = out[-limit:] if limit > 0 else []
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
    ``exception``, its ``traceback`` and ``batchId`` (the failed batch, or the last one) of the
    last run."""
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
        "traceback": None,
        "batchId": None,
    }
    if not run:
        state["status"] = "unknown"
    elif end.get("runId") == run.get("runId"):
        state["status"] = "failed" if end.get("exception") else "finished"
        state["exception"] = end.get("exception")
        state["traceback"] = end.get("traceback")
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
