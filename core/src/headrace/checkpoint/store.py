"""The checkpoint folder: opening, locking and verifying it, reading its log, and writing it
(through :mod:`headrace.checkpoint.writer`). The layout is described in :mod:`headrace.checkpoint`."""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

from headrace.checkpoint import rollback
from headrace.checkpoint.atomic_files import atomic_write, remove_temps
from headrace.checkpoint.entries import FORMAT_VERSION, OffsetEntry, commit_json
from headrace.checkpoint.writer import LogWriter, purge
from headrace.errors import CheckpointError, redact_url

__all__ = ["Checkpoint"]

log = logging.getLogger(__name__)


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
        self._writer: LogWriter | None = None  # background writes of offsets entries and markers

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
            for folder in ("offsets", "commits"):  # what a killed run was writing: never renamed into place
                remove_temps(self._p(folder))
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
        atomic_write(self._p("metadata"), json.dumps(meta, indent=1, sort_keys=True).encode(), durable=self.durable,
                     sync_dir=True)  # fmt: skip
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
        if self._writer is not None:
            self._writer.close()
            self._writer = None
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
        """Write-ahead: record the batch's range before reading it, durably (file and folder
        fsynced). Called once per batch (twice per real-time batch)."""
        atomic_write(self._p("offsets", str(entry.batch_id)), entry.to_json(), durable=self.durable, sync_dir=True)

    def write_offsets_async(self, entry: OffsetEntry) -> Future[None]:
        """``write_offsets`` on the checkpoint's I/O threads; the future is done once the entry
        is durable. The engine reads the batch's data meanwhile (or runs earlier batches, when
        it plans ahead) and waits for the future before the sink commits anything: the entry
        is durable before any output of the batch can become visible, which is what the
        write-ahead log must guarantee. Entries appear in the order of the calls."""
        return self.writer().offsets(entry.batch_id, entry.to_json())

    def write_offsets_many(self, entries: list[OffsetEntry]) -> list[Future[None]]:
        """``write_offsets_async`` for several consecutive batches planned ahead at once (one
        background job for all); one future each."""
        return self.writer().offsets_many([(e.batch_id, e.to_json()) for e in entries])

    def writer(self) -> LogWriter:
        """The background writer of this checkpoint's log (created on first use)."""
        if self._writer is None:
            self._writer = LogWriter(self.location, durable=self.durable, retain=self.retain)
        return self._writer

    def write_commit(self, batch_id: int, info: dict[str, Any] | None = None) -> None:
        """Record that batch ``batch_id`` is committed in the sink, durably. Called once per
        real-time batch (micro-batches use the asynchronous forms)."""
        atomic_write(self._p("commits", str(batch_id)), commit_json(batch_id, info), durable=self.durable,
                     sync_dir=True)  # fmt: skip
        old = batch_id - self.retain
        if old >= 0:
            purge(self._p("offsets"), self._p("commits"), old)

    def write_commit_async(self, batch_id: int, info: dict[str, Any] | None = None,
                           after: Sequence[Any] = ()) -> tuple[Future[None], Future[None]]:  # fmt: skip
        """``write_commit`` on the checkpoint's I/O threads. For a marker whose body is known
        only after the batch (a watermark's); the others are published as links
        (``publish_commit``). The marker is written only after ``result()`` of everything in
        ``after`` returned (the batch's state writes: futures, or pending writes that then run
        on the I/O thread); if one failed, it is not written and both futures raise that error.
        Returns two futures: done once the marker is visible (its file fsynced and renamed
        into place), and once it is durable (its folder fsynced too). Called once per batch."""
        return self.writer().commit_whole(batch_id, info, after)

    def publish_commit(self, batch_id: int) -> Future[None]:
        """Mark batch ``batch_id`` committed: ``commits/<n>`` linked to its durable offsets entry,
        visible now; the future is done once the marker is durable. Called once per batch, after
        its sink commit (see :meth:`LogWriter.publish_commit`)."""
        return self.writer().publish_commit(batch_id)

    def flush_commits(self) -> None:
        """Have the markers published so far made durable now (before waiting for them)."""
        if self._writer is not None:
            self._writer.flush()

    def forget_planned(self, batch_id: int) -> None:
        """Delete the offsets entry of a batch planned ahead that never ran (nothing of it was
        read or committed: as if the process had stopped before planning it). Called for the
        planned batches from the last one back, when a query stops."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._p("offsets", str(batch_id)))

    def read_commit(self, batch_id: int) -> dict[str, Any] | None:
        """The ``commits/<n>`` entry (with what the engine recorded in it), or None."""
        return self._read_json(self._p("commits", str(batch_id)))

    def state_path(self, index: int) -> str:
        """The folder of the plan's stateful operator number ``index`` (``state/<index>``). A
        file where the folder belongs is refused (``CheckpointError`` naming it)."""
        path = self._p("state", str(index))
        try:
            os.makedirs(path, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            bad = next((p for p in (self._p("state"), path) if os.path.exists(p) and not os.path.isdir(p)), path)
            raise CheckpointError(
                f"checkpoint {self.location}: {bad} is a file, where the folder of stateful operators' state belongs; "
                "the checkpoint's layout was changed outside headrace; restore the folder from a backup, or start "
                "the query over with a new checkpointLocation"
            ) from None
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
        """Roll the query back to just after batch ``batch_id``; see :func:`headrace.checkpoint.rollback.reset_to`."""
        return rollback.reset_to(self, batch_id, force=force)

    def describe(self) -> dict[str, Any]:
        """A summary for ``headrace checkpoint show``."""
        return rollback.describe(self)


def _describe(ss: list[dict[str, Any]]) -> str:
    return ", ".join(f"{s.get('connector')}" + (f" at {s['path']}" if s.get("path") else "") for s in ss) or "nothing"


def _norm(ss: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(str(s.get("connector", "")).lower(), redact_url(str(s.get("path") or ""))) for s in ss]
