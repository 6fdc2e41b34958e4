"""A local folder of files, read, moved and deleted without ever following a symbolic link.

Symbolic links inside the root are never followed (the root itself may be one): a link is not
listed, and reading, moving or deleting reaches a file only through real folders (each folder
below the root is opened with ``O_NOFOLLOW`` and the file is looked at with ``lstat``; a read
also checks that the file it opened is that one), so a file outside the root is never read,
moved or deleted, even when a folder is swapped for a link between listing and clean-up, and a
link loop cannot list a file twice.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import stat as stat_mod
from collections.abc import Iterator

import pyarrow as pa

from headrace.errors import HeadraceError
from headrace_cloudfiles.storage import FileInfo, Store, hidden, maybe_decompress

__all__ = ["LocalStore", "NotARegularFileError"]

log = logging.getLogger(__name__)


class NotARegularFileError(HeadraceError):
    """A path under a local root is a symbolic link, lies under one, or is not a regular file."""


_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_DIR_FD = os.open in os.supports_dir_fd and os.stat in os.supports_dir_fd and _O_NOFOLLOW != 0
_MAX_WARNED = 1000


class LocalStore(Store):
    """Files under a local directory. Symbolic links below the root are never followed."""

    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(root.removeprefix("file://"))
        self._warned: set[str] = set()

    def _abs(self, rel: str) -> str:
        return os.path.join(self.root, *rel.split("/"))

    def _warn_link(self, rel: str) -> None:
        if rel not in self._warned and len(self._warned) < _MAX_WARNED:
            self._warned.add(rel)
            log.warning(
                "cloudFiles: skipping %s: it is a symbolic link, and links inside the load path %s are not "
                "followed (files outside the load path are never read, moved or deleted); move or copy the "
                "data into the load path instead",
                self._abs(rel), self.root,
            )  # fmt: skip

    def list(self, start_after: str | None = None) -> Iterator[FileInfo]:
        if not os.path.isdir(self.root):
            return
        yield from self._walk(self.root, "", start_after)

    def _walk(self, folder: str, prefix: str, start_after: str | None) -> Iterator[FileInfo]:
        try:
            with os.scandir(folder) as it:
                entries = []
                for e in it:
                    if hidden(e.name):
                        continue
                    try:
                        if e.is_symlink():
                            self._warn_link(prefix + e.name)
                            continue
                        is_dir = e.is_dir(follow_symlinks=False)
                        if not is_dir and not e.is_file(follow_symlinks=False):
                            continue  # fifos, sockets, devices: not data
                    except OSError:
                        continue
                    entries.append((prefix + e.name + ("/" if is_dir else ""), is_dir, e))
        except (FileNotFoundError, NotADirectoryError):
            return
        entries.sort(key=lambda t: t[0])
        for key, is_dir, e in entries:
            if is_dir:
                if start_after is not None and key < start_after and not start_after.startswith(key):
                    continue  # every path below sorts before start_after
                yield from self._walk(e.path, key, start_after)
                continue
            if start_after is not None and key <= start_after:
                continue
            try:
                st = e.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            yield FileInfo(key, st.st_size, st.st_mtime_ns // 1_000_000)

    # ------------------------------------------------------------------ no-follow access
    def _parts(self, rel: str) -> tuple[str, ...]:
        parts = tuple(rel.split("/"))
        if not rel or any(p in ("", ".", "..") for p in parts):
            raise NotARegularFileError(f"{rel!r} is not a path inside {self.root}; cloudFiles refuses to touch it")
        return parts

    @contextlib.contextmanager
    def _folder(self, rel: str) -> Iterator[tuple[int | None, str]]:
        """``(fd of rel's folder, file name)``, the folder reached from the root without
        following any link (``None`` and the full path where the OS has no ``dir_fd``).

        Raises NotARegularFileError when a folder on the way is a link, FileNotFoundError
        when one is missing."""
        parts = self._parts(rel)
        if not _DIR_FD:  # pragma: no cover - Windows: check the real path instead
            path = self._abs(rel)
            if os.path.realpath(os.path.dirname(path)) != os.path.join(os.path.realpath(self.root), *parts[:-1]):
                raise NotARegularFileError(f"{self.uri(rel)} lies under a symbolic link; cloudFiles does not follow links")
            yield None, path
            return
        fd = os.open(self.root, os.O_RDONLY | _O_DIRECTORY | _O_CLOEXEC)
        try:
            for i, part in enumerate(parts[:-1]):
                try:
                    nfd = os.open(part, os.O_RDONLY | _O_DIRECTORY | _O_NOFOLLOW | _O_CLOEXEC, dir_fd=fd)
                except OSError as e:
                    if e.errno in (errno.ELOOP, errno.ENOTDIR):
                        where = self._abs("/".join(parts[: i + 1]))
                        raise NotARegularFileError(
                            f"{self.uri(rel)} lies under {where}, which is a symbolic link (or not a folder); "
                            "cloudFiles never follows links inside the load path"
                        ) from None
                    raise
                os.close(fd)
                fd = nfd
            yield fd, parts[-1]
        finally:
            os.close(fd)

    def _lstat(self, fd: int | None, name: str, rel: str) -> os.stat_result:
        st = os.stat(name, dir_fd=fd, follow_symlinks=False) if fd is not None else os.lstat(name)
        if not stat_mod.S_ISREG(st.st_mode):
            raise NotARegularFileError(
                f"{self.uri(rel)} is " + ("a symbolic link" if stat_mod.S_ISLNK(st.st_mode) else "not a regular file")
                + "; cloudFiles never follows links inside the load path"
            )
        return st

    def stat(self, rel: str) -> FileInfo | None:
        try:
            with self._folder(rel) as (fd, name):
                st = self._lstat(fd, name, rel)
        except NotARegularFileError:
            self._warn_link(rel)
            return None
        except (FileNotFoundError, NotADirectoryError):
            return None
        return FileInfo(rel, st.st_size, st.st_mtime_ns // 1_000_000)

    def open(self, rel: str, *, decompress: bool = True) -> pa.NativeFile:
        with self._folder(rel) as (fd, name):
            st = self._lstat(fd, name, rel)
            f = pa.OSFile(self._abs(rel))
            try:
                now = os.fstat(f.fileno())
            except BaseException:
                f.close()
                raise
            if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):  # swapped for a link in between
                f.close()
                raise NotARegularFileError(f"{self.uri(rel)} changed into a link while being opened; not read")
        return maybe_decompress(f, rel, decompress)

    def uri(self, rel: str) -> str:
        return "file://" + self._abs(rel)

    def rel_of(self, uri: str) -> str | None:
        path = os.path.abspath(uri.removeprefix("file://"))
        if not path.startswith(self.root + os.sep):
            return None
        return os.path.relpath(path, self.root).replace(os.sep, "/")

    def move(self, rel: str, destination: str) -> None:
        """Move the file (never a link, never through one) to ``destination/rel``."""
        dest = os.path.join(os.path.abspath(destination.removeprefix("file://")), *rel.split("/"))
        try:
            with self._folder(rel) as (fd, name):
                self._lstat(fd, name, rel)
                os.makedirs(os.path.dirname(dest), exist_ok=True)
                try:
                    os.rename(name, dest, src_dir_fd=fd) if fd is not None else os.rename(name, dest)
                except OSError as e:
                    if e.errno != errno.EXDEV:
                        raise
                    self._copy_then_unlink(fd, name, dest)
        except FileNotFoundError:
            return

    def _copy_then_unlink(self, fd: int | None, name: str, dest: str) -> None:
        flags = os.O_RDONLY | _O_NOFOLLOW | _O_CLOEXEC
        src = os.open(name, flags, dir_fd=fd) if fd is not None else os.open(name, flags)
        tmp = os.path.join(os.path.dirname(dest), f".{os.path.basename(dest)}.headrace-move")
        with os.fdopen(src, "rb") as r, open(tmp, "wb") as w:
            shutil.copyfileobj(r, w, 1 << 20)
            w.flush()
            os.fsync(w.fileno())
        os.replace(tmp, dest)
        os.unlink(name, dir_fd=fd) if fd is not None else os.unlink(name)

    def delete(self, rel: str) -> None:
        """Delete the file; a link (or a file under one) is refused, a missing file is not an error."""
        try:
            with self._folder(rel) as (fd, name):
                self._lstat(fd, name, rel)
                os.unlink(name, dir_fd=fd) if fd is not None else os.unlink(name)
        except FileNotFoundError:
            return
