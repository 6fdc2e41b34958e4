"""Resolving the schema and read plan of ``CloudFilesSource``: the user's ``.schema()``, the latest
version under ``schemaLocation``, or one inferred from a sample of the files present (stored as
version 0); then partition columns, hints and the rescued data column.

``SchemaResolution`` is a mixin of :class:`~headrace_cloudfiles.source.CloudFilesSource`;
``_resolve`` runs once per run, on the driver, at the first use of ``schema``/``plan``. The
resulting :class:`~headrace_cloudfiles.reader.ReadPlan` is picklable (it travels in every partition).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import pyarrow as pa

from headrace.errors import HeadraceError
from headrace.helpers.badrecords import BadRecords
from headrace_cloudfiles.formats import ReaderConfig, infer_data_schema, inference_bytes
from headrace_cloudfiles.reader import ReadPlan, partition_values
from headrace_cloudfiles.schemas import SchemaStore, apply_hints
from headrace_cloudfiles.storage import FileInfo, Store

__all__ = ["SchemaResolution"]

log = logging.getLogger(__name__)


class SchemaResolution:
    """Mixin of ``CloudFilesSource``: the schema and read plan (see the module docstring)."""

    # set by CloudFilesSource.__init__
    path: str
    fmt: str
    store: Store
    config: ReaderConfig
    fixed: pa.Schema | None
    user_schema: pa.Schema | None
    schema_location: str | None
    hints: str | None
    evolution_mode: str
    rescue_column: str | None
    partition_option: list[str] | None
    no_partition_inference: bool
    sample_files: int
    sample_bytes: int
    prefix_bytes: int
    ignore_missing: bool
    ignore_corrupt: bool
    bad_records: BadRecords | None

    if TYPE_CHECKING:  # defined by FileDiscovery

        def _wanted(self, f: FileInfo, now_ms: int) -> bool: ...

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
