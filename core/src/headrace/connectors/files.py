"""``files``: exactly-once Parquet or Arrow IPC files, like Spark's file sink.

``write`` stages a batch's rows under ``<path>/_staging/``; ``commit`` moves them to their
final names ``part-<batch>-<writer>-<n>.<ext>`` (deterministic, so a replay overwrites the same
names) and then writes ``<path>/_commits/<batch>``. A batch whose marker exists is skipped, so a
replayed batch never duplicates rows. Readers (``pyarrow.dataset``, Spark, DuckDB) ignore the
``_``-prefixed folders.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from headrace.checkpoint import atomic_write
from headrace.engine.crash import crash_point
from headrace.options import Options
from headrace.protocols import CommitMessage, Sink, SinkContext

__all__ = ["FilesSink", "read_files"]


@dataclass(frozen=True)
class _Staged(CommitMessage):
    folder: str
    num_rows: int


def read_files(path: str, fmt: str = "parquet") -> pa.Table:
    """Everything committed under ``path`` (a helper for tests and examples)."""
    import pyarrow.dataset as ds

    if not os.path.isdir(path):
        return pa.table({})
    return ds.dataset(path, format="ipc" if fmt == "arrow" else fmt, partitioning="hive").to_table()


class FilesSink(Sink):
    idempotent_commit = True

    def __init__(self, options: Options, context: SinkContext) -> None:
        super().__init__(options, context)
        self.path = os.path.abspath(str(options["path"]).removeprefix("file://"))
        self.fmt: str = options["format"]
        self.partition_by: list[str] = options["partitionBy"] or []
        self.ext = "parquet" if self.fmt == "parquet" else "arrow"
        self._skipped = 0

    def write(self, batch_id: int, data: Iterator[pa.RecordBatch]) -> CommitMessage:
        folder = os.path.join(self.path, "_staging", f"{batch_id}-{uuid.uuid4().hex}")
        os.makedirs(folder, exist_ok=True)
        rows = 0

        def counted() -> Iterator[pa.RecordBatch]:
            nonlocal rows
            for b in data:
                rows += b.num_rows
                yield b

        it = counted()
        first = next(it, None)
        if first is not None and not self.partition_by:
            self._write_file(os.path.join(folder, "f-0." + self.ext), first, it)
        elif first is not None:
            import pyarrow.dataset as ds

            def chain() -> Iterator[pa.RecordBatch]:
                yield first
                yield from it

            reader = pa.RecordBatchReader.from_batches(first.schema, chain())
            ds.write_dataset(
                reader,
                folder,
                format="ipc" if self.fmt == "arrow" else "parquet",
                partitioning=self.partition_by or None,
                partitioning_flavor="hive" if self.partition_by else None,
                basename_template="f-{i}." + self.ext,
                max_rows_per_file=0,
                max_rows_per_group=1 << 20,
                min_rows_per_group=0,
                existing_data_behavior="overwrite_or_ignore",
            )
        return _Staged(folder, rows)

    def _write_file(self, path: str, first: pa.RecordBatch, rest: Iterator[pa.RecordBatch]) -> None:
        """One staged file of the batches, written in this thread: a Parquet row group per
        non-empty batch (as the dataset writer writes them with ``min_rows_per_group=0``) or an
        Arrow IPC file; no file when every batch is empty (as the dataset writer). Unpartitioned
        writes skip ``pyarrow.dataset``, whose import (it imports pandas) costs a fresh Spark
        Python worker about 0.3 CPU seconds, and its thread hand-offs."""
        import pyarrow.parquet as pq

        writer: Any = None
        sink: Any = None
        try:
            for b in itertools.chain((first,), rest):
                if not b.num_rows:
                    continue
                if writer is None:
                    if self.fmt == "parquet":
                        writer = pq.ParquetWriter(path, b.schema)
                    else:
                        sink = pa.OSFile(path, "wb")
                        writer = pa.ipc.new_file(sink, b.schema)
                writer.write_batch(b)
        finally:
            if writer is not None:
                writer.close()
            if sink is not None:
                sink.close()

    def commit(self, batch_id: int, messages: Sequence[CommitMessage | None]) -> None:
        marker_dir = os.path.join(self.path, "_commits")
        marker = os.path.join(marker_dir, str(batch_id))
        staged = [m for m in messages if isinstance(m, _Staged)]
        self._skipped = 0
        if os.path.exists(marker):  # already committed before a crash: drop the replay's copy
            self._skipped = sum(m.num_rows for m in staged)
            self.abort(batch_id, staged)
            return
        for k, m in enumerate(staged):
            for root, _dirs, files in os.walk(m.folder):
                rel = os.path.relpath(root, m.folder)
                for name in sorted(files):
                    n = name.split("-", 1)[1].split(".", 1)[0]
                    final_dir = os.path.normpath(os.path.join(self.path, rel))
                    os.makedirs(final_dir, exist_ok=True)
                    os.replace(os.path.join(root, name),
                               os.path.join(final_dir, f"part-{batch_id:010d}-{k:05d}-{n}.{self.ext}"))  # fmt: skip
        # the files are in place but the batch is not marked: a replay must not duplicate them
        crash_point("files_between_data_and_marker", batch_id)
        os.makedirs(marker_dir, exist_ok=True)
        atomic_write(marker, str(sum(m.num_rows for m in staged)).encode())
        for m in staged:
            shutil.rmtree(m.folder, ignore_errors=True)

    def metrics(self) -> dict[str, Any]:
        """``numRowsSkipped``: rows of the last batch dropped because its id was already
        committed (a replay); the engine reports them as skipped, not as output. Called once per
        batch, after ``commit``."""
        return {"numRowsSkipped": self._skipped}

    def abort(self, batch_id: int, messages: Sequence[CommitMessage | None]) -> None:
        for m in messages:
            if isinstance(m, _Staged):
                with contextlib.suppress(OSError):
                    shutil.rmtree(m.folder, ignore_errors=True)
