"""Where the files live: a local folder or an S3 prefix, behind one small interface.

Both list files in lexical order of their path relative to the root (what incremental listing
needs), skip hidden entries (names starting with ``_`` or ``.``, as Spark and Auto Loader do),
and open a file as a ``pyarrow.NativeFile``. boto3 is imported only for ``s3://`` roots. The
local folder is :class:`headrace_cloudfiles.local.LocalStore` (symbolic links never followed).
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from headrace.errors import HeadraceError
from headrace.helpers.storage import is_not_found
from headrace_cloudfiles._options import (  # typed option handles
    CLOUD_FILES_REGION,
    S3_ADDRESSING_STYLE,
    S3_ENDPOINT_URL,
)

__all__ = ["FileInfo", "S3Store", "Store", "codec_of", "hidden", "maybe_decompress", "open_store", "split_s3"]

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


def maybe_decompress(f: pa.NativeFile, rel: str, decompress: bool) -> pa.NativeFile:
    codec = codec_of(rel) if decompress else None
    return pa.CompressedInputStream(f, codec) if codec else f


def split_s3(url: str) -> tuple[str, str]:
    """``s3://bucket/a/b`` -> ``("bucket", "a/b")``; raises naming the URL when it has no bucket."""
    rest = url.partition("://")[2]
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
            if is_not_found(e):
                return None
            raise
        return FileInfo(rel, int(head["ContentLength"]), int(head["LastModified"].timestamp() * 1000))

    def open(self, rel: str, *, decompress: bool = True) -> pa.NativeFile:
        try:
            body = self.client.get_object(Bucket=self.bucket, Key=self._key(rel))["Body"].read()
        except self.client.exceptions.NoSuchKey:
            raise FileNotFoundError(self.uri(rel)) from None
        return maybe_decompress(pa.BufferReader(body), rel, decompress)

    def open_stream(self, rel: str, *, decompress: bool = True) -> pa.NativeFile:
        try:
            body = self.client.get_object(Bucket=self.bucket, Key=self._key(rel))["Body"]
        except self.client.exceptions.NoSuchKey:
            raise FileNotFoundError(self.uri(rel)) from None
        return maybe_decompress(pa.PythonFile(body, mode="r"), rel, decompress)

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
            if is_not_found(e):
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
        endpoint = options[S3_ENDPOINT_URL] or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        if endpoint:
            kwargs["endpoint_url"] = endpoint
        if options[CLOUD_FILES_REGION]:
            kwargs["region_name"] = options[CLOUD_FILES_REGION]
        for opt, arg in (("s3.accessKeyId", "aws_access_key_id"), ("s3.secretAccessKey", "aws_secret_access_key"),
                         ("s3.sessionToken", "aws_session_token")):  # fmt: skip
            if options[opt] is not None:
                kwargs[arg] = options.reveal(opt)
        return S3Store("s3://" + path.split("://", 1)[1], kwargs, options[S3_ADDRESSING_STYLE])
    if scheme != "file":
        raise HeadraceError(
            f"path {path!r}: scheme {scheme!r} is not supported; use a local folder, file:// or s3://bucket/prefix"
        )
    from headrace_cloudfiles.local import LocalStore

    return LocalStore(path)
