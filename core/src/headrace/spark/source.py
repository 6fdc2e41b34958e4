"""A headrace ``Source`` as a PySpark ``DataSourceStreamReader``.

Where each method runs (PySpark 4.3), and what crosses a process boundary:

- ``HeadraceStreamReader(...)`` is built by ``DataSource.streamReader`` in *three* kinds of
  process: the long-lived source runner on the driver (one per query run: ``initialOffset``,
  ``latestOffset``, ``partitions``, ``commit``, ``stop``), the read planner on the driver,
  whose reader is pickled to the executors for ``read``, and nowhere else. The constructor
  therefore only validates options; the headrace ``Source`` is built lazily, in the source
  runner, on the first offset call, and is never pickled with the reader.
- ``partitions`` returns :class:`HeadraceInputPartition` objects (pickled to executors), each
  carrying one headrace ``Partition`` and, when the driver's ``Source`` can be pickled, a
  pickled copy of it (the headrace contract: ``read`` runs on a pickled copy of the source).
  A source that cannot be pickled (it holds a client connection) is instead constructed again
  on the executor from the same options and context; its constructor must then be cheap.
- ``read`` runs on an executor, once per partition per batch, and yields Arrow record batches
  cast to the query's Spark schema.
"""

from __future__ import annotations

import logging
import os
import pickle
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadMaxBytes,
    ReadMaxFiles,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.streaming.datasource import ReadLimit as SparkReadLimit
from pyspark.sql.types import StructType

from headrace.errors import HeadraceError, OptionProblem, OptionsError
from headrace.options import Options
from headrace.plugins import ConnectorSpec
from headrace.protocols import Offset, Partition, ReadLimit, Source, SourceContext
from headrace.spark._common import MAX_TASKS_OPTION, STATE_PATH_OPTION, canonical_options, get_option
from headrace.spark.type_mapping import conform_batches, spark_to_arrow_schema

