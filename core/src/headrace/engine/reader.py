"""The partition reader: a batch's partitions, read in parallel, transformed, in order.

Each partition is read in a worker thread into its own bounded queue; the consumer (the sink's
``write``) drains the queues in partition order, so output order is deterministic and memory
is bounded by the queue sizes whatever the batch size.

A batch that yields no record batch at all (no partitions, empty files, a transform that keeps
no row) hands the sink one empty batch of the output schema, so every sink sees the columns
also for an empty batch.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from collections.abc import Callable, Generator, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as futures_wait
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from headrace.errors import HeadraceError
from headrace.helpers.crash import CrashHook
from headrace.protocols import Partition, Source

__all__ = ["BatchCounts", "ReadLane", "apply_transform", "empty_batch", "empty_output", "read_partitions"]

log = logging.getLogger(__name__)

_QUEUE_DEPTH = 8
_MAX_READ_THREADS = 256  # the process-wide pool's ceiling (idle threads are reused, never more are kept)

_READ_POOL: ThreadPoolExecutor | None = None
_READ_POOL_LOCK = threading.Lock()


def _read_pool() -> ThreadPoolExecutor:
    """The reader threads of every query of the process, kept between batches and queries.

    A new thread is started only when none is idle (``ThreadPoolExecutor`` reuses idle
    workers), so a query's first batch does not wait for ``Thread.start`` (which returns only
    once the new thread runs: a median 2.8 ms per thread while another Python thread is busy,
    measured on a 2-core machine). Each query bounds its own reads with a :class:`ReadLane`."""
    global _READ_POOL
    with _READ_POOL_LOCK:
        if _READ_POOL is None:
            _READ_POOL = ThreadPoolExecutor(_MAX_READ_THREADS, thread_name_prefix="headrace-read")
        return _READ_POOL


def _forget_read_pool() -> None:
    # a forked child has none of the parent's threads (the pool would count them as idle and
    # never run a read): a new pool on first use, and a fresh lock
    global _READ_POOL, _READ_POOL_LOCK
    _READ_POOL = None
    _READ_POOL_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_forget_read_pool)


class ReadLane:
    """One query's share of the process-wide reader threads: at most ``parallelism`` of its
    partitions are read at once, and :meth:`shutdown` (called when the query stops) waits
    until none of its reads runs any more.

    Created by the engine's query thread at the query's start; ``submit`` is called once per
    batch and reader thread, ``shutdown`` once."""

    def __init__(self, parallelism: int) -> None:
        if parallelism < 1:
            raise ValueError(f"read parallelism must be at least 1, got {parallelism}")
        self.parallelism = parallelism
        self._futures: set[Future[None]] = set()
        self._lock = threading.Lock()
        self._closed = False

    def submit(self, fn: Callable[[], None]) -> Future[None]:
        with self._lock:
            if self._closed:
                raise RuntimeError("the query's reader lane is shut down")
            f: Future[None] = _read_pool().submit(fn)
            self._futures.add(f)
        f.add_done_callback(self._discard)
        return f

    def _discard(self, f: Future[None]) -> None:
        with self._lock:
            self._futures.discard(f)

    def shutdown(self, wait: bool = True, cancel_futures: bool = False) -> None:
        """Accept no more reads; cancel those not started (``cancel_futures``) and wait for
        those running (``wait``)."""
        with self._lock:
            self._closed = True
            pending = list(self._futures)
        if cancel_futures:
            for f in pending:
                f.cancel()
        if wait:
            futures_wait(pending)


@dataclass
class BatchCounts:
    """Rows read per source (counted by the reader) and rows handed to the sink (set by the
    engine after the sink's write: after the stateful operators), for one batch's bad-record
    accounting."""

    input_rows: list[int] = field(default_factory=list)
    output_rows: int = 0


def transform_of(transform: Any, source_index: int) -> Callable[[pa.Table], Any] | None:
    """The transform of source ``source_index``'s batches: ``transform`` itself, or its
    item for that source when it is a list (a plan reading several inputs, e.g. a
    stream-stream join, applies each side's own steps to its sources)."""
    return transform[source_index] if isinstance(transform, list) else transform


def apply_transform(transform: Callable[[pa.Table], Any] | None, batch: pa.RecordBatch) -> Iterator[pa.RecordBatch]:
    """The user's per-batch function applied to one record batch (a Table in, a Table out)."""
    if transform is None:
        yield batch
        return
    out = transform(pa.Table.from_batches([batch]))
    if isinstance(out, pa.RecordBatch):
        yield out
    elif isinstance(out, pa.Table):
        yield from out.to_batches()
    elif out is not None:
        raise HeadraceError(f"the map_batches function returned {type(out).__name__}; it must return a pyarrow.Table")


def empty_batch(schema: pa.Schema) -> pa.RecordBatch:
    """A record batch of ``schema`` without rows (~10x cheaper than ``RecordBatch.from_pylist([])``,
    which goes through Python objects: it was most of a batch without data)."""
    return pa.RecordBatch.from_arrays([pa.array([], type=f.type) for f in schema], schema=schema)


def empty_output(sources: Sequence[Source], transform: Any) -> pa.RecordBatch | None:
    """A 0-row batch of what the sink gets: the first source's schema, or with a transform what
    the transform makes of an empty table of that schema. None when the transform fails on an
    empty table (its schema is then unknown). Called once per batch that yields nothing."""
    if not sources:
        return None
    transform = transform_of(transform, 0)
    try:
        schema = sources[0].schema
        empty = empty_batch(schema)
        if transform is None:
            return empty
        out = transform(pa.Table.from_batches([empty], schema=schema))
    except Exception as e:  # a transform that cannot take an empty table: the sink gets no batch
        log.debug("no empty batch for the sink: %s", e)
        return None
    if isinstance(out, pa.RecordBatch):
        return out.slice(0, 0)
    if isinstance(out, pa.Table):
        return empty_batch(out.schema)
    return None


def read_partitions(
    sources: Sequence[Source],
    parts: Sequence[tuple[int, Partition]],
    transform: Any,
    counts: BatchCounts,
    *,
    batch_id: int,
    pool: ReadLane | None,
    crash: CrashHook,
) -> Generator[pa.RecordBatch, None, None]:
    """Every partition's batches, transformed, in partition order; read in parallel threads
    (each partition into its own bounded queue) when there are several.

    ``parts`` pairs a source index with one of its partitions. Called once per batch; the
    returned iterator is consumed by the sink's ``write`` and closed by the engine. When
    nothing is yielded, one empty batch of the output schema is (:func:`empty_output`)."""
    n = 0
    inner = _read_partitions(sources, parts, transform, counts, batch_id=batch_id, pool=pool, crash=crash)
    try:
        for b in inner:
            n += 1
            yield b
    finally:
        inner.close()  # stops the reader threads now, not when the generator is collected
    if n == 0:
        empty = empty_output(sources, transform)
        if empty is not None:
            yield empty


def _read_partitions(
    sources: Sequence[Source],
    parts: Sequence[tuple[int, Partition]],
    transform: Any,
    counts: BatchCounts,
    *,
    batch_id: int,
    pool: ReadLane | None,
    crash: CrashHook,
) -> Generator[pa.RecordBatch, None, None]:
    if len(parts) <= 1 or pool is None:
        yield from _read_serially(sources, parts, transform, counts, batch_id, crash)
        return

    done = object()
    cancelled = threading.Event()
    queues: list[queue.Queue[Any]] = [queue.Queue(maxsize=_QUEUE_DEPTH) for _ in parts]

    def put(q: queue.Queue[Any], item: Any) -> bool:
        while not cancelled.is_set():
            try:
                q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def work(k: int) -> None:
        i, p = parts[k]
        q = queues[k]
        try:
            fn = transform_of(transform, i)
            for b in sources[i].read(p):
                if cancelled.is_set() or not put(q, (b.num_rows, list(apply_transform(fn, b)))):
                    return
            put(q, done)
        except BaseException as e:
            put(q, e)

    # Partitions are claimed in order, by the runners (at most ``parallelism`` per batch, each
    # reading the next unclaimed partition until none is left) and by the consumer itself: a
    # partition still unclaimed when the consumer reaches it (the runners are busy, or not yet
    # running: a pool thread starts 0.5-4.5 ms after the submit on a busy 2-core machine) is
    # read on the consumer's thread, without a queue or a hand-off. A partition is claimed only
    # after every earlier one, so the consumer (draining in partition order) always waits on
    # one being read.
    lock = threading.Lock()
    next_k = [0]

    def claim() -> int | None:
        with lock:
            k = next_k[0]
            if k >= len(parts):
                return None
            next_k[0] = k + 1
            return k

    def claim_inline(k: int) -> bool:
        with lock:
            if next_k[0] != k:
                return False
            next_k[0] = k + 1
            return True

    def run() -> None:
        while not cancelled.is_set():
            k = claim()
            if k is None:
                return
            work(k)

    futures = [pool.submit(run) for _ in range(min(pool.parallelism, len(parts)))]
    n_out = 0

    def emit(i: int, n_in: int, outs: list[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        nonlocal n_out
        counts.input_rows[i] += n_in
        for o in outs:
            n_out += 1
            if n_out == 2:
                crash("mid_write", batch_id)
            yield o

    try:
        for k, q in enumerate(queues):
            i = parts[k][0]
            if claim_inline(k):
                for b in sources[i].read(parts[k][1]):
                    yield from emit(i, b.num_rows, list(apply_transform(transform_of(transform, i), b)))
                continue
            while True:
                item = q.get()
                if item is done:
                    break
                if isinstance(item, BaseException):
                    raise item
                yield from emit(i, *item)
    finally:
        cancelled.set()
        for f in futures:
            f.cancel()


def _read_serially(
    sources: Sequence[Source],
    parts: Sequence[tuple[int, Partition]],
    transform: Any,
    counts: BatchCounts,
    batch_id: int,
    crash: CrashHook,
) -> Iterator[pa.RecordBatch]:
    n_out = 0
    for i, p in parts:
        for b in sources[i].read(p):
            counts.input_rows[i] += b.num_rows
            for o in apply_transform(transform_of(transform, i), b):
                n_out += 1
                if n_out == 2:
                    crash("mid_write", batch_id)
                yield o
