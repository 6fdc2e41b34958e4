"""The table's versions as ``DeltaSource`` walks them: the latest metadata, each version's
commit (parsed once, cached), gaps left by log cleanup, and snapshots in a deterministic order.

``TableVersions`` is a mixin of :class:`~headrace_delta.source.DeltaSource`; its methods are
called on the driver (from ``initial_offset``, ``latest_offset``, ``partitions``, ``metrics``),
a few times per trigger. Its caches (``_commits``, ``_snapshots``) are not pickled
(``DeltaSource.__getstate__`` empties them) and are rebuilt on demand.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from headrace.errors import DataLossError, HeadraceError, SchemaChangedError, UnsupportedError
from headrace.helpers.dataloss import DataLossPolicy
from headrace_delta._log import (
    AddFile,
    Commit,
    TableInfo,
    latest_checkpoint_version,
    log_versions,
    read_commit,
)
from headrace_delta._read import arrow_table, event_keys
from headrace_delta._schema import PHYSICAL_NAME, check_protocol, plain
from headrace_delta._storage import TableLocation

__all__ = ["TableVersions"]

log = logging.getLogger(__name__)

_TIMESTAMP_SLACK_US = 1000  # file statistics of timestamps are truncated to milliseconds


@dataclass(frozen=True)
class _SnapFile:
    add: AddFile
    deleted_rows: tuple[int, ...]
    ev_min: Any
    ev_max: Any


class TableVersions:
    """Mixin of ``DeltaSource``: reading the table's log and snapshots (see the module docstring)."""

    # set by DeltaSource.__init__
    loc: TableLocation
    info: TableInfo
    cdf: bool
    skip_change_commits: bool
    ignore_deletes: bool
    ignore_changes: bool
    fail_on_data_loss: bool
    event_column: str | None
    exclude: re.Pattern[str] | None
    _commits: dict[int, Commit]
    _snapshots: dict[int, list[_SnapFile]]
    _new_listed: int
    _known_latest: int
    _loaded: tuple[int, Any] | None
    """The delta-rs table loaded by ``_load_latest`` and its version (not pickled)."""

    # ------------------------------------------------------------------ table state
    def _load_latest(self) -> tuple[int, TableInfo, dict[str, Any]]:
        from deltalake import DeltaTable
        from deltalake.exceptions import DeltaError, TableNotFoundError

        try:
            dt = DeltaTable(self.loc.uri, storage_options=self.loc.storage_options)
        except TableNotFoundError as e:
            raise HeadraceError(
                f"no Delta table at {self.loc.uri} (no _delta_log); create it first (e.g. with a delta sink or "
                f"deltalake.write_deltalake) or check the path"
            ) from e
        except DeltaError as e:  # e.g. the path is a file: "Invalid table location"
            raise HeadraceError(
                f"cannot open the Delta table at {self.loc.uri}: {e}; check the path (a folder holding _delta_log) "
                "and the storage.* options"
            ) from e
        version = int(dt.version())
        self._loaded = (version, dt)  # the snapshot of this version, if asked, reuses it
        meta = dt.metadata()
        info = TableInfo.from_metadata(
            {
                "id": meta.id,
                "schemaString": dt.schema().to_json(),
                "partitionColumns": list(meta.partition_columns),
                "configuration": dict(meta.configuration),
            },
            version,
        )
        p = dt.protocol()
        protocol = {"minReaderVersion": p.min_reader_version, "readerFeatures": list(p.reader_features or ())}
        return version, info, protocol

    # ------------------------------------------------------------------ the log
    def _commit(self, version: int, *, strict: bool = True) -> Commit | None:
        """The parsed commit of ``version`` (cached), or None if it is not (yet) in the log.

        With ``strict``, a version that is gone from the log while later ones exist is data loss.
        """
        c = self._commits.get(version)
        if c is not None:
            return c
        c = read_commit(self.loc, version, self.info)
        if c is None:
            if strict and self._gone(version):
                raise _Gone(version)
            return None
        self._commits[version] = c
        if version > self._known_latest:
            self._known_latest = version
            self._new_listed += len(c.new_files)
        return c

    def _gone(self, version: int) -> bool:
        if version <= self._known_latest:
            return True
        cp = latest_checkpoint_version(self.loc)
        if cp is not None and cp >= version:
            return True
        return self.loc.read_bytes(f"_delta_log/{version + 1:020d}.json") is not None

    def _after_gap(self, version: int) -> int:
        """After missing log entries at ``version``: fail, or the first version still in the log."""
        later = [v for v in log_versions(self.loc) if v > version]
        msg = (
            f"DELTA_FILE_NOT_FOUND_DETAILED: the log entry of version {version} of Delta table {self.loc.uri} "
            f"is gone (log retention/cleanup)"
        )
        if not later and not self.fail_on_data_loss:
            raise DataLossError(f"{msg} and no later version is left in the log; start from a new checkpoint")
        fix = "start from a new checkpoint, or set failOnDataLoss=false to skip to the earliest version still in the log"
        DataLossPolicy(self.fail_on_data_loss, "delta", fix=fix + (f" ({later[0]})" if later else "")).lost(
            f"{msg}; the stream cannot continue without losing data", skip=f"skipping to version {later[0] if later else '?'}"
        )
        return later[0]

    def _commit_files(self, c: Commit) -> list[AddFile] | None:
        """The files of a commit to stream; None when the commit changes the schema."""
        if c.protocol is not None:
            check_protocol(c.protocol, f"Delta table {self.loc.uri} at version {c.version}")
        if c.metadata is not None and c.version > self.info.version:
            new = TableInfo.from_metadata(c.metadata, c.version)
            if plain(new.arrow_schema) != plain(self.info.arrow_schema) or new.partition_columns != self.info.partition_columns:
                return None
        if self.cdf:
            return list(c.adds) if (c.data_adds or c.data_removes or c.cdc_files) else []
        if c.changes_data:
            if self.skip_change_commits:
                return []
            if self.ignore_changes or (self.ignore_deletes and c.only_deletes):
                files = c.new_files
            else:
                raise UnsupportedError(
                    f"Delta table {self.loc.uri}: version {c.version} ({c.operation or 'unknown operation'}) removes "
                    f"or rewrites existing data ({c.data_removes} file(s) removed), which a stream of appends cannot "
                    "follow. Set skipChangeCommits=true to skip such commits, ignoreDeletes=true to skip commits "
                    "that only delete (e.g. whole partitions), or ignoreChanges=true to re-emit rewritten files "
                    "(duplicates downstream); or readChangeFeed=true to stream the changes."
                )
        else:
            files = c.new_files
        if self.exclude is not None:
            files = [f for f in files if not self.exclude.search(f.path)]
        return files

    def _schema_changed(self, version: int) -> SchemaChangedError:
        c = self._commits[version]
        assert c.metadata is not None
        new = plain(TableInfo.from_metadata(c.metadata, version).arrow_schema)
        return SchemaChangedError(
            f"the schema of Delta table {self.loc.uri} changed at version {version} ({c.operation or 'metadata change'}) "
            f"from [{_describe(plain(self.info.arrow_schema))}] to [{_describe(new)}]; restart the query to continue "
            "with the new schema"
        )

    def _snapshot(self, version: int) -> list[_SnapFile]:
        """The files of the snapshot at ``version`` in a deterministic order (cached)."""
        cached = self._snapshots.get(version)
        if cached is not None:
            return cached
        from deltalake import DeltaTable

        loaded, self._loaded = self._loaded, None  # used once: a snapshot is read once per run
        try:
            if loaded is not None and loaded[0] == version:
                dt = loaded[1]
            else:
                dt = DeltaTable(self.loc.uri, version=version, storage_options=self.loc.storage_options)
        except Exception as e:
            raise DataLossError(
                f"the snapshot of version {version} of Delta table {self.loc.uri} cannot be loaded any more ({e}); "
                "start from a new checkpoint"
            ) from e
        p = dt.protocol()
        features = list(p.reader_features or ())
        check_protocol({"minReaderVersion": p.min_reader_version, "readerFeatures": features},
                       f"Delta table {self.loc.uri} at version {version}")  # fmt: skip
        actions = arrow_table(dt.get_add_actions(flatten=True))
        info = self.info
        dvs: dict[str, tuple[int, ...]] = {}
        if "deletionVectors" in features:
            dvs = _deletion_vectors(dt)
        names = set(actions.column_names)
        rows = actions.to_pylist()
        ev_min: list[Any] = [None] * len(rows)
        ev_max: list[Any] = [None] * len(rows)
        if self.event_column is not None:
            f = info.arrow_schema.field(self.event_column)
            phys = (f.metadata or {}).get(PHYSICAL_NAME.encode(), f.name.encode()).decode()
            for which, out in (("min", ev_min), ("max", ev_max)):
                col = next((c for c in (f"{which}.{f.name}", f"{which}.{phys}") if c in names), None)
                if col is not None:
                    keys = event_keys(actions.column(col)).to_pylist()
                    out[:] = keys
            if pa.types.is_timestamp(f.type):
                ev_max = [m + _TIMESTAMP_SLACK_US if m is not None else None for m in ev_max]
        files = []
        for i, r in enumerate(rows):
            pv = []
            for name in info.partition_columns:
                fld = info.arrow_schema.field(name)
                phys = (fld.metadata or {}).get(PHYSICAL_NAME.encode(), fld.name.encode()).decode()
                key = next((k for k in (f"partition.{name}", f"partition.{phys}") if k in r), None)
                pv.append((name, r[key] if key is not None else None))
            add = AddFile(path=str(r["path"]), size=int(r["size_bytes"]), partition_values=tuple(sorted(pv)),
                          modification_time=int(r["modification_time"] or 0))  # fmt: skip
            if self.exclude is not None and self.exclude.search(add.path):
                continue
            files.append(_SnapFile(add, dvs.get(self.loc.data_path(add.path), ()), ev_min[i], ev_max[i]))
        files.sort(key=lambda s: (s.add.modification_time, s.add.path))
        self._snapshots = {version: files}
        return files

    def _commit_dvs(self, c: Commit) -> dict[str, tuple[int, ...]]:
        """Deletion vectors of a commit's adds (rare in appends), from the table at that version."""
        if not any(a.has_dv for a in c.adds):
            return {}
        from deltalake import DeltaTable

        dt = DeltaTable(self.loc.uri, version=c.version, storage_options=self.loc.storage_options)
        return _deletion_vectors(dt)


class _Gone(Exception):
    def __init__(self, version: int) -> None:
        super().__init__(version)
        self.version = version


def _describe(schema: pa.Schema) -> str:
    return ", ".join(f"{f.name} {f.type}" for f in schema)


def _deletion_vectors(dt: Any) -> dict[str, tuple[int, ...]]:
    """Data file path -> sorted deleted row positions, from delta-rs' selection vectors."""
    from urllib.parse import unquote, urlparse

    out: dict[str, tuple[int, ...]] = {}
    table = arrow_table(dt.deletion_vectors())
    for row in table.to_pylist():
        uri = str(row["filepath"])
        path = unquote(urlparse(uri).path) if uri.startswith("file:") else uri
        sel = row["selection_vector"] or []
        out[path] = tuple(i for i, keep in enumerate(sel) if not keep)
        if "://" in uri and not uri.startswith("file:"):
            # object stores: key relative to the table root, as TableLocation.data_path gives
            root = str(dt.table_uri).rstrip("/") + "/"
            if uri.startswith(root):
                out[unquote(uri[len(root):])] = out[path]
    return out
