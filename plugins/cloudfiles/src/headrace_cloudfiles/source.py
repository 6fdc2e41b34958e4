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
import fnmatch
import logging
import os
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa

from headrace.badrecords import BadRecords
from headrace.errors import CheckpointError, HeadraceError, OptionProblem, OptionsError
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
from headrace_cloudfiles.formats import ReaderConfig, fixed_schema, infer_data_schema, inference_bytes
from headrace_cloudfiles.index import FileIndex
from headrace_cloudfiles.local import LocalStore, NotARegularFileError
from headrace_cloudfiles.reader import FilesPartition, ReadPlan, partition_values, read_partition
from headrace_cloudfiles.schemas import SchemaStore, apply_hints
from headrace_cloudfiles.storage import FileInfo, Store, open_store
from headrace_cloudfiles.watcher import Watcher

__all__ = ["CloudFilesSource"]

log = logging.getLogger(__name__)

_FULL_LISTING_EVERY = 8  # auto mode: a full listing after 7 consecutive incremental ones (as Auto Loader)
_MAX_PARTITIONS = 4


def glob_regex(pattern: str) -> re.Pattern[str]:
    """A compiled regex for a Hadoop-style glob on file names (``*``, ``?``, ``[ab]``, ``{x,y}``)."""
    out, i, depth = [], 0, 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "{":
            out.append("(?:")
            depth += 1
        elif ch == "}" and depth:
            out.append(")")
            depth -= 1
        elif ch == "," and depth:
            out.append("|")
        elif ch == "[":
            j = pattern.find("]", i)
            if j < 0:
                out.append(re.escape(ch))
            else:
                body = pattern[i + 1 : j].replace("\\", "\\\\")
                out.append("[" + ("^" + body[1:] if body.startswith("^") or body.startswith("!") else body) + "]")
                i = j
        else:
            out.append(fnmatch.translate(ch)[4:-3] if ch in "*?" else re.escape(ch))
        i += 1
    return re.compile("".join(out) + r"\Z", re.S)


