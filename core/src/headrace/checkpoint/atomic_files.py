"""Crash-safe file writes for the checkpoint: temp file + fsync + rename, and the folder's fsync.

A file is *visible* once renamed into place (it survives a SIGKILL of the process from then on)
and *durable* once its data was fsynced before the rename and its folder after it (it survives
a power loss too). :func:`atomic_write` does both in one call; the checkpoint's log writer
(:mod:`headrace.checkpoint.writer`) does the steps separately, so that the slow ones (the
fsyncs) run off the engine's thread and overlap one another.
"""

from __future__ import annotations

import contextlib
import os
import random
import threading
from collections.abc import Sequence
from typing import Any

__all__ = ["DirSync", "atomic_write", "fsync_dir", "publish", "remove_temps", "write_temp"]

_TMP_SUFFIX = ".tmp"

Buffer = Any  # bytes-like: bytes, memoryview, pyarrow.Buffer (collections.abc.Buffer is Python 3.12+)


def write_temp(path: str, data: bytes | Sequence[Buffer], *, durable: bool = True) -> str:
    """Write ``data`` (bytes, or buffers written one after the other without joining them) to a
    new temporary file next to ``path`` (fsynced when ``durable``) and return its name. The
    caller renames it into place (:func:`publish`) or deletes it."""
    # random.getrandbits, not uuid4: os.urandom cost ~0.1 ms a call on a busy machine (twice a batch)
    tmp = f"{path}.{os.getpid()}.{random.getrandbits(32):08x}{_TMP_SUFFIX}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        _write_all(fd, [data] if isinstance(data, bytes) else list(data))
        if durable:
            os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    os.close(fd)
    return tmp


def _write_all(fd: int, parts: list[Buffer]) -> None:
    """Write every byte of ``parts`` (``os.writev`` may write less than asked)."""
    views = [memoryview(p).cast("B") for p in parts]
    while views:
        n = os.writev(fd, views)
        while views and n >= len(views[0]):
            n -= len(views[0])
            views.pop(0)
        if views and n:
            views[0] = views[0][n:]


def publish(tmp: str, path: str) -> None:
    """Rename the temporary file ``tmp`` over ``path`` (atomic); deletes ``tmp`` if that fails."""
    try:
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def fsync_dir(folder: str) -> None:
    """fsync a folder, so that the names renamed or created in it survive a power loss."""
    fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class DirSync:
    """Group fsyncs of one folder: :meth:`sync` returns once an fsync of the folder that started
    after the call has completed, and one fsync serves every thread that asked while the
    previous one ran (as a database's group commit). Thread-safe."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self._cond = threading.Condition()
        self._asked = 0  # requests so far
        self._synced = 0  # requests covered by a completed fsync
        self._running = False

    def sync(self) -> None:
        """Make every name renamed or created in the folder before this call durable."""
        with self._cond:
            self._asked += 1
            mine = self._asked
            while self._synced < mine:
                if self._running:
                    self._cond.wait()
                    continue
                self._running = True
                target = self._asked
                self._cond.release()
                try:
                    fsync_dir(self.folder)
                finally:
                    self._cond.acquire()
                    self._running = False
                    self._cond.notify_all()
                self._synced = max(self._synced, target)


def atomic_write(path: str, data: bytes | Sequence[Buffer], *, durable: bool = True, sync_dir: bool = False) -> None:
    """Write ``data`` (bytes, or buffers one after the other) to ``path`` atomically (temp file + fsync + rename); with ``sync_dir``
    also fsync the folder after the rename, so the new name itself survives a power loss."""
    publish(write_temp(path, data, durable=durable), path)
    if durable and sync_dir:
        fsync_dir(os.path.dirname(path) or ".")


def remove_temps(folder: str) -> int:
    """Delete the temporary files a killed writer left in ``folder`` (only those
    :func:`write_temp` names); returns how many. Call only while holding the checkpoint's lock."""
    removed = 0
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return 0
    for name in names:
        head, _, rest = name.partition(".")
        if head.isdigit() and rest.endswith(_TMP_SUFFIX):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(folder, name))
                removed += 1
    return removed
