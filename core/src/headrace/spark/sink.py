"""A headrace ``Sink`` as a PySpark ``DataSourceStreamArrowWriter``.

Where each method runs (PySpark 4.3):

- ``HeadraceStreamWriter(...)`` is built by ``DataSource.streamWriter`` on the driver once per
  micro-batch to plan the write, pickled to the executors for ``write``, and built again (a
  fresh instance) on the driver for ``commit`` / ``abort``. It holds only the connector spec,
  validated options and ids, all picklable.
- ``write`` runs once per Spark task (one per partition of the micro-batch) on an executor: it
  builds the headrace sink, calls ``Sink.write(batch_id, batches)`` with the batch id Spark sets
  as the local property ``streaming.sql.batchId``, closes the sink and returns the sink's
  commit message wrapped in a :class:`HeadraceCommitMessage` (pickled back to the driver).
- ``commit`` / ``abort`` run once per micro-batch on the driver with every task's message and
  call ``Sink.commit`` / ``Sink.abort``. Spark writes ``commits/<n>`` in its checkpoint only
  after ``commit`` returns, and replays an uncommitted batch with the same id after a crash, so
  a sink whose commit is idempotent per (query id, batch id) stays exactly-once.

The query id handed to the sink is Spark's own query id, read from ``<checkpointLocation>/metadata``
(or, on storage this process cannot read, a UUID derived from the checkpoint location); both
are the same on every restart from that checkpoint.
"""

from __future__ import annotations

import contextlib
import logging
import os
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from headrace.errors import HeadraceError, OptionProblem, OptionsError, UnsupportedError
from headrace.options import Options
from headrace.plugins import ConnectorSpec
from headrace.protocols import CommitMessage, Sink, SinkContext
from headrace.spark._common import (
    SPARK_WRITER_OPTIONS,
    canonical_options,
    get_option,
    local_path,
    query_id_from_checkpoint,
)
from headrace.spark.type_mapping import conform_batches, spark_to_arrow_schema

__all__ = ["HeadraceCommitMessage", "HeadraceStreamWriter", "parse_sink_options"]

log = logging.getLogger(__name__)


class HeadraceCommitMessage(WriterCommitMessage):
    """A headrace sink's commit message (or None) in the type Spark requires. Picklable when
    the wrapped message is (the headrace contract)."""

    def __init__(self, message: CommitMessage | None) -> None:
        self.message = message

    def __repr__(self) -> str:
        return f"HeadraceCommitMessage({self.message!r})"


def parse_sink_options(spec: ConnectorSpec, raw: Mapping[str, Any]) -> tuple[Options, str]:
    """Validate a Spark writer's options against the connector's sink schema.

    Returns the options and the ``checkpointLocation``. Raises :class:`OptionsError` listing
    every problem at once (a missing ``checkpointLocation`` included: the sink's query id is
    derived from it). Pure: no I/O. Called on the driver once per micro-batch plan and commit.
    """
    if spec.sink is None:
        raise HeadraceError(f"connector '{spec.name}' cannot be written to (it is a source only); use it with readStream")
    problems: list[OptionProblem] = []
    checkpoint = get_option(raw, "checkpointLocation")
    if not checkpoint:
        problems.append(OptionProblem(
            "checkpointLocation",
            f"is required for sink '{spec.name}' under Spark: set .option('checkpointLocation', ...) on "
            "writeStream (headrace derives the sink's stable query id from it)",
        ))  # fmt: skip
    options = Options({})
    try:
        options = spec.sink_options.parse(
            canonical_options(raw, spec.sink_options, drop=SPARK_WRITER_OPTIONS), connector=spec.name, role="sink"
        )
    except OptionsError as e:
        problems = [*e.problems, *problems]
    if problems:
        raise OptionsError(spec.name, "sink", problems)
    return options, str(checkpoint)


