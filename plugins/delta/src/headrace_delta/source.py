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
from typing import Any

import pyarrow as pa

from headrace.errors import DataLossError, HeadraceError, UnsupportedError
from headrace.helpers.admission import AdmissionBudget
from headrace.options import Options
from headrace.protocols import Offset, Partition, ReadLimit, Source, SourceContext
from headrace_delta._log import (
    Commit,
    log_versions,
    read_commit,
)
from headrace_delta._offset import DeltaOffset
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
from headrace_delta._schema import check_protocol, plain
from headrace_delta._storage import TableLocation
from headrace_delta._versions import TableVersions, _Gone, _SnapFile

__all__ = ["DeltaOffset", "DeltaSource"]

log = logging.getLogger(__name__)


class DeltaSource(TableVersions, Source):
    """Streams a Delta table: the initial snapshot, then each later commit's new files.

    Built once per query run on the driver; loads the table's latest metadata (one delta-rs
    load, which uses the log checkpoints) but reads no data.
    """

    replayable = True
    supports_planning_ahead = True  # latest_offset walks the table's log: the same versions whenever it is asked

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
        self._loaded = None
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
        state["_loaded"] = None
        return state



def _group(items: list[FileTask | CdfTask], target: int = 4) -> list[Partition]:
    """Contiguous groups of items (order kept), at most ``target`` groups."""
    if not items:
        return []
    n = min(target, len(items))
    size = -(-len(items) // n)
    return [DeltaPartition(tuple(items[i : i + size])) for i in range(0, len(items), size)]
