"""The file index: every file discovered, in discovery order, in a SQLite database.

It lives in the source's checkpoint folder (``sources/<i>/files.db``). Each discovered file gets
the next sequence number; an offset is just that number (``{"seq": n}`` covers files
``1..n``), so offsets stay small whatever the number of files, and a batch ``(a, b]`` is a range
scan of the primary key. ``seen`` remembers every path (with size and modification time) so a
file is ingested once, or again after an overwrite when ``allowOverwrites``. Discovery,
admission, backlog metrics and clean-up cost work proportional to new files or to the batch,
never to the files ingested before (``cum_bytes`` keeps a running total for the byte metrics).

The index records the id of the query that owns it (``meta.query_id``, written when the query
claims it). The source refuses an index that is missing, empty or unclaimed while the checkpoint
resumes from ingested files, or that another query claimed; a damaged database file is a
:class:`~headrace.errors.CheckpointError` naming it, never a raw ``sqlite3`` error.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from headrace.errors import CheckpointError
from headrace_cloudfiles.storage import FileInfo

__all__ = ["FileIndex", "IndexedFile"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS files (
    seq INTEGER PRIMARY KEY,
    rel TEXT NOT NULL,
    size INTEGER NOT NULL,
    mtime_ms INTEGER NOT NULL,
    cum_bytes INTEGER NOT NULL,
    committed_ms INTEGER,
    cleaned INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS seen (
    rel TEXT PRIMARY KEY,
    size INTEGER NOT NULL,
    mtime_ms INTEGER NOT NULL,
    seq INTEGER
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS files_to_clean ON files (committed_ms) WHERE cleaned = 0 AND committed_ms IS NOT NULL;
"""

_CHUNK = 500  # SQLite host parameters per IN (...) query


@dataclass(frozen=True)
class IndexedFile:
    """A file of a batch: its sequence number, path relative to the root, size and mtime."""

    seq: int
    rel: str
    size: int
    mtime_ms: int


