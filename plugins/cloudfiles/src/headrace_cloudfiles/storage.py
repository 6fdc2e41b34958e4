"""Where the files live: a local folder or an S3 prefix, behind one small interface.

Both list files in lexical order of their path relative to the root (what incremental listing
needs), skip hidden entries (names starting with ``_`` or ``.``, as Spark and Auto Loader do),
and open a file as a ``pyarrow.NativeFile``. boto3 is imported only for ``s3://`` roots.

Symbolic links inside a local root are never followed (the root itself may be one): a link is
not listed, and reading, moving or deleting reaches a file only through real folders (each
folder below the root is opened with ``O_NOFOLLOW`` and the file is looked at with ``lstat``),
so a file outside the root is never read, moved or deleted, even when a folder is swapped for a
link between listing and clean-up, and a link loop cannot list a file twice.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import stat as stat_mod
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from headrace.errors import HeadraceError

__all__ = ["FileInfo", "LocalStore", "NotARegularFileError", "S3Store", "Store", "open_store", "split_s3"]

log = logging.getLogger("headrace.cloudfiles")

_CODECS = {".gz": "gzip", ".gzip": "gzip", ".bz2": "bz2", ".zst": "zstd", ".zstd": "zstd", ".lz4": "lz4"}


@dataclass(frozen=True)
class FileInfo:
    """One file: its path relative to the root (``/``-separated), size and modification time."""

    rel: str
    size: int
    mtime_ms: int


def hidden(name: str) -> bool:
    """Spark's rule: names starting with ``_`` or ``.`` are not data (``_SUCCESS``, ``.tmp``)."""
    return name.startswith(("_", "."))


def codec_of(rel: str) -> str | None:
    """The compression codec implied by a file name's extension, or None."""
    return _CODECS.get(os.path.splitext(rel)[1].lower())


class Store(ABC):
    """A root folder of files. Subclasses: :class:`LocalStore`, :class:`S3Store`.

    Instances are created once per source on the driver and pickled into partitions: keep them
    free of open connections (clients are created lazily and dropped when pickled).
    """

    root: str = ""

    @abstractmethod
    def list(self, start_after: str | None = None) -> Iterator[FileInfo]:
        """Every file under the root in lexical order of ``rel``, only those after ``start_after``."""

    @abstractmethod
    def stat(self, rel: str) -> FileInfo | None:
        """The file's info now, or None when it does not exist."""

    @abstractmethod
    def open(self, rel: str, *, decompress: bool = True) -> pa.NativeFile:
        """The file's bytes as a readable (seekable unless decompressed) Arrow file.

        Raises FileNotFoundError when the file is gone."""

    def open_stream(self, rel: str, *, decompress: bool = True) -> pa.NativeFile:
        """The file's bytes as a forward-only Arrow stream that fetches only what is read (schema
        inference reads a prefix). Raises FileNotFoundError when the file is gone."""
        return self.open(rel, decompress=decompress)

    @abstractmethod
    def uri(self, rel: str) -> str:
        """The file's full path or URL (for the ``_file_path`` and messages)."""

    @abstractmethod
    def rel_of(self, uri: str) -> str | None:
        """The relative path of a full path under the root, or None when it is outside."""

    @abstractmethod
    def move(self, rel: str, destination: str) -> None:
        """Move a file to ``destination`` + ``rel`` (cleanSource MOVE)."""

    @abstractmethod
    def delete(self, rel: str) -> None:
        """Delete a file (cleanSource DELETE); a missing file is not an error."""

    def close(self) -> None:
        """Drop clients. Called once when the source closes."""


class NotARegularFileError(HeadraceError):
    """A path under a local root is a symbolic link, lies under one, or is not a regular file."""


_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_DIR_FD = os.open in os.supports_dir_fd and os.stat in os.supports_dir_fd and _O_NOFOLLOW != 0
_MAX_WARNED = 1000


def _maybe_decompress(f: pa.NativeFile, rel: str, decompress: bool) -> pa.NativeFile:
    codec = codec_of(rel) if decompress else None
    return pa.CompressedInputStream(f, codec) if codec else f


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
        return _maybe_decompress(f, rel, decompress)

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


def split_s3(url: str) -> tuple[str, str]:
    """``s3://bucket/a/b`` -> ``("bucket", "a/b")``; raises naming the URL when it has no bucket."""
    rest = url.split("://", 1)[1]
    bucket, _, prefix = rest.partition("/")
    if not bucket:
        raise HeadraceError(f"path {url!r} has no bucket; write it as s3://bucket/prefix")
    return bucket, prefix.strip("/")


