"""The Delta transaction log, read incrementally.

A running stream reads only the ``_delta_log/<version>.json`` entries it has not seen (one
small read per new version, one failed probe per idle trigger). The initial snapshot of a
version, and the table's state when a stream starts, come from delta-rs (which uses the
log's checkpoints), so starting never replays the whole history.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from headrace_delta._schema import PHYSICAL_NAME, delta_schema_to_arrow, parse_partition_value
from headrace_delta._storage import TableLocation

__all__ = ["AddFile", "Commit", "TableInfo", "commit_path", "latest_checkpoint_version", "read_commit"]

LOG_DIR = "_delta_log"


def commit_path(version: int) -> str:
    return f"{LOG_DIR}/{version:020d}.json"


@dataclass(frozen=True)
class AddFile:
    """One data file to read: its path (as in the log), size, and partition values as typed
    Python values keyed by logical column name. ``stats`` is the add's JSON stats string."""

    path: str
    size: int
    partition_values: tuple[tuple[str, Any], ...]
    modification_time: int = 0
    data_change: bool = True
    stats: str | None = None
    has_dv: bool = False
    stats_min: Any = None
    stats_max: Any = None


@dataclass
class Commit:
    """What one ``<version>.json`` says, reduced to what a stream needs."""

    version: int
    timestamp: int
    operation: str
    adds: list[AddFile] = field(default_factory=list)
    data_removes: int = 0
    data_adds: int = 0
    cdc_files: int = 0
    metadata: dict[str, Any] | None = None
    protocol: dict[str, Any] | None = None

    @property
    def changes_data(self) -> bool:
        """Removes data (DELETE, UPDATE, MERGE, OVERWRITE): a remove with dataChange=true."""
        return self.data_removes > 0

    @property
    def only_deletes(self) -> bool:
        return self.data_removes > 0 and self.data_adds == 0

    @property
    def new_files(self) -> list[AddFile]:
        """The files with new data (adds with dataChange=true)."""
        return [a for a in self.adds if a.data_change]

    @property
    def size(self) -> int:
        return sum(a.size for a in self.new_files)


@dataclass(frozen=True)
class TableInfo:
    """The table's identity and schema at a version (from its metaData action)."""

    table_id: str
    version: int
    schema_string: str
    partition_columns: tuple[str, ...]
    configuration: Mapping[str, str]
    arrow_schema: pa.Schema

    @property
    def cdf_enabled(self) -> bool:
        return str(self.configuration.get("delta.enableChangeDataFeed", "false")).lower() == "true"

    @classmethod
    def from_metadata(cls, meta: Mapping[str, Any], version: int) -> TableInfo:
        return cls(
            table_id=str(meta.get("id", "")),
            version=version,
            schema_string=str(meta["schemaString"]),
            partition_columns=tuple(meta.get("partitionColumns") or ()),
            configuration=dict(meta.get("configuration") or {}),
            arrow_schema=delta_schema_to_arrow(str(meta["schemaString"])),
        )

    def physical_to_logical(self) -> dict[str, str]:
        out = {}
        for f in self.arrow_schema:
            meta = f.metadata or {}
            out[meta.get(PHYSICAL_NAME.encode(), f.name.encode()).decode()] = f.name
        return out


def parse_partition_values(raw: Mapping[str, str | None], info: TableInfo) -> tuple[tuple[str, Any], ...]:
    """An add's ``partitionValues`` (strings keyed by physical name) as typed logical values."""
    if not raw:
        return ()
    to_logical = info.physical_to_logical()
    out = []
    for key, text in raw.items():
        name = to_logical.get(key, key)
        try:
            t = info.arrow_schema.field(name).type
        except KeyError:
            t = pa.string()
        out.append((name, parse_partition_value(text, t)))
    return tuple(sorted(out))


def read_commit(loc: TableLocation, version: int, info: TableInfo | None) -> Commit | None:
    """Parse ``<version>.json``; None when it does not exist (yet, or any more).

    ``info`` gives the schema used to type partition values; a metaData action in the commit
    itself takes precedence for its own adds.
    """
    data = loc.read_bytes(commit_path(version))
    if data is None:
        return None
    commit = Commit(version=version, timestamp=0, operation="")
    raw_adds: list[dict[str, Any]] = []
    for line in data.splitlines():
        if not line.strip():
            continue
        action = json.loads(line)
        if "add" in action:
            raw_adds.append(action["add"])
        elif "remove" in action:
            if action["remove"].get("dataChange", True):
                commit.data_removes += 1
        elif "cdc" in action:
            commit.cdc_files += 1
        elif "commitInfo" in action:
            ci = action["commitInfo"]
            commit.timestamp = int(ci.get("inCommitTimestamp") or ci.get("timestamp") or 0)
            commit.operation = str(ci.get("operation") or "")
        elif "metaData" in action:
            commit.metadata = action["metaData"]
        elif "protocol" in action:
            commit.protocol = action["protocol"]
    effective = TableInfo.from_metadata(commit.metadata, version) if commit.metadata else info
    for a in raw_adds:
        dc = bool(a.get("dataChange", True))
        commit.data_adds += int(dc)
        pv = parse_partition_values(a.get("partitionValues") or {}, effective) if effective else ()
        commit.adds.append(
            AddFile(
                path=str(a["path"]),
                size=int(a.get("size") or 0),
                partition_values=pv,
                modification_time=int(a.get("modificationTime") or 0),
                data_change=dc,
                stats=a.get("stats"),
                has_dv=bool(a.get("deletionVector")),
            )
        )
    if commit.timestamp == 0:  # no commitInfo: use the file's modification time
        try:
            info_ = loc.fs().get_file_info(loc.path(commit_path(version)))
            if info_.mtime_ns:
                commit.timestamp = info_.mtime_ns // 1_000_000
        except OSError:
            pass
    return commit


def latest_checkpoint_version(loc: TableLocation) -> int | None:
    """The version in ``_delta_log/_last_checkpoint``, or None."""
    data = loc.read_bytes(f"{LOG_DIR}/_last_checkpoint")
    if not data:
        return None
    try:
        return int(json.loads(data)["version"])
    except (ValueError, KeyError, TypeError):
        return None


def log_versions(loc: TableLocation) -> list[int]:
    """Versions with a JSON commit in the log (one listing; used only when starting or on data loss)."""
    out = []
    for name in loc.list_names(LOG_DIR):
        stem, _, ext = name.partition(".")
        if ext == "json" and stem.isdigit():
            out.append(int(stem))
    return sorted(out)
