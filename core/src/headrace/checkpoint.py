"""The checkpoint: a write-ahead offsets log, a commits log, metadata and connector state.

Layout (like Spark's)::

    <location>/
      metadata            {"version": 1, "id": <query id>, "name": ..., "sources": [...], "createdAt": ...}
      offsets/<n>         {"version": 1, "batchId": n, "timestamp": ms, "sources": [{"start": .., "end": ..}],
                           "metadata": {"batchWatermarkMs": ..}}  (metadata only with a watermark)
      commits/<n>         {"version": 1, "batchId": n, "timestamp": ms}
      sources/<i>/...     each source's own state (file index, staged data, schema versions)
      sinks/0/...         the sink's own state
      state/<i>/...       the state of the plan's stateful operator number i (versioned by batch)
      .lock               held (flock) by the running query

Every write is atomic: a temporary file in the same folder, flushed and fsynced, then renamed
over the target. ``offsets/<n>`` is written before batch ``n`` reads any data and
``commits/<n>`` after the sink committed it, so a batch with an offsets entry and no commits
entry is replayed over the same range with the same batch id. Only the last
``retain`` batches are kept (Spark's ``minBatchesToRetain``, 100), so the log's size and the
cost of a batch do not grow with history.

A checkpoint written by another query (a different query name, or a different set of sources)
is refused, never silently reused; so is a corrupt entry, with the file named.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import random
import shutil
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from headrace.errors import CheckpointError
from headrace.protocols import Offset

__all__ = ["Checkpoint", "OffsetEntry", "atomic_write"]

FORMAT_VERSION = 1
log = logging.getLogger(__name__)


def _is_offset(value: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(k, str) for k in value)


def atomic_write(path: str, data: bytes, *, durable: bool = True) -> None:
    """Write ``data`` to ``path`` atomically (temp file + fsync + rename)."""
    # random.getrandbits, not uuid4: os.urandom cost ~0.1 ms a call on a busy machine (twice a batch)
    tmp = f"{path}.{os.getpid()}.{random.getrandbits(32):08x}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, data)
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@dataclass(frozen=True)
class OffsetEntry:
    """One ``offsets/<n>`` entry: per source, where the batch starts and ends.

    ``ends`` items are ``None`` for a real-time batch still running (its end is written when the
    interval closes). ``metadata`` is what the batch must be replayed with (Spark's
    ``OffsetSeqMetadata``): ``batchWatermarkMs``, ``batchTimestampMs`` and the event-time
    maxima the watermark was computed from (``eventTimeMaxMs``); empty without a watermark.
    """

    batch_id: int
    starts: list[Offset]
    ends: list[Offset | None]
    timestamp_ms: int
    real_time: bool = False
    metadata: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> bytes:
        doc = {
            "version": FORMAT_VERSION,
            "batchId": self.batch_id,
            "timestamp": self.timestamp_ms,
            "realTime": self.real_time,
            "sources": [{"start": s, "end": e} for s, e in zip(self.starts, self.ends, strict=True)],
        }
        if self.metadata:
            doc["metadata"] = self.metadata
        return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> OffsetEntry:
        """Parse an entry, checking its structure; raises ValueError saying what is wrong."""
        srcs = data.get("sources")
        if not isinstance(srcs, list) or not srcs:
            raise ValueError(f"'sources' must be a non-empty list, not {json.dumps(srcs)[:80]}")
        batch_id = data.get("batchId")
        if isinstance(batch_id, bool) or not isinstance(batch_id, int) or batch_id < 0:
            raise ValueError(f"'batchId' must be a batch number, not {json.dumps(batch_id)[:80]}")
        timestamp = data.get("timestamp", 0)
        if isinstance(timestamp, bool) or not isinstance(timestamp, int | float):
            raise ValueError(f"'timestamp' must be a number, not {json.dumps(timestamp)[:80]}")
        real_time = data.get("realTime", False)
        if not isinstance(real_time, bool):
            raise ValueError(f"'realTime' must be true or false, not {json.dumps(real_time)[:80]}")
        metadata = data.get("metadata") or {}
        if not isinstance(metadata, dict):
            raise ValueError(f"'metadata' must be an object, not {json.dumps(metadata)[:80]}")
        for i, src in enumerate(srcs):
            if not isinstance(src, dict) or "start" not in src or "end" not in src:
                raise ValueError(f"sources[{i}] must be an object with 'start' and 'end'")
            if not _is_offset(src["start"]):
                raise ValueError(f"sources[{i}].start must be an offset object, not {json.dumps(src['start'])[:80]}")
            if not (_is_offset(src["end"]) or (src["end"] is None and real_time)):
                raise ValueError(f"sources[{i}].end must be an offset object, not {json.dumps(src['end'])[:80]}")
        return cls(
            batch_id=batch_id,
            starts=[s["start"] for s in srcs],
            ends=[s["end"] for s in srcs],
            timestamp_ms=int(timestamp),
            real_time=real_time,
            metadata=dict(metadata),
        )


class Checkpoint:
    """A checkpoint folder on the local file system.

    Create it, then ``open(...)`` once per query run (takes the lock, creates or verifies the
    metadata), then use ``write_offsets`` / ``write_commit`` per batch.
    """

    def __init__(self, location: str, *, retain: int = 100, durable: bool = True) -> None:
        if "://" in location and not location.startswith("file://"):
            raise CheckpointError(
                f"checkpointLocation {location!r}: only local paths are supported for checkpoints so far; "
                "use a local folder (the data itself may live on object storage)"
            )
        self.location = os.path.abspath(location.removeprefix("file://"))
        self.retain = max(1, retain)
        self.durable = durable
        self._lock_fd: int | None = None
        self.metadata: dict[str, Any] = {}
        self._io: ThreadPoolExecutor | None = None  # offsets entries, in order
        self._commit_io: ThreadPoolExecutor | None = None  # commit markers, in order
        self._purge_io: ThreadPoolExecutor | None = None  # old entries' deletion, off both

    # ------------------------------------------------------------------ paths
    def _p(self, *parts: str) -> str:
        return os.path.join(self.location, *parts)

    def source_state_path(self, index: int) -> str:
        path = self._p("sources", str(index))
        os.makedirs(path, exist_ok=True)
        return path

    def sink_state_path(self) -> str:
        path = self._p("sinks", "0")
        os.makedirs(path, exist_ok=True)
        return path

    # ------------------------------------------------------------------ open / close
    def open(self, *, name: str, sources: list[dict[str, Any]], sink: dict[str, Any]) -> dict[str, Any]:
        """Lock the checkpoint and create or verify its metadata; returns the metadata.

        ``sources`` describes each source (``{"connector": ..., "path": ...}``); a checkpoint
        whose metadata lists different sources, or another query name, is refused.
        """
        try:
            os.makedirs(self._p("offsets"), exist_ok=True)
            os.makedirs(self._p("commits"), exist_ok=True)
            self._lock()
        except OSError as e:
            raise self._unusable(e) from None
        try:
            meta_path = self._p("metadata")
            meta = self._read_json(meta_path)
            if meta is None and (self.batch_ids() or self.committed_ids()):
                raise CheckpointError(
                    f"checkpoint {self.location} has batches (offsets/, commits/) but its metadata file {meta_path} "
                    "is missing: the query's id is lost, so sinks keyed by it could write a replayed batch twice. "
                    "Fix: restore the metadata file from a backup, or start over with a new checkpointLocation "
                    "(or delete this folder)"
                )
            if meta is not None:
                self._check_metadata(meta)
                if not self.committed_ids() and not self._matches(meta, name=name, sources=sources):
                    self._take_over(meta, name=name, sources=sources)
                    meta = None
            if meta is None:
                meta = self._new_metadata(name=name, sources=sources, sink=sink)
            else:
                self._verify(meta, name=name, sources=sources)
            self.metadata = meta
            return meta
        except OSError as e:
            self.close()
            raise self._unusable(e) from None
        except BaseException:
            self.close()
            raise

    def _unusable(self, e: OSError) -> CheckpointError:
        why = {
            "NotADirectoryError": "a file is in the way (it must be a folder)",
            "FileExistsError": "a file is in the way (it must be a folder)",
            "PermissionError": "this process may not write there",
            "FileNotFoundError": "a folder on its path cannot be created",
        }.get(type(e).__name__, e.strerror or type(e).__name__)
        return CheckpointError(
            f"checkpointLocation {self.location} cannot be used as a checkpoint folder: {why} "
            f"({type(e).__name__} on {e.filename or self.location}). Fix: give a folder this process can create "
            "and write (it is created if missing)"
        )

    def _new_metadata(self, *, name: str, sources: list[dict[str, Any]], sink: dict[str, Any]) -> dict[str, Any]:
        meta = {
            "version": FORMAT_VERSION,
            "id": str(uuid.uuid4()),
            "name": name,
            "sources": sources,
            "sink": sink,
            "createdAt": int(time.time() * 1000),
        }
        atomic_write(self._p("metadata"), json.dumps(meta, indent=1, sort_keys=True).encode(), durable=self.durable)
        return meta

    def _take_over(self, meta: dict[str, Any], *, name: str, sources: list[dict[str, Any]]) -> None:
        """A query that never committed a batch (e.g. it failed on a wrong path before its first
        batch) left this checkpoint: a corrected definition takes it over. What the old
        definition left (uncommitted offsets entries, source and sink state) is removed and a
        new query id is made, so nothing of it is replayed into the new query."""
        log.warning(
            "checkpoint %s was written by query '%s' reading %s, which never committed a batch; "
            "query '%s' reading %s takes it over (new query id)",
            self.location, meta.get("name") or "", _describe(meta["sources"]), name, _describe(sources),
        )  # fmt: skip
        for i in self.batch_ids():
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._p("offsets", str(i)))
        for folder in ("sources", "sinks"):
            shutil.rmtree(self._p(folder), ignore_errors=True)

    def _check_metadata(self, meta: dict[str, Any]) -> None:
        path = self._p("metadata")
        fix = "restore it from a backup, or start over with a new checkpointLocation"
        if not isinstance(meta.get("id"), str) or not meta.get("id"):
            raise CheckpointError(f"checkpoint metadata {path} has no query id; it is not a headrace checkpoint; {fix}")
        srcs = meta.get("sources")
        if not isinstance(srcs, list) or not all(isinstance(x, dict) for x in srcs):
            raise CheckpointError(f"checkpoint metadata {path}: 'sources' is not a list of objects; {fix}")
        if not isinstance(meta.get("name", ""), str):
            raise CheckpointError(f"checkpoint metadata {path}: 'name' is not a string; {fix}")

    def _matches(self, meta: dict[str, Any], *, name: str, sources: list[dict[str, Any]]) -> bool:
        old_name = meta.get("name") or ""
        if old_name and name and old_name != name:
            return False
        return _norm(meta["sources"]) == _norm(sources)

    def _verify(self, meta: dict[str, Any], *, name: str, sources: list[dict[str, Any]]) -> None:
        where = f"checkpoint {self.location}"
        fix = "use a new checkpointLocation for a different query (or delete this folder to start over)"
        if int(meta.get("version", 0)) > FORMAT_VERSION:
            raise CheckpointError(
                f"{where} has format version {meta.get('version')}, newer than this headrace understands "
                f"({FORMAT_VERSION}); upgrade headrace"
            )
        if "id" not in meta or "sources" not in meta:
            raise CheckpointError(f"{where}: metadata is not a headrace checkpoint (no id/sources); {fix}")
        old_name = meta.get("name") or ""
        if old_name and name and old_name != name:
            raise CheckpointError(f"{where} belongs to query '{old_name}', not '{name}'; {fix}")
        if _norm(meta["sources"]) != _norm(sources):
            raise CheckpointError(
                f"{where} was written by a query reading {_describe(meta['sources'])}; this query reads "
                f"{_describe(sources)}. A checkpoint cannot be reused with other sources; {fix}"
            )

    def _lock(self) -> None:
        if not os.path.isdir(self.location):
            raise CheckpointError(f"checkpoint {self.location} does not exist (or is not a folder)")
        fd = os.open(self._p(".lock"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise CheckpointError(
                f"checkpoint {self.location} is in use by another running query (pid {holder}); "
                "stop that query first, or give this one another checkpointLocation"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._lock_fd = fd

    def close(self) -> None:
        """Finish background writes and release the lock. Idempotent."""
        for name in ("_io", "_commit_io", "_purge_io"):
            pool = getattr(self, name)
            if pool is not None:
                pool.shutdown(wait=True)
                setattr(self, name, None)
        if self._lock_fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
                os.close(self._lock_fd)
            self._lock_fd = None

    # ------------------------------------------------------------------ log
    def _read_json(self, path: str) -> dict[str, Any] | None:
        try:
            with open(path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            return None
        try:
            doc = json.loads(raw)
            if not isinstance(doc, dict):
                raise ValueError("not a JSON object")
            return doc
        except ValueError as e:
            raise CheckpointError(
                f"checkpoint entry {path} is corrupt ({e}); it was not written by headrace's atomic writer. "
                "Restore it, or roll back with `headrace checkpoint reset <dir> --to-batch N`"
            ) from None

    def _ids(self, folder: str) -> list[int]:
        out = []
        for n in os.listdir(self._p(folder)):
            if n.isdigit():
                out.append(int(n))
        return sorted(out)

    def batch_ids(self) -> list[int]:
        """Batch ids with an offsets entry, ascending."""
        return self._ids("offsets")

    def committed_ids(self) -> list[int]:
        return self._ids("commits")

    def latest(self) -> tuple[OffsetEntry | None, bool]:
        """The last offsets entry and whether it is committed. Called once per query run."""
        ids = self.batch_ids()
        if not ids:
            return None, False
        entry = self.read_offsets(ids[-1])
        return entry, os.path.exists(self._p("commits", str(ids[-1])))

    def read_offsets(self, batch_id: int) -> OffsetEntry:
        path = self._p("offsets", str(batch_id))
        doc = self._read_json(path)
        if doc is None:
            raise CheckpointError(f"checkpoint {self.location} has no offsets entry for batch {batch_id}")
        try:
            entry = OffsetEntry.from_json(doc)
        except (KeyError, TypeError, ValueError) as e:
            raise CheckpointError(
                f"checkpoint entry {path} is malformed ({e}); it was not written by headrace. Restore it, or roll "
                "back with `headrace checkpoint reset <dir> --to-batch N`"
            ) from None
        n = len(self.metadata.get("sources") or []) if self.metadata else 0
        if entry.batch_id != batch_id or (n and len(entry.starts) != n):
            what = (f"it says batch {entry.batch_id}" if entry.batch_id != batch_id
                    else f"it has {len(entry.starts)} sources, the query {n}")  # fmt: skip
            raise CheckpointError(
                f"checkpoint entry {path} does not belong here ({what}). Restore it, or roll back with "
                "`headrace checkpoint reset <dir> --to-batch N`"
            )
        return entry

    def write_offsets(self, entry: OffsetEntry) -> None:
        """Write-ahead: record the batch's range before reading it. Called once per batch."""
        atomic_write(self._p("offsets", str(entry.batch_id)), entry.to_json(), durable=self.durable)

    def write_offsets_async(self, entry: OffsetEntry) -> Future[None]:
        """``write_offsets`` on the checkpoint's I/O thread. The engine reads the batch's data
        meanwhile and waits for the future before the sink commits anything: the entry is
        durable before any output of the batch can become visible, which is what the
        write-ahead log must guarantee, and the fsync no longer adds to the batch's time."""
        return self._executor().submit(self.write_offsets, entry)

    def _executor(self, name: str = "_io") -> ThreadPoolExecutor:
        pool: ThreadPoolExecutor | None = getattr(self, name)
        if pool is None:
            pool = ThreadPoolExecutor(1, thread_name_prefix=f"headrace-checkpoint{name}")
            setattr(self, name, pool)
        return pool

    def write_commit(self, batch_id: int, info: dict[str, Any] | None = None) -> None:
        """Record that batch ``batch_id`` is committed in the sink. Called once per batch."""
        doc = {"version": FORMAT_VERSION, "batchId": batch_id, "timestamp": int(time.time() * 1000), **(info or {})}
        atomic_write(self._p("commits", str(batch_id)), json.dumps(doc).encode(), durable=self.durable)
        old = batch_id - self.retain
        if old >= 0:
            # one old batch drops out per new batch (constant work per batch), off the loop's
            # thread and off the threads that write entries (deleting never delays the log)
            self._executor("_purge_io").submit(self._purge, old)

    def write_commit_async(self, batch_id: int, info: dict[str, Any] | None = None) -> Future[None]:
        """``write_commit`` on the checkpoint's commit thread (markers in order, one thread).

        The caller submits it only once the batch's offsets entry is durable, so a marker never
        exists without its entry; it may reach the disk before or after the next batch's offsets
        entry (written meanwhile on the offsets thread): either way a restart finds the batches
        after the last marker and replays them in order. The engine calls ``Source.commit`` and
        the next batch's ``Sink.commit`` only once the future is done."""
        return self._executor("_commit_io").submit(self.write_commit, batch_id, info)

    def _purge(self, batch_id: int) -> None:
        for folder in ("offsets", "commits"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._p(folder, str(batch_id)))

    def read_commit(self, batch_id: int) -> dict[str, Any] | None:
        """The ``commits/<n>`` entry (with what the engine recorded in it), or None."""
        return self._read_json(self._p("commits", str(batch_id)))

    def state_path(self, index: int) -> str:
        """The folder of the plan's stateful operator number ``index`` (``state/<index>``)."""
        path = self._p("state", str(index))
        os.makedirs(path, exist_ok=True)
        return path

    def is_committed(self, batch_id: int) -> bool:
        return os.path.exists(self._p("commits", str(batch_id)))

    def pending(self) -> list[OffsetEntry]:
        """The recorded batches to replay before planning new ones, in order: every offsets
        entry after the last committed batch (one after a crash; several after
        ``reset_to``). Called once per query run. Refuses a gap in the entries."""
        committed = self.committed_ids()
        last = committed[-1] if committed else -1
        ids = [i for i in self.batch_ids() if i > last]
        if ids and ids != list(range(last + 1, ids[-1] + 1)):
            missing = sorted(set(range(last + 1, ids[-1] + 1)) - set(ids))
            raise CheckpointError(
                f"checkpoint {self.location}: batches {ids[0]}..{ids[-1]} are to be replayed but the offsets entries "
                f"of {missing[:5]} are missing, so their ranges are unknown. Restore them, or roll back with "
                f"`headrace checkpoint reset {self.location} --to-batch {last} --force` (re-plans those batches)"
            )
        return [self.read_offsets(i) for i in ids]

    def reset_to(self, batch_id: int, *, force: bool = False) -> list[int]:
        """Roll the query back to just after batch ``batch_id`` (``-1``: to the start). Returns
        the batch ids rolled back. Refuses while a query holds the lock.

        By default the rolled-back batches keep their offsets entries and lose only their
        commits entries: the next run replays each of them with exactly its recorded range and
        batch id, so a sink that skips batch ids it has already committed skips exactly the rows
        it already holds, and one whose output was rolled back (a Delta table restored to an
        older version) gets them again. Nothing is lost, even from a time-driven source such as
        ``rate`` whose re-planned ranges would differ. When a recorded range is no longer there
        (only the last ``retain`` batches are kept), the reset is refused, unless ``force``:
        then the batches are forgotten entirely and re-planned on the next run (new ranges; a
        sink keyed by batch id may skip them as already committed, losing those rows).
        """
        self._lock()
        try:
            ids = self.batch_ids()
            if batch_id >= 0 and batch_id not in ids:
                raise CheckpointError(
                    f"checkpoint {self.location} has no batch {batch_id}; batches kept: "
                    f"{[*ids[:1], '...', *ids[-1:]] if ids else 'none'}"
                )
            removed = sorted({i for i in ids + self.committed_ids() if i > batch_id})
            kept = [i for i in ids if i > batch_id]
            if not force and kept and kept != list(range(batch_id + 1, kept[-1] + 1)):
                raise CheckpointError(
                    f"checkpoint {self.location}: cannot roll back to batch {batch_id} safely: the ranges of batches "
                    f"{batch_id + 1}..{kept[0] - 1} are no longer recorded (only the last {self.retain} batches are "
                    "kept), so they cannot be replayed exactly. Fix: roll back to a batch from "
                    f"{kept[0] - 1 if kept[0] > 0 else 0} on, or add --force to re-plan them (a time-driven source "
                    "such as rate then reads other ranges, and a sink that skips committed batch ids skips them: "
                    "rows can be lost), or start over with a new checkpointLocation"
                )
            for i in removed:
                folders = ("commits", "offsets") if force else ("commits",)
                for folder in folders:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(self._p(folder, str(i)))
            return removed
        finally:
            self.close()

    def describe(self) -> dict[str, Any]:
        """A summary for ``headrace checkpoint show``."""
        meta = self._read_json(self._p("metadata")) or {}
        ids = self.batch_ids() if os.path.isdir(self._p("offsets")) else []
        committed = set(self.committed_ids()) if os.path.isdir(self._p("commits")) else set()
        last = self.read_offsets(ids[-1]) if ids else None
        return {
            "location": self.location,
            "metadata": meta,
            "batches": len(ids),
            "firstBatch": ids[0] if ids else None,
            "lastBatch": ids[-1] if ids else None,
            "lastCommitted": max(committed) if committed else None,
            "pendingReplay": bool(ids) and ids[-1] not in committed,
            "batchesToReplay": [i for i in ids if i > max(committed, default=-1)],
            "lastOffsets": (
                [{"start": s, "end": e} for s, e in zip(last.starts, last.ends, strict=True)] if last else None
            ),
        }


def _describe(ss: list[dict[str, Any]]) -> str:
    return ", ".join(f"{s.get('connector')}" + (f" at {s['path']}" if s.get("path") else "") for s in ss) or "nothing"


def _norm(ss: list[dict[str, Any]]) -> list[tuple[str, str]]:
    from headrace.errors import redact_url

    return [(str(s.get("connector", "")).lower(), redact_url(str(s.get("path") or ""))) for s in ss]