__all__ = [
    "HeadraceInputPartition",
    "HeadraceStreamReader",
    "from_spark_limit",
    "group_partitions",
    "max_tasks_option",
    "parse_source_options",
    "to_spark_limit",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _SourceRecipe:
    """Everything needed to build the headrace source anywhere: picklable."""

    spec: ConnectorSpec
    options: Options
    context: SourceContext

    def build(self) -> Source:
        cls = self.spec.load_source()
        return cls(self.options, self.context)


class HeadraceInputPartition(InputPartition):
    """One Spark partition of a micro-batch, as Spark ships it to an executor: one or more
    headrace ``Partition`` objects (``partitions``), read one after the other by one task.

    ``source`` is the driver's source pickled once per batch (``None`` when it cannot be
    pickled). Must be picklable, like everything it holds.
    """

    def __init__(self, partition: Partition | Sequence[Partition], source: bytes | None, index: int) -> None:
        super().__init__(index)
        if isinstance(partition, list | tuple):
            self.partitions: tuple[Partition, ...] = tuple(partition)
        else:
            self.partitions = (cast(Partition, partition),)
        self.source = source

    @property
    def partition(self) -> Partition:
        """The first (usually the only) headrace partition."""
        return self.partitions[0]

    def __repr__(self) -> str:
        inner = ", ".join(map(repr, self.partitions))
        return f"HeadraceInputPartition({inner})"


def group_partitions(parts: Sequence[Partition], max_groups: int | None) -> list[list[Partition]]:
    """``parts`` in at most ``max_groups`` runs of contiguous partitions of about equal count
    (one each when ``max_groups`` is None, 0 or not smaller than ``len(parts)``).

    Each Spark task costs a scheduling round, two Python worker hand-offs (the read and the
    write) and an Arrow <-> row conversion set-up, and keeps about two cores busy, so a
    micro-batch is cut into no more tasks than half of Spark's default parallelism by default
    (see :func:`headrace.spark.default_max_tasks`), as Spark's own file source packs files
    into splits.
    """
    if not max_groups or max_groups >= len(parts):
        return [[p] for p in parts]
    size, extra = divmod(len(parts), max_groups)
    out: list[list[Partition]] = []
    i = 0
    for g in range(max_groups):
        n = size + (1 if g < extra else 0)
        out.append(list(parts[i : i + n]))
        i += n
    return out


def parse_source_options(spec: ConnectorSpec, raw: Mapping[str, Any]) -> tuple[Options, str | None]:
    """Validate a Spark reader's options against the connector's schema.

    Returns the options and the absolute state folder: ``headraceStatePath`` when given, else,
    for a source that keeps state (``Source.needs_state_path``), what
    ``Source.default_state_path(options)`` derives (cloudFiles: under its schemaLocation), else
    None for a source without state. Raises :class:`OptionsError` listing every problem at once,
    including a missing ``headraceStatePath`` that nothing can stand in for. Imports the source
    class; no I/O. Called on the driver when Spark creates the source (``load()``) and in each
    process that builds a reader.
    """
    if spec.source is None:
        raise HeadraceError(
            f"connector '{spec.name}' cannot be read from (it is a sink only); use it with writeStream"
        )
    problems: list[OptionProblem] = []
    state = get_option(raw, STATE_PATH_OPTION)
    options = Options({})
    try:
        options = spec.source_options.parse(
            canonical_options(raw, spec.source_options, drop=(STATE_PATH_OPTION, MAX_TASKS_OPTION)), connector=spec.name, role="source"
        )
    except OptionsError as e:
        problems = list(e.problems)
    tasks = get_option(raw, MAX_TASKS_OPTION)
    if tasks is not None and not (str(tasks).strip().isdigit()):
        problems.append(OptionProblem(
            MAX_TASKS_OPTION,
            f"must be a whole number >= 0 (got {tasks!r}): at most this many Spark tasks per micro-batch, "
            "0 for one task per partition of the source",
        ))  # fmt: skip
    if not state and not problems:
        cls = spec.load_source()
        if getattr(cls, "needs_state_path", False):
            derive = getattr(cls, "default_state_path", None)
            state = derive(options) if callable(derive) else None
            if not state:
                problems.append(OptionProblem(
                    STATE_PATH_OPTION,
                    f"is required under Spark for the {spec.name} source, which keeps state of its own across "
                    "restarts (Spark does not tell a Python source its checkpoint location): give a folder that "
                    "stays the same for this query, e.g. '<checkpointLocation>/sources/0/headrace'",
                ))  # fmt: skip
    if problems:
        raise OptionsError(spec.name, "source", problems)
    return options, (os.path.abspath(str(state)) if state else None)


def max_tasks_option(raw: Mapping[str, Any], default: int | None) -> int | None:
    """``headraceMaxTasks`` (validated by :func:`parse_source_options`), else ``default``."""
    tasks = get_option(raw, MAX_TASKS_OPTION)
    return int(str(tasks).strip()) if tasks is not None else default


def source_context(state_path: str | None, user_schema: pa.Schema | None) -> SourceContext:
    """The context a source gets under Spark: its state folder (created here) and a query id
    derived from it, stable across restarts; without a state folder (a source without state),
    no query id (the source is told nothing stable, as Spark's own sources)."""
    if state_path is None:
        return SourceContext(run_id=str(uuid.uuid4()), source_index=0, user_schema=user_schema)
    os.makedirs(state_path, exist_ok=True)
    return SourceContext(
        query_id=str(uuid.uuid5(uuid.NAMESPACE_URL, "headrace-spark-source:" + state_path)),
        run_id=str(uuid.uuid4()),
        source_index=0,
        state_path=state_path,
        user_schema=user_schema,
    )


def to_spark_limit(limit: ReadLimit) -> SparkReadLimit:
    """The one Spark ``ReadLimit`` that stands for a headrace ``ReadLimit``.

    Spark's Python API carries a single limit; the reader keeps the full headrace limit and
    uses it whenever Spark hands this one back (see :meth:`HeadraceStreamReader.latestOffset`).
    """
    if limit.max_files is not None:
        return ReadMaxFiles(limit.max_files)
    if limit.max_bytes is not None:
        return ReadMaxBytes(limit.max_bytes)
    if limit.max_rows is not None:
        return ReadMaxRows(limit.max_rows)
    if limit.min_rows is not None:
        return ReadMinRows(limit.min_rows)
    return ReadAllAvailable()


def from_spark_limit(limit: SparkReadLimit | None) -> ReadLimit:
    """A Spark ``ReadLimit`` as a headrace ``ReadLimit``."""
    if limit is None or isinstance(limit, ReadAllAvailable):
        return ReadLimit.all_available()
    if isinstance(limit, ReadMaxFiles):
        return ReadLimit(max_files=limit.max_files)
    if isinstance(limit, ReadMaxBytes):
        return ReadLimit(max_bytes=limit.max_bytes)
    if isinstance(limit, ReadMaxRows):
        return ReadLimit(max_rows=limit.max_rows)
    if isinstance(limit, ReadMinRows):
        return ReadLimit(min_rows=limit.min_rows)
    raise HeadraceError(f"unknown Spark read limit {limit!r}")


class HeadraceStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Drives a headrace ``Source`` for Spark. Created by ``HeadraceDataSource.streamReader``.

    Only the recipe (spec, validated options, context) and the Spark schema are pickled; the
    live source exists in the driver's source runner process only.
    """

    def __init__(self, spec: ConnectorSpec, raw_options: Mapping[str, Any], schema: StructType,
                 user_schema: pa.Schema | None, max_tasks: int | None = None) -> None:  # fmt: skip
        """Validate the options (raising :class:`OptionsError`) without building the source.
        Called by Spark once per query start in each driver-side process that needs a reader.
        ``max_tasks``: at most this many Spark partitions per micro-batch (see
        :func:`group_partitions`; None: one per headrace partition)."""
        options, state_path = parse_source_options(spec, raw_options)
        self._max_tasks = max_tasks
        self._recipe = _SourceRecipe(spec, options, source_context(state_path, user_schema))
        self._spark_schema = schema
        self._target = spark_to_arrow_schema(schema)
        self._source: Source | None = None
        self._initial: Offset | None = None
        self._default_hr: ReadLimit | None = None
        self._default_spark: SparkReadLimit | None = None
        self._available_now_native: bool | None = None
        self._available_now_target: Offset | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_source"] = None
        return state

    @property
    def source(self) -> Source:
        """The live headrace source, built on first use (driver's source runner process)."""
        if self._source is None:
            self._source = self._recipe.build()
        return self._source

    def initialOffset(self) -> dict[str, Any]:
        """Where a new query starts: ``Source.initial_offset()``. Spark calls it once or twice
        per query start on the driver; the first answer is kept so both agree."""
        if self._initial is None:
            self._initial = dict(self.source.initial_offset())
        return dict(self._initial)

    def getDefaultReadLimit(self) -> SparkReadLimit:
        """The connector's rate options as a Spark read limit (``Source.default_read_limit()``).
        Called once per query run on the driver."""
        if self._default_hr is None:
            self._default_hr = self.source.default_read_limit()
            self._default_spark = to_spark_limit(self._default_hr)
        assert self._default_spark is not None
        return self._default_spark

    def prepareForTriggerAvailableNow(self) -> None:
        """``trigger(availableNow=True)``: calls ``Source.prepare_for_available_now()`` once at
        query start, on the driver. A source that does not support it gets Spark's fallback:
        one batch of everything available now, then no more."""
        self._available_now_native = bool(self.source.prepare_for_available_now())

    def _limit(self, limit: SparkReadLimit | None) -> ReadLimit:
        if self._available_now_native is False:
            return ReadLimit.all_available()
        if self._default_spark is not None and limit == self._default_spark and self._default_hr is not None:
            return self._default_hr  # the full limit (several bounds, maxTriggerDelay) behind Spark's one
        return from_spark_limit(limit)

    def latestOffset(self, start: dict[str, Any], limit: SparkReadLimit) -> dict[str, Any]:
        """The end of the next micro-batch: ``Source.latest_offset(start, limit)``.

        Called once per trigger on the driver; returning ``start`` means no new data. ``limit``
        is Spark's; when it is the default this reader reported, the source's full headrace
        limit applies.
        """
        if self._available_now_native is False and self._available_now_target is not None:
            return dict(self._available_now_target)
        end = dict(self.source.latest_offset(dict(start), self._limit(limit)))
        if self._available_now_native is False:
            self._available_now_target = end
        return end

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        """Split ``[start, end)`` with ``Source.partitions``. Called once per micro-batch (again
        on replay) on the driver. Every partition and the source copy it carries are pickled."""
        if start == end:
            return []
        parts = self.source.partitions(dict(start), dict(end))
        if not parts:
            return []
        try:
            blob: bytes | None = pickle.dumps(self.source, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as e:  # a live client: executors build their own source
            log.debug("source '%s' is not picklable (%s); executors construct it", self._recipe.spec.name, e)
            blob = None
        return [HeadraceInputPartition(g, blob, i) for i, g in enumerate(group_partitions(parts, self._max_tasks))]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """Read one partition on an executor: ``Source.read`` on the pickled copy carried by the
        partition (or a source built here), each batch cast to the Spark schema. Called once
        per partition per micro-batch; the copy is closed afterwards."""
        assert isinstance(partition, HeadraceInputPartition)
        source: Source = pickle.loads(partition.source) if partition.source is not None else self._recipe.build()
        try:
            for part in partition.partitions:
                yield from conform_batches(source.read(part), self._target, connector=self._recipe.spec.name)
        finally:
            source.close()

    def commit(self, end: dict[str, Any]) -> None:
        """Spark committed every batch up to ``end``: ``Source.commit(end)`` (upstream acks,
        cleanup). Called once per micro-batch on the driver, after the sink committed."""
        self.source.commit(dict(end))

    def stop(self) -> None:
        """The query stopped: ``Source.close()``. Called once per run on the driver; safe to
        call when the source was never built."""
        if self._source is not None:
            source, self._source = self._source, None
            source.close()