class HeadraceStreamWriter(DataSourceStreamArrowWriter):
    """Drives a headrace ``Sink`` for Spark. Created by ``HeadraceDataSource.streamWriter``."""

    def __init__(self, spec: ConnectorSpec, raw_options: Mapping[str, Any], schema: StructType, overwrite: bool) -> None:
        """Validate options and output mode (raising :class:`OptionsError` /
        :class:`UnsupportedError`) and fix the sink's context. Called on the driver once per
        micro-batch (planning) and once per commit or abort; cheap, no I/O but reading Spark's
        checkpoint metadata."""
        options, checkpoint = parse_sink_options(spec, raw_options)
        sink_class = spec.load_sink()
        mode = "complete" if overwrite else "append"
        modes = tuple(getattr(sink_class, "output_modes", ("append",)))
        if mode not in modes:
            raise UnsupportedError(
                f"sink '{spec.name}' does not support output mode '{mode}'; it supports: {', '.join(modes)}"
            )
        self._spec = spec
        self._options = options
        self._arrow_schema = spark_to_arrow_schema(schema)
        cp = local_path(checkpoint)
        state_path = os.path.join(cp, "sinks", "0") if cp is not None else None
        self._context = SinkContext(
            query_id=query_id_from_checkpoint(checkpoint),
            run_id=str(uuid.uuid4()),
            query_name=str(get_option(raw_options, "queryName") or ""),
            output_mode=mode,
            state_path=state_path,
            schema=self._arrow_schema,
        )

    def _sink(self) -> Sink:
        if self._context.state_path is not None:
            os.makedirs(self._context.state_path, exist_ok=True)
        return self._spec.load_sink()(self._options, self._context)

    @property
    def query_id(self) -> str:
        """The stable query id the sink gets (``SinkContext.query_id``)."""
        return self._context.query_id

    def write(self, iterator: Iterator[pa.RecordBatch]) -> HeadraceCommitMessage:
        """Write one task's share of a micro-batch: ``Sink.write(batch_id, batches)``.

        Called once per Spark task, on an executor (a pickled copy of this writer). The batches
        are cast to the sink's schema (timestamps in UTC); the returned message is pickled to
        the driver.
        """
        ctx = TaskContext.get()
        raw_id = ctx.getLocalProperty("streaming.sql.batchId") if ctx is not None else None
        if raw_id is None:
            raise HeadraceError(
                f"sink '{self._spec.name}': Spark did not set streaming.sql.batchId; headrace sinks can only "
                "be used with writeStream"
            )
        sink = self._sink()
        try:
            message = sink.write(int(raw_id), iter(conform_batches(iterator, self._arrow_schema, connector=self._spec.name)))
        finally:
            sink.close()
        return HeadraceCommitMessage(message)

    @staticmethod
    def _unwrap(messages: Sequence[WriterCommitMessage | None]) -> list[CommitMessage | None]:
        return [m.message if isinstance(m, HeadraceCommitMessage) else None for m in messages]

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Make micro-batch ``batchId`` visible: ``Sink.commit(batchId, messages)``. Called once
        per micro-batch on the driver (on a fresh writer), and again with the same id when
        Spark replays the batch after a failure."""
        sink = self._sink()
        try:
            sink.commit(batchId, self._unwrap(messages))
        finally:
            sink.close()

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Discard what a failed micro-batch staged: ``Sink.abort``. Called at most once per
        failed batch on the driver; messages of failed tasks are None. Best effort: errors are
        logged, not raised, so Spark reports the failure that caused the abort."""
        try:
            sink = self._sink()
        except Exception as e:
            log.warning("sink '%s': abort of batch %d could not build the sink: %s", self._spec.name, batchId, e)
            return
        try:
            sink.abort(batchId, self._unwrap(messages))
        except Exception as e:
            log.warning("sink '%s': abort of batch %d failed: %s", self._spec.name, batchId, e)
        finally:
            with contextlib.suppress(Exception):
                sink.close()