class S3Store(Store):
    """Objects under ``s3://bucket/prefix`` (boto3, imported lazily)."""

    def __init__(self, root: str, client_kwargs: dict[str, Any], addressing_style: str = "auto") -> None:
        self.root = root.rstrip("/")
        self.bucket, self.prefix = split_s3(self.root)
        self._kwargs = client_kwargs
        self._style = addressing_style
        self._client: Any = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_client"] = None
        return state

    def __repr__(self) -> str:  # the kwargs may hold credentials
        return f"S3Store({self.root!r})"

    @property
    def client(self) -> Any:
        if self._client is None:
            try:
                import boto3
                from botocore.config import Config
            except ImportError as e:  # pragma: no cover - depends on the environment
                raise HeadraceError(
                    f"reading {self.root} needs boto3, which is not installed; fix: pip install 'headrace-cloudfiles[s3]'"
                ) from e
            config = Config(s3={"addressing_style": self._style}, retries={"max_attempts": 5, "mode": "standard"})
            self._client = boto3.session.Session().client("s3", config=config, **self._kwargs)
        return self._client

    def _key(self, rel: str) -> str:
        return f"{self.prefix}/{rel}" if self.prefix else rel

    def list(self, start_after: str | None = None) -> Iterator[FileInfo]:
        base = f"{self.prefix}/" if self.prefix else ""
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": base}
        if start_after:
            kwargs["StartAfter"] = base + start_after
        paginator = self.client.get_paginator("list_objects_v2")
        for page in paginator.paginate(**kwargs):
            for obj in page.get("Contents", ()):
                key: str = obj["Key"]
                rel = key[len(base):]
                if not rel or rel.endswith("/") or any(hidden(part) for part in rel.split("/")):
                    continue
                yield FileInfo(rel, int(obj["Size"]), int(obj["LastModified"].timestamp() * 1000))

    def stat(self, rel: str) -> FileInfo | None:
        try:
            head = self.client.head_object(Bucket=self.bucket, Key=self._key(rel))
        except self.client.exceptions.ClientError as e:
            if str(e.response.get("Error", {}).get("Code")) in ("404", "NoSuchKey", "NotFound"):
                return None
            raise
        return FileInfo(rel, int(head["ContentLength"]), int(head["LastModified"].timestamp() * 1000))

    def open(self, rel: str, *, decompress: bool = True) -> pa.NativeFile:
        try:
            body = self.client.get_object(Bucket=self.bucket, Key=self._key(rel))["Body"].read()
        except self.client.exceptions.NoSuchKey:
            raise FileNotFoundError(self.uri(rel)) from None
        return _maybe_decompress(pa.BufferReader(body), rel, decompress)

    def open_stream(self, rel: str, *, decompress: bool = True) -> pa.NativeFile:
        try:
            body = self.client.get_object(Bucket=self.bucket, Key=self._key(rel))["Body"]
        except self.client.exceptions.NoSuchKey:
            raise FileNotFoundError(self.uri(rel)) from None
        return _maybe_decompress(pa.PythonFile(body, mode="r"), rel, decompress)

    def uri(self, rel: str) -> str:
        return f"s3://{self.bucket}/{self._key(rel)}"

    def rel_of(self, uri: str) -> str | None:
        base = self.root + "/"
        return uri[len(base):] if uri.startswith(base) else None

    def move(self, rel: str, destination: str) -> None:
        bucket, prefix = split_s3(destination)
        key = f"{prefix}/{rel}" if prefix else rel
        try:
            self.client.copy_object(Bucket=bucket, Key=key, CopySource={"Bucket": self.bucket, "Key": self._key(rel)})
        except self.client.exceptions.ClientError as e:
            if str(e.response.get("Error", {}).get("Code")) in ("404", "NoSuchKey"):
                return
            raise
        self.delete(rel)

    def delete(self, rel: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=self._key(rel))

    def close(self) -> None:
        self._client = None


def open_store(path: str, options: Any) -> Store:
    """The store for the ``path`` option: ``s3://`` (or ``s3a://``) or a local folder.

    ``options`` are the source's validated options (S3 endpoint, region, credentials)."""
    scheme = path.split("://", 1)[0].lower() if "://" in path else "file"
    if scheme in ("s3", "s3a", "s3n"):
        kwargs: dict[str, Any] = {}
        endpoint = options["s3.endpointUrl"] or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        if endpoint:
            kwargs["endpoint_url"] = endpoint
        if options["cloudFiles.region"]:
            kwargs["region_name"] = options["cloudFiles.region"]
        for opt, arg in (("s3.accessKeyId", "aws_access_key_id"), ("s3.secretAccessKey", "aws_secret_access_key"),
                         ("s3.sessionToken", "aws_session_token")):  # fmt: skip
            if options[opt] is not None:
                kwargs[arg] = options.reveal(opt)
        return S3Store("s3://" + path.split("://", 1)[1], kwargs, options["s3.addressingStyle"])
    if scheme != "file":
        raise HeadraceError(
            f"path {path!r}: scheme {scheme!r} is not supported; use a local folder, file:// or s3://bucket/prefix"
        )
    return LocalStore(path)
