"""The contracts between the engine and connectors: Source, Sink and what flows between them.

The shapes mirror PySpark 4's ``DataSourceStreamReader`` / ``DataSourceStreamWriter`` so that
``headrace.spark`` can expose any connector to Spark with a thin adapter:

=========================  =========================================
headrace                    PySpark 4
=========================  =========================================
``Source.initial_offset``   ``DataSourceStreamReader.initialOffset``
``Source.latest_offset``    ``latestOffset(start, limit)``
``Source.default_read_limit``  ``getDefaultReadLimit``
``Source.prepare_for_available_now``  ``SupportsTriggerAvailableNow``
``Source.partitions``       ``partitions(start, end)``
``Source.read``             ``read(partition)`` (yields Arrow batches)
``Source.commit``           ``commit(end)``
``Sink.write``              ``DataSourceStreamArrowWriter.write``
``Sink.commit`` / ``abort``  ``commit(messages, batchId)`` / ``abort``
=========================  =========================================

Offsets are JSON objects: dicts with string keys whose values may nest (dicts, lists,
strings, integers, booleans, None), e.g. ``{"topic": {"0": 42, "1": 7}}``. They must survive
a JSON round trip unchanged (no tuples, no non-string keys), because the engine writes them to
the checkpoint and hands a restarted source the parsed copy. They are compared only by the
source that made them (and by the engine for equality: ``end == start`` means "no new data").

Life cycle, as the engine drives it (see ``headrace.engine``)::

    source = SourceClass(options, context)          # once per query run, on the driver
    start = checkpoint end or source.initial_offset()
    loop:
        end = source.latest_offset(start, limit)    # once per trigger
        (offsets/<n> written)
        for p in source.partitions(start, end):     # once per batch
            source.read(p)                          # once per partition, maybe in a thread,
                                                    # maybe in another process (pickled)
        sink.write(n, batches) -> message           # one or more times per batch
        sink.commit(n, messages)                    # once per batch, maybe again on replay
        (commits/<n> written)
        source.commit(end)
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import pyarrow as pa

if TYPE_CHECKING:
    from headrace.options import Options

__all__ = [
    "CommitMessage",
    "Offset",
    "Partition",
    "ReadLimit",
    "RealTimeChunk",
    "Sink",
    "SinkContext",
    "Source",
    "SourceContext",
]

Offset = dict[str, Any]
"""A JSON-serialisable dict of primitives (str, int, float, bool, None, lists and dicts of them)."""


class Partition:
    """One unit of read work of a batch. Subclasses are usually frozen dataclasses.

    Must be picklable: the engine may read it in a thread, and ``headrace.spark`` ships it to
    a Spark executor.
    """


class CommitMessage:
    """What ``Sink.write`` returns for ``Sink.commit`` to finish. Must be picklable."""


@dataclass(frozen=True)
class ReadLimit:
    """Admission control for one batch (Spark's ``ReadLimit``).

    A source honours the limits that make sense for it (files, bytes, rows/offsets) and ignores
    the others. ``max_bytes`` is soft: a batch may go over it so that the stream always
    advances. ``min_rows`` with ``max_trigger_delay`` (seconds) asks the source to wait for at
    least that many new rows, unless the last batch was that long ago (Kafka's
    ``minOffsetsPerTrigger`` / ``maxTriggerDelay``).
    """

    max_files: int | None = None
    max_bytes: int | None = None
    max_rows: int | None = None
    min_rows: int | None = None
    max_trigger_delay: float | None = None

    @classmethod
    def all_available(cls) -> ReadLimit:
        """No limit: everything available now."""
        return cls()

    @property
    def is_all_available(self) -> bool:
        return self.max_files is None and self.max_bytes is None and self.max_rows is None and self.min_rows is None


@dataclass(frozen=True)
class SourceContext:
    """What the engine tells a source when it creates it.

    ``state_path`` is the source's own folder in the checkpoint (``sources/<i>``), created
    before the source is, for state such as a file index or staged data. It is ``None`` when
    the source is created outside a query (``headrace describe``, contract tests of offsets).
    ``has_committed_batches`` is True when the checkpoint already holds a committed batch (a
    resumed query: state the source kept in ``state_path`` must be there); False for a new
    query, and where the engine cannot tell (under Spark).
    """

    query_id: str = ""
    run_id: str = ""
    source_index: int = 0
    state_path: str | None = None
    user_schema: pa.Schema | None = None
    has_committed_batches: bool = False


@dataclass(frozen=True)
class SinkContext:
    """What the engine tells a sink when it creates it.

    ``query_id`` is stable across restarts of the same checkpoint (use it, with the batch id,
    to make commits idempotent). ``state_path`` is the sink's folder in the checkpoint
    (``sinks/0``), or ``None`` without a checkpoint.
    """

    query_id: str = ""
    run_id: str = ""
    query_name: str = ""
    output_mode: str = "append"
    state_path: str | None = None
    schema: pa.Schema | None = None


@dataclass(frozen=True)
class RealTimeChunk:
    """A few records read in real-time mode, with the offset just after them.

    ``source_times_ms`` holds, per row, when the record entered the source system (e.g. the
    Kafka message timestamp) in epoch milliseconds, for the latency metrics; empty if unknown.
    """

    data: pa.RecordBatch
    offset: Offset
    source_times_ms: Sequence[float] = field(default=())


class Source(ABC):
    """A streaming source. Subclass it (or implement the same methods).

    Class attributes declare what the source guarantees:

    - ``replayable``: reading the same ``[start, end)`` again gives the same rows. Needed for
      exactly-once.
    - ``supports_real_time``: implements ``read_real_time`` for ``trigger(real_time=...)``.
    - ``needs_state_path``: keeps state of its own in ``context.state_path`` (a file index,
      staged messages, a start time) that must survive restarts. The local engine always gives
      one (``<checkpoint>/sources/<i>``); under Spark, which does not tell a Python source its
      checkpoint, such a source needs the ``headraceStatePath`` option, unless
      :meth:`default_state_path` derives a folder from its options. A source without state
      (offsets alone say where it is) leaves it False and runs under Spark with no extra option.
    - ``supports_planning_ahead``: with ``trigger(available_now=True)``, ``latest_offset`` may be
      called for the next batches before the earlier ones are read or committed (the engine
      then plans up to 24 batches ahead, so their offsets entries reach the disk while earlier
      batches run). Declare it only when ``latest_offset(start, limit)`` depends on nothing but
      its arguments and what was there when ``prepare_for_available_now`` ran, and does nothing
      that assumes ``start`` is committed (Spark's engine never calls it early: a source that
      acknowledges or frees ``start`` upstream in ``latest_offset`` must leave it False).
    - ``reads_wait``: reading a partition waits on something outside the process (a broker, a
      file system, a server): the engine reads a batch's partitions in reader threads at
      first. A source that generates or copies its rows in process (the rate and memory
      sources) sets it False: its reads only hold the GIL, so the engine reads its partitions
      one after the other on the query's thread at first, and tries reader threads after 16
      batches (``headrace.engine.read_mode``, which keeps whichever measures cheaper).

    The constructor is called once per query run, on the driver, with validated options; it may
    connect to the service. It must not read data.
    """

    replayable: ClassVar[bool] = True
    supports_real_time: ClassVar[bool] = False
    needs_state_path: ClassVar[bool] = False
    supports_planning_ahead: ClassVar[bool] = False
    reads_wait: ClassVar[bool] = True

    @classmethod
    def default_state_path(cls, options: Options) -> str | None:
        """Where the source's state lives when the engine cannot say (under Spark without
        ``headraceStatePath``), derived from its options; None when nothing can be derived.

        Called once per reader on the Spark driver, before the source is built; pure (no I/O).
        Only consulted when ``needs_state_path`` is True."""
        return None

    def __init__(self, options: Options, context: SourceContext) -> None:
        self.options = options
        self.context = context

    @property
    @abstractmethod
    def schema(self) -> pa.Schema:
        """The Arrow schema of the rows. Called after construction, before the first batch;
        may be refined after a restart (e.g. schema evolution)."""

    @abstractmethod
    def initial_offset(self) -> Offset:
        """Where a new stream starts. Called once, only when the checkpoint has no batch yet."""

    def default_read_limit(self) -> ReadLimit:
        """The limit from the source's rate options (``maxFilesPerTrigger``, ...). Called once per run.

        The default derives it from the options declared with ``Option(..., read_limit="max_files")``
        (see :class:`headrace.options.Option`); override it for anything else."""
        read_limit = getattr(self.options, "read_limit", None)
        return read_limit() if callable(read_limit) else ReadLimit.all_available()

    @abstractmethod
    def latest_offset(self, start: Offset, limit: ReadLimit) -> Offset:
        """The end of the next batch, given where it starts and the admission limit.

        Called once per trigger, on the driver (for planning-ahead sources, also for batches
        after the one running). Returning ``start`` means there is no new data. ``start`` must
        not be modified (the engine keeps it as the batch's start): return a new offset. A
        ``limit.max_rows`` caps the rows of the whole batch, all partitions (streams, shards)
        together, and the end is never rounded past it; while rows are left the batch holds at
        least one.
        """

    def prepare_for_available_now(self) -> bool:
        """Called once when a query starts with ``trigger(available_now=True)``.

        A source that supports it records what is available now and from then on never returns
        a ``latest_offset`` beyond that, and returns True. The default returns False: the
        engine then runs a single batch with no read limit, as Spark does.
        """
        return False

    @abstractmethod
    def partitions(self, start: Offset, end: Offset) -> Sequence[Partition]:
        """Split ``[start, end)`` into units of read work; ``[]`` when ``start == end``.

        Called once per batch (and again for the same range when a batch is replayed), on the
        driver. The result must be picklable.
        """

    def prune_columns(self, columns: frozenset[str]) -> None:
        """The columns of ``schema`` the query reads (a strict, non-empty subset of its names):
        from now on ``read`` may build only these (Spark's ``pruneColumns``).

        Called at most once per query run, on the driver, after ``schema`` and before the first
        ``partitions``; only when the engine knows that no step of the query reads the other
        columns (each step up to the first that narrows the columns says what it reads, e.g. a
        ``select`` or :class:`~headrace.transforms.from_json.FromJson`); never under Spark. A
        source that honours it yields batches of exactly these columns, in ``schema``'s order and
        with its types, and keeps the choice in an attribute (``read`` may run on a pickled copy).
        The default ignores it: batches keep every column, which is always correct. Real-time
        reads (``read_real_time``) may ignore it too.
        """

    @abstractmethod
    def read(self, partition: Partition) -> Iterator[pa.RecordBatch]:
        """Read one partition's rows, each batch with exactly ``self.schema`` (or the columns
        given to ``prune_columns``, when the source honours it).

        Called once per partition per batch, possibly in a worker thread or on a Spark executor
        (on a pickled copy of the source): it must not depend on state changed after
        ``partitions``. Deterministic for a given partition when ``replayable``.
        """

    def read_real_time(self, start: Offset, stop: Any) -> Iterator[RealTimeChunk]:
        """Yield records as they arrive, from ``start``, until ``stop`` (a ``threading.Event``)
        is set. Called once per real-time batch; only when ``supports_real_time``. Must return
        promptly (within ~100 ms) once ``stop`` is set."""
        from headrace.errors import UnsupportedError

        raise UnsupportedError(
            f"source {type(self).__name__} does not support the real-time trigger; use trigger(processing_time=...)"
        )

    def commit(self, end: Offset) -> None:
        """Everything up to ``end`` is durably processed: acknowledge upstream, clean up.

        Called once per batch, in batch order, after the batch is committed (its ``commits/<n>``
        durable), on the driver; possibly after later batches' ``latest_offset``, ``partitions``,
        reads and sink commits (Spark defers it to the next batch likewise). May be a no-op.
        It may release (delete, acknowledge) only what is before ``end``: the data of batches
        planned after it must stay readable until their own ``commit``.
        """

    def metrics(self, latest: Offset) -> Mapping[str, Any]:
        """Backlog metrics for the progress report (``numFilesOutstanding``, ...), given the
        end of the batch just run. Called once per batch; keep it cheap."""
        return {}

    def close(self) -> None:
        """Release connections and threads. Called once when the query stops; idempotent.

        Under ``headrace.spark`` it is also called on each executor's pickled (or rebuilt) copy
        after its ``read``: release only what that copy holds, never shared state."""


class Sink(ABC):
    """A streaming sink. Subclass it (or implement the same methods).

    Class attributes declare what the sink guarantees:

    - ``idempotent_commit``: committing the same batch id twice (after a crash and replay)
      writes its rows once. With a replayable source this gives exactly-once.
    - ``supports_real_time``: ``write`` hands each record batch on as soon as it gets it, so it
      can serve ``trigger(real_time=...)``.
    - ``output_modes``: the output modes it accepts.

    The constructor is called once per query run, on the driver (and, under Spark, once per
    task on the executors: it must be cheap and must not write).
    """

    idempotent_commit: ClassVar[bool] = False
    supports_real_time: ClassVar[bool] = False
    output_modes: ClassVar[tuple[str, ...]] = ("append",)

    def __init__(self, options: Options, context: SinkContext) -> None:
        self.options = options
        self.context = context

    @abstractmethod
    def write(self, batch_id: int, data: Iterator[pa.RecordBatch]) -> CommitMessage | None:
        """Write (or stage) one share of a batch and return what ``commit`` needs.

        Called one or more times per batch (once per Spark task under ``headrace.spark``,
        once per batch in the local engine), possibly in a worker thread or another process.
        Nothing written here may become visible before ``commit`` unless the sink is
        at-least-once. The result must be picklable.
        """

    def commit(self, batch_id: int, messages: Sequence[CommitMessage | None]) -> None:
        """Make the batch visible. Called once per batch on the driver with every ``write``'s
        message; called again with the same ``batch_id`` when a batch is replayed after a
        crash, and must then not duplicate rows if ``idempotent_commit``.

        Batch ids of one query arrive in increasing order; after a restart the first one may
        repeat the last id this query committed (never an older one). A batch whose messages
        hold no rows need not be recorded (recording it is harmless). The record of committed
        batches is keyed by ``context.query_id`` and the batch id (two queries may write one
        target) and is written in the same transaction as the rows; a commit made of several
        calls to the target must survive a kill between any two of them. A failure must
        propagate (the query fails and replays the batch): never log it and return. Exactly-once
        delivery holds as far as the target keeps what it acknowledged (a durable target)."""

    def abort(self, batch_id: int, messages: Sequence[CommitMessage | None]) -> None:
        """Discard what the batch staged. Called at most once per failed batch; messages of
        writes that failed are ``None``. Best effort."""

    def metrics(self) -> Mapping[str, Any]:
        """Sink metrics for the progress report (e.g. ``numChunksSkipped``), read after each
        batch's commit, on the driver. Keep it cheap. The values are the last batch's, not
        running totals: ``numRowsSkipped`` (rows of a replayed batch that were already in the
        target) is subtracted from that batch's output rows."""
        return {}

    def close(self) -> None:
        """Release connections. Called once when the query stops; idempotent."""
