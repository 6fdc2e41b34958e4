"""``CloudFilesSource``: Auto Loader-like incremental ingestion of the files under a path.

Per trigger, on the driver: discover new files (a directory listing, incremental when names
sort lexically, or the file events of a watchdog observer plus periodic backfill listings),
append them to the :class:`~headrace_cloudfiles.index.FileIndex` in the checkpoint, and admit
up to ``maxFilesPerTrigger`` files / ``maxBytesPerTrigger`` bytes. Offsets are sequence numbers
into that index (``{"seq": n}``), so a batch's range is fixed once its offsets are written and a
replay reads exactly the same files: each file is ingested exactly once with an idempotent sink.
After a batch commits, ``cleanSource`` moves or deletes its files.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa

from headrace.errors import CheckpointError, HeadraceError, OptionProblem, OptionsError
from headrace.helpers.badrecords import BadRecords
from headrace.options import Options
from headrace.protocols import Offset, Partition, ReadLimit, Source, SourceContext
from headrace_cloudfiles._options import (
    CLOUD_FILES_ALLOW_OVERWRITES,
    CLOUD_FILES_BACKFILL_INTERVAL,
    CLOUD_FILES_CLEAN_SOURCE,
    CLOUD_FILES_CLEAN_SOURCE_MOVE_DESTINATION,
    CLOUD_FILES_CLEAN_SOURCE_RETENTION_DURATION,
    CLOUD_FILES_FORMAT,
    CLOUD_FILES_INCLUDE_EXISTING_FILES,
    CLOUD_FILES_INFER_COLUMN_TYPES,
    CLOUD_FILES_MAX_BYTES_PER_TRIGGER,
    CLOUD_FILES_MAX_FILE_AGE,
    CLOUD_FILES_MAX_FILES_PER_TRIGGER,
    CLOUD_FILES_PARTITION_COLUMNS,
    CLOUD_FILES_SCHEMA_EVOLUTION_MODE,
    CLOUD_FILES_SCHEMA_HINTS,
    CLOUD_FILES_SCHEMA_INFERENCE_BYTES_PER_FILE,
    CLOUD_FILES_SCHEMA_INFERENCE_SAMPLE_SIZE_NUM_BYTES,
    CLOUD_FILES_SCHEMA_INFERENCE_SAMPLE_SIZE_NUM_FILES,
    CLOUD_FILES_SCHEMA_LOCATION,
    CLOUD_FILES_USE_INCREMENTAL_LISTING,
    CLOUD_FILES_USE_NOTIFICATIONS,
    ESCAPE,
    HEADER,
    IGNORE_CORRUPT_FILES,
    IGNORE_MISSING_FILES,
    MODIFIED_AFTER,
    MODIFIED_BEFORE,
    MULTI_LINE,
    NULL_VALUE,
    PATH,
    PATH_GLOB_FILTER,
    QUOTE,
    RECURSIVE_FILE_LOOKUP,
    RESCUED_DATA_COLUMN,
    SEP,
    WHOLE_TEXT,
)
from headrace_cloudfiles.discovery import FileDiscovery, glob_regex
from headrace_cloudfiles.formats import ReaderConfig, fixed_schema
from headrace_cloudfiles.index import FileIndex
from headrace_cloudfiles.local import LocalStore, NotARegularFileError
from headrace_cloudfiles.reader import FilesPartition, ReadPlan, read_partition
from headrace_cloudfiles.resolve import SchemaResolution
from headrace_cloudfiles.storage import Store, open_store
from headrace_cloudfiles.watcher import Watcher

__all__ = ["CloudFilesSource"]

log = logging.getLogger(__name__)

_MAX_PARTITIONS = 4


class CloudFilesSource(SchemaResolution, FileDiscovery, Source):
    """The ``cloudFiles`` source. Replayable: offsets index an append-only file index.

    Created once per query run on the driver (no I/O in the constructor beyond opening the
    file index); ``schema`` infers or loads the schema on first use.
    """

    replayable = True
    needs_state_path = True  # the file index
    supports_planning_ahead = True  # available-now discovers once; latest_offset admits a range of the index

    @classmethod
    def default_state_path(cls, options: Options) -> str | None:
        """Under Spark without ``headraceStatePath``: ``<cloudFiles.schemaLocation>/_headrace_state``
        (Auto Loader users set schemaLocation anyway; one per stream, like the schema). None
        without a local schemaLocation. Pure."""
        loc = options[CLOUD_FILES_SCHEMA_LOCATION]
        if not loc or ("://" in str(loc) and not str(loc).startswith("file://")):
            return None
        return os.path.join(str(loc).removeprefix("file://"), "_headrace_state")

    def __init__(self, options: Options, context: SourceContext) -> None:
        super().__init__(options, context)
        o = options
        self.path: str = str(o[PATH])
        self.fmt: str = o[CLOUD_FILES_FORMAT]
        self.store: Store = open_store(self.path, o)
        self.config = ReaderConfig(
            fmt=self.fmt,
            typed=bool(o[CLOUD_FILES_INFER_COLUMN_TYPES]),
            multiline=bool(o[MULTI_LINE]),
            header=bool(o[HEADER]),
            sep=str(o[SEP]),
            quote=str(o[QUOTE] or ""),
            escape=str(o[ESCAPE] or ""),
            null_value=str(o[NULL_VALUE] or ""),
            whole_text=bool(o[WHOLE_TEXT]),
        )
        self.fixed = fixed_schema(self.fmt)
        self.user_schema = context.user_schema
        self.schema_location: str | None = o[CLOUD_FILES_SCHEMA_LOCATION]
        self.hints: str | None = o[CLOUD_FILES_SCHEMA_HINTS]
        mode = o[CLOUD_FILES_SCHEMA_EVOLUTION_MODE]
        self.evolution_mode: str = mode or ("none" if self.user_schema is not None or self.fixed is not None else "addNewColumns")
        self.rescue_column: str | None = None
        if self.fixed is None and (self.evolution_mode != "none" or o.is_set(RESCUED_DATA_COLUMN)):
            self.rescue_column = str(o[RESCUED_DATA_COLUMN])
        self.max_files: int = int(o[CLOUD_FILES_MAX_FILES_PER_TRIGGER])
        self.max_bytes: int | None = o[CLOUD_FILES_MAX_BYTES_PER_TRIGGER]
        self.allow_overwrites: bool = bool(o[CLOUD_FILES_ALLOW_OVERWRITES])
        self.include_existing: bool = bool(o[CLOUD_FILES_INCLUDE_EXISTING_FILES])
        self.listing: str = o[CLOUD_FILES_USE_INCREMENTAL_LISTING]
        self.notifications: bool = bool(o[CLOUD_FILES_USE_NOTIFICATIONS])
        self.backfill: float | None = o[CLOUD_FILES_BACKFILL_INTERVAL]
        self.max_age: float | None = o[CLOUD_FILES_MAX_FILE_AGE]
        glob, after, before = o[PATH_GLOB_FILTER], o[MODIFIED_AFTER], o[MODIFIED_BEFORE]
        self.glob = glob_regex(glob) if glob else None
        self.after_ms = int(after.timestamp() * 1000) if after is not None else None
        self.before_ms = int(before.timestamp() * 1000) if before is not None else None
        self.clean: str = o[CLOUD_FILES_CLEAN_SOURCE]
        self.retention_ms = int(float(o[CLOUD_FILES_CLEAN_SOURCE_RETENTION_DURATION]) * 1000)
        self.move_to: str | None = o[CLOUD_FILES_CLEAN_SOURCE_MOVE_DESTINATION]
        self.partition_option: list[str] | None = o[CLOUD_FILES_PARTITION_COLUMNS]
        self.no_partition_inference = bool(o[RECURSIVE_FILE_LOOKUP])
        self.sample_files = int(o[CLOUD_FILES_SCHEMA_INFERENCE_SAMPLE_SIZE_NUM_FILES])
        self.sample_bytes = int(o[CLOUD_FILES_SCHEMA_INFERENCE_SAMPLE_SIZE_NUM_BYTES])
        self.prefix_bytes = max(1, int(o[CLOUD_FILES_SCHEMA_INFERENCE_BYTES_PER_FILE]))
        self.ignore_missing = bool(o[IGNORE_MISSING_FILES])
        self.ignore_corrupt = bool(o[IGNORE_CORRUPT_FILES])
        self.bad_records = BadRecords.from_options(o, what=f"cloudFiles {self.path}")
        self._check(o)
        self._plan: ReadPlan | None = None
        self._index: FileIndex | None = None
        self._temp_state: str | None = None
        self._watcher: Watcher | None = None
        self._cap: int | None = None
        self._cap_pending = False
        self._trusted = False  # the file index was checked against the checkpoint's offsets this run
        self._discovered_this_run = False
        self._last_expiry = 0.0
        self._closed = False

    # ------------------------------------------------------------------ validation
    def _check(self, o: Options) -> None:
        problems: list[OptionProblem] = []
        if self.fixed is None and self.user_schema is None and not self.schema_location:
            problems.append(OptionProblem(
                "cloudFiles.schemaLocation",
                f"is required to infer and track the schema of {self.fmt} files; give a folder "
                "(e.g. next to the checkpoint), or give the schema with .schema(...)"))  # fmt: skip
        if self.user_schema is not None and self.evolution_mode == "addNewColumns":
            problems.append(OptionProblem(
                "cloudFiles.schemaEvolutionMode",
                "addNewColumns needs an inferred schema; with .schema(...) use rescue, failOnNewColumns or none"))  # fmt: skip
        if self.notifications and not isinstance(self.store, LocalStore):
            problems.append(OptionProblem(
                "cloudFiles.useNotifications",
                f"file-event mode watches local folders only, and {self.path!r} is not local; remove it "
                "(directory listing with incremental listing is used on S3)"))  # fmt: skip
        if self.move_to:
            if isinstance(self.store, LocalStore) != ("://" not in self.move_to or self.move_to.startswith("file://")):
                problems.append(OptionProblem(
                    "cloudFiles.cleanSource.moveDestination",
                    f"{self.move_to!r} must be on the same storage as path {self.path!r}"))  # fmt: skip
            elif self.store.rel_of(self._dest_probe(self.move_to)) is not None or self._same_root(self.move_to):
                problems.append(OptionProblem(
                    "cloudFiles.cleanSource.moveDestination",
                    f"{self.move_to!r} is inside path {self.path!r}: moved files would be ingested again; "
                    "choose a folder outside it"))  # fmt: skip
        if problems:
            raise OptionsError("cloudFiles", "source", problems)

    def _dest_probe(self, dest: str) -> str:
        if isinstance(self.store, LocalStore):
            return os.path.join(os.path.abspath(dest.removeprefix("file://")), "x")
        return dest.rstrip("/") + "/x"

    def _same_root(self, dest: str) -> bool:
        if isinstance(self.store, LocalStore):
            return os.path.abspath(dest.removeprefix("file://")) == self.store.root
        return dest.rstrip("/") == self.store.root.rstrip("/")

    # ------------------------------------------------------------------ state
    @property
    def index(self) -> FileIndex:
        """The file index in the checkpoint (opened on first use, on the driver).

        Raises CheckpointError when it is damaged or belongs to another query."""
        if self._index is None:
            folder = self.context.state_path
            if folder is None:
                import tempfile

                folder = self._temp_state = tempfile.mkdtemp(prefix="headrace-cloudfiles-")
            idx = FileIndex(folder)
            try:
                idx.check_owner(self.context.query_id)
            except CheckpointError:
                idx.close()
                raise
            self._index = idx
        return self._index

    def _check_state(self, start_seq: int) -> None:
        """Before the first use of the index in a run that resumes from ``start_seq``: see
        :meth:`FileIndex.check_resume`. Then the index is claimed for this query."""
        if self._trusted:
            return
        idx = self.index
        idx.check_resume(start_seq, committed=getattr(self.context, "has_committed_batches", False))
        idx.claim(self.context.query_id)
        self._trusted = True

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.update(_index=None, _watcher=None)
        return state

    # ------------------------------------------------------------------ schema
    @property
    def schema(self) -> pa.Schema:
        """The stream's schema: data columns, partition columns, rescued data column.

        Resolved once per run, on first use: the user's ``.schema()``, or the latest version
        under ``schemaLocation``, or inferred from a sample of the files now present (stored as
        version 0). Raises when there is nothing to infer from."""
        return self.plan.schema

    @property
    def plan(self) -> ReadPlan:
        if self._plan is None:
            self._plan = self._resolve()
        return self._plan

    # ------------------------------------------------------------------ Source protocol
    def initial_offset(self) -> Offset:
        """Where a new stream starts: before the first file. Called once, only when the
        checkpoint has no batch. With ``includeExistingFiles=false`` it records the files present
        now as seen, so only later files are ingested."""
        idx = self.index
        idx.claim(self.context.query_id)
        self._trusted = True
        if not self.include_existing and idx.get("baseline") is None:
            files, last = self._listing(None)
            idx.add(files, allow_overwrites=False, ingest=False)
            if last is not None:
                idx.set("watermark", last)
            idx.set("baseline", str(len(files)))
        return {"seq": 0}

    def default_read_limit(self) -> ReadLimit:
        """``maxFilesPerTrigger`` (default 1000) and ``maxBytesPerTrigger``. Called once per run."""
        return ReadLimit(max_files=self.max_files, max_bytes=self.max_bytes)

    def prepare_for_available_now(self) -> bool:
        """Discover the files present now and never go beyond them. Called once per run with
        ``trigger(available_now=True)``; the listing waits for the first ``latest_offset`` when
        the file index is not checked yet (a resumed stream)."""
        if self._trusted:
            self._discover()
            self._cap = self.index.max_seq
        else:
            self._cap_pending = True
        return True

    def latest_offset(self, start: Offset, limit: ReadLimit) -> Offset:
        """Discover new files, then admit up to the limit's files/bytes after ``start``.

        Called once per trigger on the driver; returns ``start`` when nothing is new."""
        begin = self._seq(start)
        self._check_state(begin)
        idx = self.index
        if self._cap_pending:
            self._cap_pending = False
            self._discover()
            self._cap = idx.max_seq
        elif self._cap is None:
            self._discover()
        end = idx.admit(begin, max_files=limit.max_files, max_bytes=limit.max_bytes, cap=self._cap)
        return {"seq": end}

    @staticmethod
    def _seq(offset: Offset) -> int:
        try:
            return int(offset["seq"])
        except (KeyError, TypeError, ValueError):
            raise HeadraceError(
                f"offset {offset!r} is not a cloudFiles offset ({{'seq': n}}); the checkpoint belongs to another source"
            ) from None

    def partitions(self, start: Offset, end: Offset) -> Sequence[Partition]:
        """The files of ``(start, end]`` in up to 4 partitions of contiguous files of similar
        size. Called once per batch (again on replay); the result is picklable."""
        a, b = self._seq(start), self._seq(end)
        if b <= a:
            return []
        self._check_state(a)
        files = self.index.files(a, b)
        plan = self.plan
        k = max(1, min(_MAX_PARTITIONS, len(files)))
        total = sum(max(1, f.size) for f in files)
        target = total / k
        parts: list[Partition] = []
        cur: list[Any] = []
        acc = 0
        for i, f in enumerate(files):
            cur.append(f)
            acc += max(1, f.size)
            remaining_files = len(files) - i - 1
            remaining_parts = k - len(parts) - 1
            if remaining_parts > 0 and (acc >= target * (len(parts) + 1) or remaining_files == remaining_parts):
                parts.append(FilesPartition(plan, tuple(cur)))
                cur = []
        if cur:
            parts.append(FilesPartition(plan, tuple(cur)))
        return parts

    def read(self, partition: Partition) -> Iterator[pa.RecordBatch]:
        """Read a partition's files in order into batches of ``schema``. Called once per
        partition per batch, possibly in a worker thread or on a pickled copy; deterministic."""
        if not isinstance(partition, FilesPartition):
            raise HeadraceError(f"cloudFiles cannot read partition {partition!r}; it was made by another source")
        return read_partition(partition)

    def commit(self, end: Offset) -> None:
        """The files up to ``end`` are in committed batches: apply ``cleanSource`` to those
        committed longer than ``retentionDuration`` ago, and expire old entries (``maxFileAge``).
        Called once per batch on the driver, after the batch is committed."""
        self._check_state(self._seq(end))
        idx = self.index
        now = time.time()
        idx.mark_committed(self._seq(end), int(now * 1000))
        if self.clean != "OFF":
            self._clean(int(now * 1000) - self.retention_ms)
        if self.max_age is not None and now - self._last_expiry >= 60:
            self._last_expiry = now
            idx.expire(int((now - self.max_age) * 1000))

    def _clean(self, committed_before_ms: int) -> None:
        idx = self.index
        done: list[int] = []
        for f in idx.to_clean(committed_before_ms):
            if not idx.is_latest(f):  # overwritten and re-ingested since: the new content is not committed yet
                done.append(f.seq)
                continue
            parts = f.rel.split("/")
            if ".." in parts or self.store.rel_of(self.store.uri(f.rel)) is None:
                log.error("cloudFiles: refusing to clean %s: it is outside %s", f.rel, self.path)
                done.append(f.seq)
                continue
            try:
                if self.clean == "MOVE":
                    assert self.move_to is not None
                    self.store.move(f.rel, self.move_to)
                else:
                    self.store.delete(f.rel)
                done.append(f.seq)
            except NotARegularFileError as e:  # became a link (or lies under one) since it was read
                log.error("cloudFiles: refusing to clean %s: %s", self.store.uri(f.rel), e)
                done.append(f.seq)
            except Exception as e:  # clean-up never fails the stream; retried at the next commit
                log.warning("cloudFiles: cleanSource %s of %s failed (retried later): %s", self.clean, self.store.uri(f.rel), e)
        if done:
            idx.mark_cleaned(done)

    def metrics(self, latest: Offset) -> Mapping[str, Any]:
        """Backlog after the batch ending at ``latest``: files discovered and not yet read.
        Called once per batch; O(1)."""
        files, size = self.index.outstanding(self._seq(latest))
        return {"numFilesOutstanding": files, "numBytesOutstanding": size}

    def close(self) -> None:
        """Stop the file watcher and close the index. Called once when the query stops; idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._watcher is not None:
            self._watcher.close()
            self._watcher = None
        if self._index is not None:
            self._index.close()
            self._index = None
        self.store.close()
        if self._temp_state is not None:
            import shutil

            with contextlib.suppress(OSError):
                shutil.rmtree(self._temp_state, ignore_errors=True)