class FileIndex:
    """The SQLite file index of one source. Used on the driver only (not picklable).

    Every method commits before returning, so what ``latest_offset`` admitted is durable before
    the engine writes ``offsets/<n>``.
    """

    def __init__(self, folder: str) -> None:
        os.makedirs(folder, exist_ok=True)
        self.path = os.path.join(folder, "files.db")
        self._lock = threading.RLock()
        try:
            size = os.path.getsize(self.path)
        except FileNotFoundError:
            size = -1
        self.state = "missing" if size < 0 else "empty" if size == 0 else "present"
        """``missing`` (no file), ``empty`` (a 0-byte file) or ``present`` before this run opened it."""
        self._db: sqlite3.Connection | None = None
        try:
            with self._guard("open"):
                self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
                self._db.execute("PRAGMA journal_mode=WAL")
                self._db.execute("PRAGMA synchronous=FULL")
                self._db.executescript(_SCHEMA)
            if self.state == "present":  # ~0.3 s per million files, once per run: damage found now, not mid-stream
                problems = [str(r[0]) for r in self._all("PRAGMA quick_check(5)")]
                if problems != ["ok"]:
                    raise CheckpointError(
                        f"the cloudFiles file index {self.path} is damaged ({'; '.join(problems)}); it belongs to the "
                        "checkpoint and records which files were ingested: restore it from a backup together with "
                        "the checkpoint, or start the query with a new checkpointLocation"
                    )
            self._max_seq = int(self._one("SELECT COALESCE(MAX(seq), 0) FROM files")[0])
            self._max_cum = self._cum(self._max_seq)
            self.owner: str | None = self.get("query_id")
            """The query id the index belongs to (None: never claimed)."""
            nothing = self.owner is None and self._max_seq == 0
            if self.state == "present" and nothing and self._one("SELECT COUNT(*) FROM meta")[0] == 0:
                self.state = "empty"  # a valid database with nothing in it: as good as lost
        except BaseException:
            self.close()
            raise

    @contextlib.contextmanager
    def _guard(self, what: str) -> Iterator[None]:
        """Turn any SQLite error into a CheckpointError naming the file."""
        try:
            yield
        except sqlite3.DatabaseError as e:
            damaged = not isinstance(e, sqlite3.OperationalError) or "malformed" in str(e) or "not a database" in str(e)
            raise CheckpointError(
                f"the cloudFiles file index {self.path} "
                + (f"is damaged ({e}); " if damaged else f"could not be {'opened' if what == 'open' else 'used'} ({e}); ")
                + "it belongs to the checkpoint and records which files were ingested: restore it from a backup "
                "together with the checkpoint, or start the query with a new checkpointLocation"
                + ("" if damaged else " (or fix the cause: disk full, permissions)")
            ) from e

    def _one(self, sql: str, params: Sequence[Any] = ()) -> Any:
        assert self._db is not None, "the file index is closed"
        with self._guard("read"):
            return self._db.execute(sql, params).fetchone()

    def _all(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        assert self._db is not None, "the file index is closed"
        with self._guard("read"):
            return self._db.execute(sql, params).fetchall()

    def _run(self, sql: str, params: Sequence[Any] = ()) -> int:
        assert self._db is not None, "the file index is closed"
        with self._guard("write"):
            return int(self._db.execute(sql, params).rowcount)

    def _many(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        assert self._db is not None, "the file index is closed"
        with self._guard("write"):
            self._db.executemany(sql, rows)

    def _rollback(self) -> None:
        with contextlib.suppress(sqlite3.Error):
            if self._db is not None:
                self._db.execute("ROLLBACK")

    # ------------------------------------------------------------------ ownership
    @property
    def fresh(self) -> bool:
        """True when the index holds nothing from earlier runs (missing, empty or never claimed)."""
        return self.state != "present" or (self.owner is None and self._max_seq == 0)

    def check_owner(self, query_id: str) -> None:
        """Raise CheckpointError when another query claimed the index (copied from another
        checkpoint). Called once when the source opens it."""
        if self.owner and query_id and self.owner != query_id:
            raise CheckpointError(
                f"the cloudFiles file index {self.path} belongs to query {self.owner}, not to this query ({query_id}): "
                "it was copied from another checkpoint; restore this checkpoint's own sources/ folder, or start "
                "the query with a new checkpointLocation"
            )

    def check_resume(self, start_seq: int, *, committed: bool = False) -> None:
        """Raise CheckpointError unless the index holds every file up to ``start_seq``, where the
        checkpoint resumes (``committed``: the engine says the checkpoint has committed batches,
        so even at file #0 the index must exist: it holds the files seen, e.g. those
        ``includeExistingFiles=false`` excluded). Called before the first listing of a resumed
        run: a lost, emptied or truncated index would otherwise be refilled by it, numbering the
        files anew (old files ingested again, new ones skipped)."""
        if (start_seq > 0 and self.fresh) or (committed and self.state != "present"):
            what = {"missing": "is missing", "empty": "is empty"}.get(self.state, "holds no files")
            upto = f"up to file #{start_seq}" if start_seq > 0 else "(committed)"
            raise CheckpointError(
                f"the cloudFiles file index {self.path} {what}, but the checkpoint has batches {upto}: "
                "the index records which files were ingested, and a new one would ingest old files again and skip "
                "new ones. Restore it from a backup together with the checkpoint, or start the query with a new "
                "checkpointLocation (with cloudFiles.includeExistingFiles=false to skip the files already there)"
            )
        if start_seq > self._max_seq:
            raise CheckpointError(
                f"the checkpoint's offsets reach file #{start_seq} but the cloudFiles file index {self.path} knows only "
                f"{self._max_seq} files: the index was truncated or replaced; restore it, or start with a new "
                "checkpointLocation"
            )

    def claim(self, query_id: str) -> None:
        """Record ``query_id`` as the owner. Called once the source knows the index belongs to
        this query (a new stream, or an existing index that passed the checks)."""
        if self.owner != query_id:
            self.set("query_id", query_id)
            self.owner = query_id

    # ------------------------------------------------------------------ meta
    def get(self, key: str, default: str | None = None) -> str | None:
        with self._lock:
            row = self._one("SELECT value FROM meta WHERE key = ?", (key,))
        return row[0] if row else default

    def set(self, key: str, value: str) -> None:
        with self._lock:
            self._run("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value))

    # ------------------------------------------------------------------ discovery
    @property
    def max_seq(self) -> int:
        """The sequence number of the last file discovered (0 when none)."""
        return self._max_seq

    def _cum(self, seq: int) -> int:
        if seq <= 0:
            return 0
        row = self._one("SELECT cum_bytes FROM files WHERE seq = ?", (seq,))
        return int(row[0]) if row else 0

    def known(self, rels: Sequence[str]) -> dict[str, tuple[int, int]]:
        """``rel -> (size, mtime_ms)`` for the paths among ``rels`` already seen."""
        out: dict[str, tuple[int, int]] = {}
        with self._lock:
            for i in range(0, len(rels), _CHUNK):
                chunk = rels[i : i + _CHUNK]
                q = f"SELECT rel, size, mtime_ms FROM seen WHERE rel IN ({','.join('?' * len(chunk))})"
                for rel, size, mtime in self._all(q, chunk):
                    out[rel] = (int(size), int(mtime))
        return out

    def add(
        self,
        files: Iterable[FileInfo],
        *,
        allow_overwrites: bool,
        ingest: bool = True,
        known: dict[str, tuple[int, int]] | None = None,
    ) -> int:
        """Record files found by a listing or an event; returns how many are new to ingest.

        A path seen before is new again only when ``allow_overwrites`` and its size or
        modification time changed. With ``ingest=False`` (``includeExistingFiles=false``) the
        files are only remembered as seen, never ingested.
        """
        batch = list({f.rel: f for f in files}.values())
        if not batch:
            return 0
        known = self.known([f.rel for f in batch])
        new = []
        for f in batch:
            old = known.get(f.rel)
            if old is None or (allow_overwrites and old != (f.size, f.mtime_ms)):
                new.append(f)
        if not new:
            return 0
        with self._lock:
            self._run("BEGIN IMMEDIATE")
            try:
                seq, cum = self._max_seq, self._max_cum
                rows, seen = [], []
                for f in new:
                    if ingest:
                        seq += 1
                        cum += f.size
                        rows.append((seq, f.rel, f.size, f.mtime_ms, cum))
                    seen.append((f.rel, f.size, f.mtime_ms, seq if ingest else None))
                self._many("INSERT INTO files (seq, rel, size, mtime_ms, cum_bytes) VALUES (?,?,?,?,?)", rows)
                self._many("INSERT OR REPLACE INTO seen (rel, size, mtime_ms, seq) VALUES (?,?,?,?)", seen)
                self._run("COMMIT")
            except BaseException:
                self._rollback()
                raise
            self._max_seq, self._max_cum = seq, cum
        return len(rows)

    # ------------------------------------------------------------------ batches
    def admit(self, start: int, *, max_files: int | None, max_bytes: int | None, cap: int | None = None) -> int:
        """The end of the next batch from ``start``: at most ``max_files`` files and about
        ``max_bytes`` bytes (soft: at least one file), never beyond ``cap``."""
        last = self._max_seq if cap is None else min(cap, self._max_seq)
        if last <= start:
            return start
        end = last if max_files is None else min(last, start + max_files)
        if max_bytes is not None:
            with self._lock:
                base = self._cum(start)
                row = self._one(
                    "SELECT MAX(seq) FROM files WHERE seq > ? AND seq <= ? AND cum_bytes <= ?",
                    (start, end, base + max_bytes),
                )
            within = int(row[0]) if row and row[0] is not None else start
            end = max(start + 1, within)
        return end

    def files(self, start: int, end: int) -> list[IndexedFile]:
        """The files of the batch ``(start, end]`` in sequence order."""
        if end > self._max_seq:
            raise CheckpointError(
                f"the checkpoint's offsets reach file #{end} but the cloudFiles file index {self.path} knows only "
                f"{self._max_seq} files: the index was lost or replaced; start with a new checkpointLocation"
            )
        with self._lock:
            rows = self._all(
                "SELECT seq, rel, size, mtime_ms FROM files WHERE seq > ? AND seq <= ? ORDER BY seq", (start, end)
            )
        return [IndexedFile(int(s), r, int(z), int(m)) for s, r, z, m in rows]

    def outstanding(self, after: int) -> tuple[int, int]:
        """Files and bytes discovered but not in any batch up to ``after``."""
        with self._lock:
            return max(0, self._max_seq - after), max(0, self._max_cum - self._cum(after))

    # ------------------------------------------------------------------ after commit
    def mark_committed(self, end: int, now_ms: int) -> None:
        """Record that files up to ``end`` are in committed batches (once per batch)."""
        with self._lock:
            done = int(self.get("committed_seq", "0") or 0)
            if end <= done:
                return
            self._run("BEGIN IMMEDIATE")
            try:
                self._run("UPDATE files SET committed_ms = ? WHERE seq > ? AND seq <= ?", (now_ms, done, end))
                self._run("INSERT OR REPLACE INTO meta (key, value) VALUES ('committed_seq', ?)", (str(end),))
                self._run("COMMIT")
            except BaseException:
                self._rollback()
                raise

    def to_clean(self, committed_before_ms: int, limit: int = 10_000) -> list[IndexedFile]:
        """Committed files not cleaned yet whose batch committed before the given time."""
        with self._lock:
            rows = self._all(
                "SELECT seq, rel, size, mtime_ms FROM files WHERE cleaned = 0 AND committed_ms IS NOT NULL "
                "AND committed_ms <= ? ORDER BY committed_ms LIMIT ?",
                (committed_before_ms, limit),
            )
        return [IndexedFile(int(s), r, int(z), int(m)) for s, r, z, m in rows]

    def is_latest(self, f: IndexedFile) -> bool:
        """True when ``f`` is the last ingestion of its path (not overwritten and re-ingested since)."""
        with self._lock:
            row = self._one("SELECT seq FROM seen WHERE rel = ?", (f.rel,))
        return row is None or row[0] is None or int(row[0]) == f.seq

    def mark_cleaned(self, seqs: Sequence[int]) -> None:
        with self._lock:
            self._many("UPDATE files SET cleaned = 1 WHERE seq = ?", [(s,) for s in seqs])

    def expire(self, older_than_ms: int) -> int:
        """Forget seen paths whose modification time is before ``older_than_ms`` and that are
        committed (``maxFileAge``); returns how many."""
        with self._lock:
            self._run("CREATE INDEX IF NOT EXISTS seen_mtime ON seen (mtime_ms)")
            done = int(self.get("committed_seq", "0") or 0)
            return self._run("DELETE FROM seen WHERE mtime_ms < ? AND (seq IS NULL OR seq <= ?)", (older_than_ms, done))

    def close(self) -> None:
        """Close the database. Idempotent."""
        with self._lock:
            if self._db is not None:
                with contextlib.suppress(sqlite3.Error):
                    self._db.close()
                self._db = None
