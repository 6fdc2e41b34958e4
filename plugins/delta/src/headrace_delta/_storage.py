"""Where a table lives: local folder or object store, as a picklable handle with lazy I/O."""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import unquote, urlparse

import pyarrow as pa
import pyarrow.fs as pafs

from headrace.helpers.storage import is_not_found

__all__ = ["TableLocation", "normalize_uri"]


def normalize_uri(uri: str) -> str:
    """A table URI as delta-rs and headrace use it: local paths absolute, without ``file://``."""
    text = str(uri).strip()
    if text.startswith("file://"):
        text = unquote(urlparse(text).path)
    if "://" not in text:
        return os.path.abspath(text)
    return text.rstrip("/")


class TableLocation:
    """A Delta table's root and its storage options (secrets never shown in the repr).

    Picklable: the filesystem is created lazily in each process that reads.
    """

    def __init__(self, uri: str, storage_options: dict[str, str] | None = None) -> None:
        self.uri = normalize_uri(uri)
        self._storage_options = dict(storage_options or {})
        self._fs: pafs.FileSystem | None = None

    @property
    def is_local(self) -> bool:
        return "://" not in self.uri

    @property
    def storage_options(self) -> dict[str, str] | None:
        """For delta-rs calls (``None`` when empty)."""
        return dict(self._storage_options) or None

    def __repr__(self) -> str:
        return f"TableLocation({self.uri!r}, storage_options=<{len(self._storage_options)} keys>)"

    def __getstate__(self) -> dict[str, Any]:
        return {"uri": self.uri, "_storage_options": self._storage_options, "_fs": None}

    # ------------------------------------------------------------------ files
    def fs(self) -> pafs.FileSystem:
        """The filesystem; paths given to it are ``self.path(rel)``. Created once per process."""
        if self._fs is None:
            if self.is_local:
                self._fs = pafs.LocalFileSystem(use_mmap=False)
            else:
                from deltalake.fs import DeltaStorageHandler

                self._fs = pafs.PyFileSystem(DeltaStorageHandler(self.uri, self.storage_options))
        return self._fs

    def path(self, rel: str) -> str:
        """The filesystem path of ``rel`` (a path relative to the table root, URL-decoded)."""
        if self.is_local:
            return os.path.join(self.uri, rel)
        return rel

    def data_path(self, add_path: str) -> str:
        """The filesystem path of an add action's ``path`` (URL-encoded, relative or absolute)."""
        if "://" in add_path:
            parsed = urlparse(add_path)
            if parsed.scheme == "file" and self.is_local:
                return unquote(parsed.path)
            if not self.is_local and add_path.startswith(self.uri + "/"):
                return unquote(add_path[len(self.uri) + 1 :])
            raise ValueError(
                f"data file {add_path!r} lies outside table {self.uri!r} (a shallow clone?); headrace-delta "
                "reads only files under the table root"
            )
        return self.path(unquote(add_path))

    def read_bytes(self, rel: str) -> bytes | None:
        """The content of ``rel`` (relative to the root), or None if it does not exist."""
        try:
            with self.fs().open_input_stream(self.path(rel)) as f:
                data: bytes = f.read()
                return data
        except FileNotFoundError:
            return None
        except OSError as e:  # object stores report a missing key as a generic error
            if is_not_found(e):
                return None
            raise

    def list_names(self, rel_dir: str) -> list[str]:
        """Base names in a folder (relative to the root); [] if it does not exist."""
        try:
            infos = self.fs().get_file_info(pafs.FileSelector(self.path(rel_dir), allow_not_found=True))
        except FileNotFoundError:
            return []
        return sorted(os.path.basename(i.path.rstrip("/")) for i in infos)

    def open_data(self, path: str) -> pa.NativeFile:
        """Open a data file for random access (``path`` from :meth:`data_path`)."""
        return self.fs().open_input_file(path)

