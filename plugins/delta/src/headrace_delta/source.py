"""``DeltaSource``: a Delta table as a replayable stream (Spark's ``DeltaSource`` semantics).

Offsets (``DeltaOffset``) are Spark's ``DeltaSourceOffset``: a table version
(``reservoirVersion``), a position among that version's files (``index``: how many are
already processed) and whether the version is read as its full snapshot
(``isStartingVersion``) or as the files its commit added. With ``withEventTimeOrder``, the
snapshot position is ``eventTimeStart`` instead: every row with an earlier event time is
processed. A version is finished when the offset moves to ``(version + 1, 0)``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from headrace.errors import DataLossError, HeadraceError, SchemaChangedError, UnsupportedError
from headrace.helpers.admission import AdmissionBudget
from headrace.helpers.dataloss import DataLossPolicy
from headrace.options import Options
from headrace.protocols import Offset, Partition, ReadLimit, Source, SourceContext
from headrace_delta._log import (
    AddFile,
    Commit,
    TableInfo,
    latest_checkpoint_version,
    log_versions,
    read_commit,
)
from headrace_delta._options import (  # typed option handles
    EVENT_TIME_COLUMN,
    EXCLUDE_REGEX,
    FAIL_ON_DATA_LOSS,
    IGNORE_CHANGES,
    IGNORE_DELETES,
    MAX_BYTES_PER_TRIGGER,
    MAX_FILES_PER_TRIGGER,
    PATH,
    READ_CHANGE_FEED,
    SKIP_CHANGE_COMMITS,
    STARTING_TIMESTAMP,
    STARTING_VERSION,
    STORAGE_PREFIX,
    WITH_EVENT_TIME_ORDER,
)
from headrace_delta._read import (
    CDF_COLUMNS,
    CdfTask,
    DeltaPartition,
    FileTask,
    event_keys,
    read_cdf_version,
    read_file,
)
from headrace_delta._schema import PHYSICAL_NAME, check_protocol, plain
from headrace_delta._storage import TableLocation

__all__ = ["DeltaOffset", "DeltaSource"]

log = logging.getLogger(__name__)

_OFFSET_FORMAT = 1
_TIMESTAMP_SLACK_US = 1000  # file statistics of timestamps are truncated to milliseconds


@dataclass(frozen=True, order=True)
class DeltaOffset:
    """A position in the stream of a Delta table; serialized as a JSON dict."""

    version: int
    index: int
    snapshot: bool
    event_time: Any = None

    def to_json(self, table_id: str, event_order: bool) -> Offset:
        out: Offset = {
            "sourceVersion": _OFFSET_FORMAT,
            "reservoirId": table_id,
            "reservoirVersion": self.version,
            "index": self.index,
            "isStartingVersion": self.snapshot,
        }
        if event_order and self.snapshot:
            out["eventTimeStart"] = self.event_time
        return out


@dataclass(frozen=True)
class _SnapFile:
    add: AddFile
    deleted_rows: tuple[int, ...]
    ev_min: Any
    ev_max: Any


class DeltaSource(Source):
    """Streams a Delta table: the initial snapshot, then each later commit's new files.

    Built once per query run on the driver; loads the table's latest metadata (one delta-rs
    load, which uses the log checkpoints) but reads no data.
    """

    replayable = True

    def __init__(self, options: Options, context: SourceContext) -> None:
        super().__init__(options, context)
        self.loc = TableLocation(str(options[PATH]), options.passthrough(STORAGE_PREFIX))
        self.max_files: int = int(options[MAX_FILES_PER_TRIGGER])
        self.max_bytes: int | None = options[MAX_BYTES_PER_TRIGGER]
        self.skip_change_commits = bool(options[SKIP_CHANGE_COMMITS])
        self.ignore_deletes = bool(options[IGNORE_DELETES])
        self.ignore_changes = bool(options[IGNORE_CHANGES])
        self.fail_on_data_loss = bool(options[FAIL_ON_DATA_LOSS])
        self.cdf = bool(options[READ_CHANGE_FEED])
        self.event_order = bool(options[WITH_EVENT_TIME_ORDER])
        self.event_column: str | None = options[EVENT_TIME_COLUMN] if self.event_order else None
        self.exclude = re.compile(rx) if (rx := options[EXCLUDE_REGEX]) else None
        self._commits: dict[int, Commit] = {}
        self._snapshots: dict[int, list[_SnapFile]] = {}
        self._new_listed = 0
        self._bound: DeltaOffset | None = None
        self._known_latest, self.info, protocol = self._load_latest()
        check_protocol(protocol, f"Delta table {self.loc.uri}")
        self._table_schema = self.info.arrow_schema
        out = plain(self._table_schema)
        if self.cdf:
            for f in CDF_COLUMNS:
                if f.name in out.names:
                    raise UnsupportedError(
                        f"Delta table {self.loc.uri} has a column named {f.name}, which readChangeFeed adds; rename it"
                    )
                out = out.append(f)
        self._schema = out
        if self.event_column is not None:
            if self.event_column not in self._table_schema.names:
                raise HeadraceError(
                    f"eventTimeColumn {self.event_column!r} is not a column of Delta table {self.loc.uri}; "
                    f"columns: {', '.join(self._table_schema.names)}"
                )
            event_keys(pa.nulls(0, self._table_schema.field(self.event_column).type))  # type check

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

    @property
    def schema(self) -> pa.Schema:
        """The table's schema at the latest version when the query started (plus the change-feed
        columns with readChangeFeed). Called once per run, before the first batch."""
        return self._schema

    # ------------------------------------------------------------------ offsets
    def _offset(self, o: DeltaOffset) -> Offset:
        return o.to_json(self.info.table_id, self.event_order)

    def _parse(self, raw: Offset) -> DeltaOffset:
        try:
            table_id = raw.get("reservoirId")
            o = DeltaOffset(
                int(raw["reservoirVersion"]),
                int(raw["index"]),
                bool(raw["isStartingVersion"]),
                raw.get("eventTimeStart"),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise HeadraceError(f"Delta source offset {raw!r} is not valid ({e}); use a new checkpoint") from e
        if table_id and table_id != self.info.table_id:
            raise HeadraceError(
                f"the checkpoint was made for Delta table id {table_id}, but {self.loc.uri} now holds table id "
                f"{self.info.table_id} (re-created?); start from a new checkpoint"
            )
        if o.snapshot and o.index > 0 and self.event_order and "eventTimeStart" not in raw:
            raise UnsupportedError(
                "withEventTimeOrder cannot be turned on while the initial snapshot is being processed "
                f"(version {o.version}); turn it off again or start from a new checkpoint"
            )
        if o.snapshot and "eventTimeStart" in raw and not self.event_order:
            raise UnsupportedError(
                "withEventTimeOrder cannot be turned off while the initial snapshot is being processed "
                f"(version {o.version}); turn it on again or start from a new checkpoint"
            )
        return o

    def initial_offset(self) -> Offset:
        """Where a new stream starts: the latest version's snapshot, or ``startingVersion`` /
        ``startingTimestamp``. Called once, only for a new checkpoint."""
        opts = self.options
        latest = self._known_latest
        if opts.is_set(STARTING_VERSION):
            sv = opts[STARTING_VERSION]
            if sv == "latest":
                return self._offset(DeltaOffset(latest + 1, 0, False))
            v = int(sv)
            if v > latest:
                raise HeadraceError(
                    f"startingVersion {v} is after the latest version {latest} of Delta table {self.loc.uri}; "
                    "use startingVersion 'latest' to read only new commits"
                )
            if read_commit(self.loc, v, self.info) is None:
                versions = log_versions(self.loc)
                raise DataLossError(
                    f"startingVersion {v} of Delta table {self.loc.uri} is no longer in the transaction log "
                    f"(earliest available: {versions[0] if versions else 'none'}); choose a later startingVersion"
                )
            return self._offset(DeltaOffset(v, 0, False))
        if opts.is_set(STARTING_TIMESTAMP):
            return self._offset(DeltaOffset(self._version_at(opts[STARTING_TIMESTAMP]), 0, False))
        return self._offset(DeltaOffset(latest, 0, True))

    def _version_at(self, ts: Any) -> int:
        """The first version committed at or after ``ts`` (earliest if before the first commit,
        latest + 1 if after the last)."""
        target = int(ts.timestamp() * 1000)
        versions = [v for v in log_versions(self.loc) if v <= self._known_latest]
        if not versions:
            return self._known_latest + 1

        def stamp(v: int) -> int:
            c = self._commit(v, strict=False)
            return c.timestamp if c is not None else 0

        lo, hi = 0, len(versions)
        while lo < hi:  # commit timestamps are monotonic (in-commit timestamps or commitInfo)
            mid = (lo + hi) // 2
            if stamp(versions[mid]) < target:
                lo = mid + 1
            else:
                hi = mid
        return versions[lo] if lo < len(versions) else self._known_latest + 1

    def prepare_for_available_now(self) -> bool:
        """Record the end of the commits present now; never read beyond it. Called once per run
        with ``trigger(available_now=True)``."""
        v = self._known_latest
        while self._commit(v + 1, strict=False) is not None:
            v += 1
        self._bound = DeltaOffset(v + 1, 0, False)
        return True

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

        try:
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
        actions = pa.table(dt.get_add_actions(flatten=True))
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

    # ------------------------------------------------------------------ admission
    def latest_offset(self, start: Offset, limit: ReadLimit) -> Offset:
        """The end of the next batch: snapshot files, then each commit's new files, within
        ``limit``. Called once per trigger on the driver; reads only log entries not seen yet."""
        self._new_listed = 0
        pos = self._parse(start)
        end = self._advance(pos, AdmissionBudget(limit))
        self._scan_to_end(end.version)
        return self._offset(end)

    def _advance(self, pos: DeltaOffset, budget: AdmissionBudget) -> DeltaOffset:
        v, idx = pos.version, pos.index
        if pos.snapshot:
            if self.event_order:
                return self._advance_event_time(pos, budget)
            snap = self._snapshot(v)
            while idx < len(snap) and budget.admit(files=1, bytes=snap[idx].add.size):
                idx += 1
            if idx < len(snap):
                return DeltaOffset(v, idx, True)
            v, idx = v + 1, 0
        while not budget.exhausted:
            if self._bound is not None and (v, idx) >= (self._bound.version, self._bound.index):
                break
            try:
                c = self._commit(v)
            except _Gone:
                v, idx = self._after_gap(v), 0
                continue
            if c is None:
                break
            files = self._commit_files(c)
            if files is None:  # schema change: end the batch before it, or fail if nothing precedes it
                if (v, idx) == (pos.version, pos.index) and not pos.snapshot:
                    raise self._schema_changed(v)
                break
            if self.cdf:
                n = len(files)
                if n and not budget.admit(files=n, bytes=sum(f.size for f in files)):
                    break
                v, idx = v + 1, 0
                continue
            while idx < len(files) and budget.admit(files=1, bytes=files[idx].size):
                idx += 1
            if idx < len(files):
                break
            v, idx = v + 1, 0
        return DeltaOffset(v, idx, False)

    def _advance_event_time(self, pos: DeltaOffset, budget: AdmissionBudget) -> DeltaOffset:
        lo = pos.event_time
        files = self._snapshot(pos.version)
        cands = [f for f in files if lo is None or f.ev_max is None or f.ev_max >= lo]

        def key(f: _SnapFile) -> tuple[int, Any]:
            # files without statistics (or only null event times) overlap every range: last
            if f.ev_min is None:
                return (2, 0)
            return (1, f.ev_min if lo is None or f.ev_min > lo else lo)

        cands.sort(key=lambda f: (key(f), f.add.modification_time, f.add.path))
        i = 0
        while i < len(cands) and budget.admit(files=1, bytes=cands[i].add.size):
            i += 1
        if i == len(cands):
            return DeltaOffset(pos.version + 1, 0, False)
        last = key(cands[i - 1])
        while i < len(cands) and key(cands[i]) == last:  # ties: a range must move forward
            i += 1
        if i == len(cands) or key(cands[i])[0] == 2:
            return DeltaOffset(pos.version + 1, 0, False)
        return DeltaOffset(pos.version, 0, True, key(cands[i])[1])

    def _scan_to_end(self, v: int) -> None:
        """Parse the commits present now from ``v`` on (once each), for the backlog metrics."""
        while self._bound is None or v < self._bound.version:
            try:
                if self._commit(v, strict=False) is None:
                    break
            except Exception:
                break
            v += 1

    # ------------------------------------------------------------------ reading
    def partitions(self, start: Offset, end: Offset) -> Sequence[Partition]:
        """The files of ``[start, end)`` in stream order, grouped into a few partitions.

        Called once per batch (again for the same range on replay), on the driver."""
        if start == end:
            return []
        a, b = self._parse(start), self._parse(end)
        items: list[FileTask | CdfTask] = []
        v, idx = a.version, a.index
        if a.snapshot:
            snap = self._snapshot(v)
            ts = self._snapshot_timestamp(v) if self.cdf else 0
            change = ("insert", v, ts) if self.cdf else None
            if self.event_order:
                lo = a.event_time
                hi = b.event_time if b.snapshot else None
                for f in snap:
                    if (lo is None or f.ev_max is None or f.ev_max >= lo) and (hi is None or f.ev_min is None or f.ev_min < hi):
                        items.append(FileTask(f.add.path, f.add.partition_values, v, f.deleted_rows, (lo, hi), change))
            else:
                stop = b.index if b.snapshot and b.version == v else len(snap)
                for f in snap[idx:stop]:
                    items.append(FileTask(f.add.path, f.add.partition_values, v, f.deleted_rows, None, change))
            if b.snapshot:
                return _group(items)
            v, idx = v + 1, 0
        while (v, idx) < (b.version, b.index):
            try:
                c = self._commit(v)
            except _Gone:
                v, idx = self._after_gap(v), 0
                continue
            if c is None:
                raise HeadraceError(
                    f"version {v} of Delta table {self.loc.uri} is missing from the log although the batch "
                    f"[{start}, {end}) includes it"
                )
            files = self._commit_files(c)
            if files is None:
                raise self._schema_changed(v)
            if self.cdf:
                if files:
                    items.append(CdfTask(v))
                v, idx = v + 1, 0
                continue
            stop = b.index if v == b.version else len(files)
            dvs = self._commit_dvs(c)
            for add in files[idx:stop]:
                items.append(FileTask(add.path, add.partition_values, v, dvs.get(self.loc.data_path(add.path), ())))
            v, idx = v + 1, 0
        return _group(items)

    def _snapshot_timestamp(self, version: int) -> int:
        c = self._commit(version, strict=False)
        return c.timestamp if c is not None else 0

    def read(self, partition: Partition) -> Iterator[pa.RecordBatch]:
        """Read one partition's files in order. Called once per partition per batch, maybe in a
        worker thread or on a pickled copy; deterministic for a given partition."""
        assert isinstance(partition, DeltaPartition)
        for item in partition.items:
            if isinstance(item, CdfTask):
                yield from read_cdf_version(self.loc, item.version, self._table_schema, self._schema,
                                            fail_on_data_loss=self.fail_on_data_loss)  # fmt: skip
            else:
                yield from read_file(self.loc, item, self._table_schema, out_schema=self._schema,
                                     event_column=self.event_column, fail_on_data_loss=self.fail_on_data_loss)  # fmt: skip

    def commit(self, end: Offset) -> None:
        """Forget parsed commits before ``end``. Called once per batch after it is committed."""
        v = self._parse(end).version
        for old in [k for k in self._commits if k < v]:
            del self._commits[old]

    def metrics(self, latest: Offset) -> Mapping[str, Any]:
        """numFilesOutstanding, numBytesOutstanding, numNewListedFiles, backlogEndOffset after the
        batch ending at ``latest``. Called once per batch; uses only commits already parsed."""
        pos = self._parse(latest)
        files = 0
        size = 0
        v, idx = pos.version, pos.index
        if pos.snapshot and pos.version in self._snapshots:
            rest = self._snapshots[pos.version][idx:]
            if self.event_order:
                rest = [f for f in self._snapshots[pos.version] if f.ev_max is None or pos.event_time is None or f.ev_max >= pos.event_time]
            files += len(rest)
            size += sum(f.add.size for f in rest)
            v, idx = v + 1, 0
        end_version = self._known_latest + 1
        if self._bound is not None:
            end_version = min(end_version, self._bound.version)
        while v < end_version:
            c = self._commits.get(v)
            if c is None:
                break
            new = c.new_files[idx:]
            files += len(new)
            size += sum(f.size for f in new)
            v, idx = v + 1, 0
        return {
            "numFilesOutstanding": files,
            "numBytesOutstanding": size,
            "numNewListedFiles": self._new_listed,
            "backlogEndOffset": self._offset(DeltaOffset(end_version, 0, False)),
        }

    def close(self) -> None:
        """Drop cached log state. Called once when the query stops; idempotent."""
        self._commits.clear()
        self._snapshots.clear()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_commits"] = {}
        state["_snapshots"] = {}
        return state


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
    table = pa.table(dt.deletion_vectors())
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


def _group(items: list[FileTask | CdfTask], target: int = 4) -> list[Partition]:
    """Contiguous groups of items (order kept), at most ``target`` groups."""
    if not items:
        return []
    n = min(target, len(items))
    size = -(-len(items) // n)
    return [DeltaPartition(tuple(items[i : i + size])) for i in range(0, len(items), size)]