class CloudFilesSource(Source):
    """The ``cloudFiles`` source. Replayable: offsets index an append-only file index.

    Created once per query run on the driver (no I/O in the constructor beyond opening the
    file index); ``schema`` infers or loads the schema on first use.
    """

    replayable = True
    needs_state_path = True  # the file index

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

    def _resolve(self) -> ReadPlan:
        part_names: tuple[str, ...]
        if self.fixed is not None:
            data = self.fixed
            part_names = self._partition_names(self._sample() if self.partition_option is None else [])
        elif self.user_schema is not None:
            part_names = tuple(self.partition_option or ())
            data = pa.schema([f for f in self.user_schema if f.name not in part_names and f.name != self.rescue_column])
        else:
            assert self.schema_location is not None
            store = SchemaStore(self.schema_location)
            stored = store.latest()
            if stored is None:
                sample = self._sample()
                part_names = self._partition_names(sample)
                inferred = infer_data_schema(
                    self.store, [(f.rel, f.size, f.mtime_ms) for f in sample], self.config,
                    ignore_corrupt=self.ignore_corrupt, prefix_bytes=self.prefix_bytes,
                )  # fmt: skip
                inferred = pa.schema([f for f in inferred if f.name not in part_names and f.name != self.rescue_column])
                if not len(inferred) and not self.hints:
                    raise HeadraceError(
                        f"cannot infer the schema of the {self.fmt} files under {self.path}: "
                        + ("there are no files yet" if not sample else "the sampled files have no columns")
                        + "; fix: add files before starting, give the columns with cloudFiles.schemaHints "
                        "('a BIGINT, b STRING'), or give the schema with .schema(...)"
                    )
                stored = store.write(inferred, part_names, f"inferred from {len(sample)} file(s)")
            part_names = stored.partition_columns
            data = pa.schema([f for f in apply_hints(stored.data, self.hints) if f.name not in part_names])
        hinted = apply_hints(pa.schema([pa.field(n, pa.string()) for n in part_names]), self.hints)
        partitions = pa.schema([hinted.field(n) for n in part_names])
        fields = [*data, *partitions]
        if self.rescue_column is not None:
            fields.append(pa.field(self.rescue_column, pa.string()))
        return ReadPlan(
            store=self.store,
            config=self.config,
            schema=pa.schema(fields),
            data=data,
            partitions=partitions,
            rescue_column=self.rescue_column,
            evolution_mode=self.evolution_mode,
            schema_location=self.schema_location,
            ignore_missing=self.ignore_missing,
            ignore_corrupt=self.ignore_corrupt,
            fixed=self.fixed is not None,
            bad_records=self.bad_records,
        )

    def _sample(self) -> list[FileInfo]:
        out: list[FileInfo] = []
        total = 0
        now = int(time.time() * 1000)
        for f in self.store.list():
            if not self._wanted(f, now):
                continue
            out.append(f)
            total += inference_bytes(self.config, f.size, self.prefix_bytes)
            if len(out) >= self.sample_files or total >= self.sample_bytes:
                break
        return out

    def _partition_names(self, sample: Sequence[FileInfo]) -> tuple[str, ...]:
        if self.partition_option is not None:
            return tuple(self.partition_option)
        if self.no_partition_inference or not sample:
            return ()
        keys: list[str] | None = None
        for f in sample:
            names = list(partition_values(f.rel))
            keys = names if keys is None else [k for k in keys if k in names]
        return tuple(keys or ())

    # ------------------------------------------------------------------ discovery
    def _wanted(self, f: FileInfo, now_ms: int) -> bool:
        if self.glob is not None and not self.glob.match(f.rel.rsplit("/", 1)[-1]):
            return False
        if self.after_ms is not None and f.mtime_ms <= self.after_ms:
            return False
        if self.before_ms is not None and f.mtime_ms >= self.before_ms:
            return False
        return not (self.max_age is not None and f.mtime_ms < now_ms - self.max_age * 1000)

    def _listing(self, start_after: str | None) -> tuple[list[FileInfo], str | None]:
        """Files listed (after ``start_after``) that pass the filters, and the last path listed."""
        now = int(time.time() * 1000)
        out, last = [], start_after
        for f in self.store.list(start_after):
            if last is None or f.rel > last:
                last = f.rel
            if self._wanted(f, now):
                out.append(f)
        return out, last

    def _full_due(self, idx: FileIndex) -> bool:
        if self.backfill is None:
            return False
        last = int(idx.get("last_full_ms", "0") or 0)
        return time.time() * 1000 - last >= self.backfill * 1000

    def _discover(self) -> int:
        """Find new files and add them to the index; returns how many. Once per trigger."""
        idx = self.index
        now_ms = str(int(time.time() * 1000))
        first = not self._discovered_this_run
        self._discovered_this_run = True
        if self.notifications:
            assert isinstance(self.store, LocalStore)
            if self._watcher is None:
                os.makedirs(self.store.root, exist_ok=True)
                self._watcher = Watcher(self.store)
            if first or self._full_due(idx):
                files, _ = self._listing(None)
                idx.set("last_full_ms", now_ms)
                self._watcher.drain()  # the listing saw everything these events name
                return idx.add(files, allow_overwrites=self.allow_overwrites)
            now = int(time.time() * 1000)
            found = []
            for rel in self._watcher.drain():
                parts = rel.split("/")
                if any(p.startswith(("_", ".")) for p in parts):
                    continue
                info = self.store.stat(rel)
                if info is not None and self._wanted(info, now):
                    found.append(info)
            found.sort(key=lambda f: f.rel)
            return idx.add(found, allow_overwrites=self.allow_overwrites)
        watermark = idx.get("watermark")
        lexical = idx.get("lexical", "unknown")  # auto mode: yes once a full listing showed new names sort last
        streak = int(idx.get("incremental_streak", "0") or 0)
        if self.listing == "false" or watermark is None:
            incremental = False
        elif self.listing == "true":
            incremental = not self._full_due(idx)
        else:  # auto
            incremental = lexical == "yes" and streak < _FULL_LISTING_EVERY - 1 and not self._full_due(idx)
        files, last = self._listing(watermark if incremental else None)
        known = idx.known([f.rel for f in files]) if not incremental and watermark is not None else {}
        if not incremental and watermark is not None and lexical != "no":
            new = [f.rel for f in files if f.rel not in known]
            if any(rel <= watermark for rel in new):
                idx.set("lexical", "no")  # a new file sorted before the last seen: names are not lexical
                log.info("cloudFiles: new files under %s do not sort after the ones seen; using full listings", self.path)
            elif new:
                idx.set("lexical", "yes")
        if last is not None and (watermark is None or last > watermark):
            idx.set("watermark", last)
        idx.set("incremental_streak", str(streak + 1 if incremental else 0))
        if not incremental:
            idx.set("last_full_ms", now_ms)
        return idx.add(files, allow_overwrites=self.allow_overwrites, known=known if known else None)

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
