"""The checkpoint's background writer: offsets entries durable off the engine's thread, several
at a time, and commit markers that cost no data write.

What recovery relies on, and how the writer keeps it without the engine waiting for the disk:

- ``offsets/<n>`` (the write-ahead entry) is written to a temporary file and fsynced on a pool
  thread (a group of consecutive entries per job when the engine plans ahead: one thread
  hand-off for all), renamed into place strictly in batch order (a later entry waits for the
  rename of the earlier one, so a crash never leaves a gap in the log), then the folder is
  fsynced; its future is done once all that is done (durable). The jobs' fsyncs overlap, and
  one folder fsync serves every entry renamed meanwhile (:class:`DirSync`, a group commit).
- ``commits/<n>`` is a *hard link* to ``offsets/<n>`` made after the sink committed
  (:meth:`LogWriter.publish_commit`, one ``link`` call on the engine's thread): visible at once,
  never half written, and its content (the batch's entry, which is durable already: a
  superset of Spark's commit record, with ``version``, ``batchId`` and ``timestamp``) needs no
  fsync. Only the folder's fsync is left, done by the next background job (or by
  :meth:`LogWriter.flush`); the marker's future is done then, and only then may the sources be
  told (``Source.commit``). A marker with a body of its own (a watermark's event-time maxima,
  known only after the batch) is written whole instead (:meth:`LogWriter.commit`). Where hard
  links are not supported the marker is written whole too.
- Old entries (beyond ``retain``) are deleted once a newer marker is durable.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from headrace.checkpoint.atomic_files import DirSync, publish, write_temp
from headrace.checkpoint.entries import commit_json
from headrace.errors import CheckpointError

__all__ = ["LogWriter", "purge"]

log = logging.getLogger(__name__)

_THREADS = 12  # background jobs at once (each writes a group of offsets entries, or fsyncs markers)
_FSYNC_THREADS = 8  # files of one group written and fsynced at once


class LogWriter:
    """Writes ``offsets/<n>`` and ``commits/<n>`` of one checkpoint in background threads.

    Created by :class:`headrace.checkpoint.Checkpoint` on first use; every method is called
    from the engine's thread, once per batch (``flush`` when the engine must wait for markers).
    ``close`` waits for the writes in flight."""

    def __init__(self, location: str, *, durable: bool, retain: int) -> None:
        self.offsets_dir = os.path.join(location, "offsets")
        self.commits_dir = os.path.join(location, "commits")
        self.durable = durable
        self.retain = retain
        self._pool = ThreadPoolExecutor(_THREADS, thread_name_prefix="headrace-checkpoint-io")
        self._fsyncs = ThreadPoolExecutor(_FSYNC_THREADS, thread_name_prefix="headrace-checkpoint-fsync")
        self._turn = threading.Condition()
        self._submitted = 0  # offsets entries handed to the pool
        self._renamed = 0  # offsets entries whose turn to be renamed has passed
        self._broken: BaseException | None = None  # an offsets entry failed: later ones must not appear
        self._offsets_sync = DirSync(self.offsets_dir)
        self._commits_sync = DirSync(self.commits_dir)
        self._unsynced_lock = threading.Lock()
        self._unsynced: list[tuple[int, Future[None]]] = []  # markers linked, their folder not yet fsynced
        self._links = True  # hard links work here (else markers are written whole)

    # ------------------------------------------------------------------ offsets
    def offsets(self, batch_id: int, data: bytes) -> Future[None]:
        """Write ``offsets/<batch_id>``; the future is done once it is durable. Entries appear
        in the order of these calls. The same job then makes earlier markers durable."""
        return self.offsets_many([(batch_id, data)])[0]

    def offsets_many(self, entries: list[tuple[int, bytes]]) -> list[Future[None]]:
        """Write several consecutive ``offsets/<n>`` entries in one background job (one thread
        hand-off for all: the engine plans ahead a few batches at a time); one future each,
        done once the entry is durable."""
        seq = self._submitted
        self._submitted += len(entries)
        futures: list[Future[None]] = [Future() for _ in entries]
        self._pool.submit(self._offsets_job, seq, entries, futures)
        return futures

    def _offsets_job(self, seq: int, entries: list[tuple[int, bytes]], futures: list[Future[None]]) -> None:
        try:
            self._write_offsets(seq, entries)
        except BaseException as e:
            for f in futures:
                f.set_exception(e)
        else:
            for f in futures:
                f.set_result(None)
        self._sync_commits()

    def _write_offsets(self, seq: int, entries: list[tuple[int, bytes]]) -> None:
        paths = [os.path.join(self.offsets_dir, str(batch_id)) for batch_id, _ in entries]
        tmps, err = self._write_temps(paths, [data for _, data in entries])
        with self._turn:
            while self._renamed != seq:
                self._turn.wait()
            try:
                if err is None and self._broken is None:
                    while tmps:
                        publish(tmps[0], paths[len(paths) - len(tmps)])
                        tmps.pop(0)
            except BaseException as e:
                err = e
            finally:
                for tmp in tmps:
                    with contextlib.suppress(OSError):
                        os.unlink(tmp)
                if err is not None and self._broken is None:
                    self._broken = err
                self._renamed += len(entries)
                self._turn.notify_all()
        if err is not None:
            raise err
        if self._broken is not None:
            raise CheckpointError(
                f"offsets entry {paths[0]} was not written because an earlier entry failed ({self._broken}); "
                "the query stops and replays from its last committed batch on restart"
            )
        if self.durable:
            self._offsets_sync.sync()

    def _write_temps(self, paths: list[str], datas: list[bytes]) -> tuple[list[str], BaseException | None]:
        """Write (and fsync) a group's temporary files; several at once on the fsync threads
        (each file needs its own fsync, and concurrent ones share the journal's commits).
        Returns the files written, in order, and the first error (then none are returned)."""
        tmps: list[str] = []
        err: BaseException | None = None
        if len(paths) == 1 or not self.durable:
            for p, d in zip(paths, datas, strict=True):
                try:
                    tmps.append(write_temp(p, d, durable=self.durable))
                except BaseException as e:
                    err = e
                    break
        else:
            futures = [self._fsyncs.submit(write_temp, p, d, durable=True) for p, d in zip(paths, datas, strict=True)]
            for f in futures:
                try:
                    tmps.append(f.result())
                except BaseException as e:
                    err = err or e
        if err is not None:
            for tmp in tmps:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
            return [], err
        return tmps, None

    # ------------------------------------------------------------------ commits
    def publish_commit(self, batch_id: int) -> Future[None]:
        """Make ``commits/<batch_id>`` a hard link to its (durable) offsets entry: visible now,
        so a crash from here on does not replay the batch. The future is done once the marker
        is durable (its folder fsynced by the next background job, or by :meth:`flush`)."""
        path = os.path.join(self.commits_dir, str(batch_id))
        if self._links:
            try:
                self._link(os.path.join(self.offsets_dir, str(batch_id)), path)
            except OSError as e:
                if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
                    raise
                log.info("checkpoint: no hard links in %s (%s): commit markers are written whole", self.commits_dir, e)
                self._links = False
        if not self._links:
            return self.commit(batch_id)
        done: Future[None] = Future()
        with self._unsynced_lock:
            self._unsynced.append((batch_id, done))
        return done

    @staticmethod
    def _link(src: str, path: str) -> None:
        try:
            os.link(src, path)
        except FileExistsError:  # a marker left by an earlier run (rolled back by hand): replace it
            tmp = f"{path}.{os.getpid()}.link.tmp"
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            os.link(src, tmp)
            publish(tmp, path)

    def flush(self) -> None:
        """Make the markers linked so far durable soon, without waiting for the next offsets
        entry (the engine calls it before it waits for a marker)."""
        with self._unsynced_lock:
            if not self._unsynced:
                return
        self._pool.submit(self._sync_commits)

    def _sync_commits(self) -> None:
        with self._unsynced_lock:
            pending, self._unsynced = self._unsynced, []
        if not pending:
            return
        try:
            if self.durable:
                self._commits_sync.sync()
        except BaseException as e:
            for _, done in pending:
                done.set_exception(e)
            return
        for _, done in pending:
            done.set_result(None)
        for batch_id, _ in pending:
            self._purge_before(batch_id)

    def commit(self, batch_id: int, info: dict[str, Any] | None = None,
               after: Sequence[Any] = ()) -> Future[None]:  # fmt: skip
        """:meth:`commit_whole`'s durable future alone."""
        return self.commit_whole(batch_id, info, after)[1]

    def commit_whole(self, batch_id: int, info: dict[str, Any] | None = None,
                     after: Sequence[Any] = ()) -> tuple[Future[None], Future[None]]:  # fmt: skip
        """Write ``commits/<batch_id>`` (with ``info``) whole in the background, after calling
        ``result()`` on everything in ``after`` (futures, or the batch's pending state writes,
        which then run on this thread; a failure fails the marker, which is then not
        written). For markers whose body is known only after the batch (a watermark's
        event-time maxima). Two futures: *visible* (the marker's file fsynced and renamed into
        place, as a linked marker is when :meth:`publish_commit` returns) and *durable* (its
        folder fsynced too). Called once per batch, from the engine's thread."""
        visible: Future[None] = Future()
        durable: Future[None] = Future()
        self._pool.submit(self._write_commit, batch_id, info, after, visible, durable)
        return visible, durable

    def _write_commit(self, batch_id: int, info: dict[str, Any] | None, after: Sequence[Any],
                      visible: Future[None], durable: Future[None]) -> None:  # fmt: skip
        path = os.path.join(self.commits_dir, str(batch_id))
        try:
            # the marker's temporary file is written and fsynced while the batch's state writes
            # may still run; only its rename (which makes it visible) waits for them
            tmp = write_temp(path, commit_json(batch_id, info), durable=self.durable)
            try:
                for f in after:  # the batch's state is durable before its marker (written here if pending)
                    f.result()
                publish(tmp, path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
        except BaseException as e:
            visible.set_exception(e)
            durable.set_exception(e)
            return
        visible.set_result(None)
        try:
            if self.durable:
                self._commits_sync.sync()
        except BaseException as e:
            durable.set_exception(e)
            return
        durable.set_result(None)
        self._purge_before(batch_id)

    def _purge_before(self, batch_id: int) -> None:
        old = batch_id - self.retain
        if old >= 0:  # one old batch drops out per new batch: constant work per batch
            purge(self.offsets_dir, self.commits_dir, old)

    # ------------------------------------------------------------------ close
    def close(self) -> None:
        """Wait for the writes in flight and make the linked markers durable. Idempotent."""
        with contextlib.suppress(RuntimeError):  # already shut down
            self._pool.submit(self._sync_commits)
        self._pool.shutdown(wait=True)
        self._fsyncs.shutdown(wait=True)


def purge(offsets_dir: str, commits_dir: str, batch_id: int) -> None:
    """Delete batch ``batch_id``'s offsets entry and marker (missing ones are fine)."""
    for folder in (offsets_dir, commits_dir):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(folder, str(batch_id)))
