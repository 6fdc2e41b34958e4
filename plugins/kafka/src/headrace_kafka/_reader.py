"""The reading side of ``KafkaSource``: a batch's offset range read exactly, and real-time reads.

``KafkaReader`` is a mixin of :class:`~headrace_kafka.source.KafkaSource`. ``read`` is called once
per read partition per batch, in a worker thread or on a pickled copy of the source (each thread
opens its own consumer; consumers are not pickled); ``read_real_time`` once per real-time batch,
on the query thread, with a background thread (``_Discovery``) looking up new partitions.
"""

from __future__ import annotations

import bisect
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, cast

import pyarrow as pa
from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

from headrace.options import Options
from headrace.protocols import Offset, Partition, RealTimeChunk
from headrace_kafka._arrow import convert, to_record_batch
from headrace_kafka._client import TP, KafkaClientError, Metadata, consumer_config
from headrace_kafka._offsets import KafkaPartition, _flat, _nested

__all__ = ["KafkaReader"]

log = logging.getLogger(__name__)

# A read's chunk (one ``consume``, one record batch). Larger chunks measured worse on Kafka
# JSON -> Delta (100,000: ~1.12x the CPU and ~1.4x the time of 10,000): ``consume`` then waits
# for several fetches before returning, so reading and the query's steps stop overlapping.
_CONSUME_BATCH = 10_000
_error = Message.error
_topic = cast("Callable[[Message], str]", Message.topic)
_partition = cast("Callable[[Message], int]", Message.partition)
_offset = cast("Callable[[Message], int]", Message.offset)  # never None for a message without error


class _Discovery(threading.Thread):
    """Looks up the query's topic-partitions about every second during a real-time batch; the
    reading loop takes what is new (``found`` / ``take``) without waiting for the broker."""

    def __init__(self, source: KafkaReader, known: set[TP], stop: threading.Event) -> None:
        super().__init__(daemon=True, name="headrace-kafka-discovery")
        self._source = source
        self._known = known
        self._stop_batch = stop
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._new: list[TP] = []
        self._error: BaseException | None = None
        self.found = False
        """Cheap check for the reading loop: something new (or an error) is waiting in ``take``."""

    def run(self) -> None:
        while not self._done.wait(1.0) and not self._stop_batch.is_set():
            try:
                new = [tp for tp in self._source._partitions_now() if tp not in self._known]
            except BaseException as e:  # handed to the reading loop, which raises it
                with self._lock:
                    self._error = e
                    self.found = True
                return
            if new:
                self._known.update(new)
                with self._lock:
                    self._new.extend(new)
                    self.found = True

    def take(self) -> list[TP]:
        """New topic-partitions since the last call; raises the lookup's error, if any."""
        with self._lock:
            new, self._new, self.found = self._new, [], False
            if self._error is not None:
                raise self._error
        return new

    def finish(self) -> None:
        """Stop and wait for an in-flight lookup (the metadata consumer is used after the batch)."""
        self._done.set()
        if self.is_alive():
            self.join(timeout=35)


class KafkaReader:
    """Mixin of ``KafkaSource``: reading records (see the module docstring)."""

    # set by KafkaSource.__init__ (and __setstate__ on a pickled copy)
    options: Options
    group_id: str
    include_headers: bool
    columns: frozenset[str] | None  # what the query reads (prune_columns); None: every column
    poll_timeout_s: float
    _servers: str
    _local: threading.local
    _lock: threading.Lock
    _consumers: list[Consumer]

    if TYPE_CHECKING:  # defined by KafkaSource (driver side)

        def _partitions_now(self) -> list[TP]: ...
        def _metadata(self) -> Metadata: ...
        def _data_loss(self, message: str) -> None: ...

    # ------------------------------------------------------------------ reading
    def _consumer(self) -> Consumer:
        c = getattr(self._local, "consumer", None)
        if c is None:
            c = Consumer(consumer_config(self.options, self.group_id))
            self._local.consumer = c
            with self._lock:
                self._consumers.append(c)
        return c

    def _low_watermark(self, consumer: Consumer, t: str, p: int) -> int | None:
        try:
            return int(consumer.get_watermark_offsets(TopicPartition(t, p), timeout=10, cached=False)[0])
        except Exception:
            return None

    def read(self, partition: Partition) -> Iterator[pa.RecordBatch]:
        """Read offsets ``[start, end)`` of one topic-partition, stopping exactly at ``end``.

        Called once per read partition per batch, in a worker thread (or on a pickled copy);
        deterministic: offsets skipped by the broker (compaction, transaction markers) are
        skipped, offsets deleted by retention are data loss (``failOnDataLoss``).
        """
        assert isinstance(partition, KafkaPartition)
        t, p, end = partition.topic, partition.partition, partition.end
        consumer = self._consumer()
        consumer.assign([TopicPartition(t, p, partition.start)])
        pos = partition.start
        last_progress = time.monotonic()
        last_check = last_progress
        try:
            while pos < end:
                msgs = consumer.consume(min(_CONSUME_BATCH, end - pos), timeout=0.2)
                if msgs and not any(map(_error, msgs)):
                    # fast path, no Python code per message: offsets in order, no errors
                    offsets = list(map(_offset, msgs))
                    if offsets[0] > pos:
                        low = self._low_watermark(consumer, t, p)
                        if low is not None and low > pos:
                            self._data_loss(f"{t}-{p}: offsets {pos}..{min(low, offsets[0]) - 1} are gone "
                                            f"(earliest available is {low})")  # fmt: skip
                    if offsets[-1] >= end:
                        k = bisect.bisect_left(offsets, end)
                        msgs, offsets = msgs[:k], offsets[:k]
                        pos = end
                    else:
                        pos = offsets[-1] + 1
                    if msgs:
                        yield to_record_batch(msgs, t, p, self.include_headers, offsets, self.columns)
                        last_progress = time.monotonic()
                    continue
                good: list[Any] = []
                restart: int | None = None
                for m in msgs:
                    err = m.error()
                    if err is not None:
                        if err.code() == KafkaError._PARTITION_EOF:
                            continue
                        if err.code() in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
                            low = self._low_watermark(consumer, t, p)
                            if low is None or low <= pos:
                                raise KafkaClientError(f"reading {t}-{p} at offset {pos}: {err.str()}")
                            self._data_loss(f"{t}-{p}: offsets {pos}..{min(low, end) - 1} are gone "
                                            f"(earliest available is {low})")  # fmt: skip
                            restart = low
                            break
                        if err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                            self._data_loss(f"{t}-{p} no longer exists (deleted while offsets {pos}..{end - 1} "
                                            "were being read)")  # fmt: skip
                            return
                        raise KafkaClientError(f"reading {t}-{p} at offset {pos} from {self._servers}: {err.str()}")
                    off = int(m.offset() or 0)
                    if off >= end:
                        pos = end
                        break
                    if off > pos and not good:
                        low = self._low_watermark(consumer, t, p)
                        if low is not None and low > pos:
                            self._data_loss(f"{t}-{p}: offsets {pos}..{min(low, off) - 1} are gone "
                                            f"(earliest available is {low})")  # fmt: skip
                    good.append(m)
                    pos = off + 1
                if good:
                    yield to_record_batch(good, t, p, self.include_headers, columns=self.columns)
                    last_progress = time.monotonic()
                if restart is not None:
                    pos = int(restart)
                    if pos >= end:
                        break
                    consumer.assign([TopicPartition(t, p, pos)])
                    continue
                if not msgs and pos < end:
                    now = time.monotonic()
                    position = consumer.position([TopicPartition(t, p)])[0].offset
                    if position >= end:  # only control records / compacted-away offsets remain
                        break
                    if now - last_check > 1.0:
                        last_check = now
                        wm = consumer.get_watermark_offsets(TopicPartition(t, p), timeout=10, cached=False)
                        if wm[1] <= pos:
                            self._data_loss(f"{t}-{p}: offsets {pos}..{end - 1} of this batch are gone (the partition "
                                            f"now ends at {wm[1]}; topic re-created?)")  # fmt: skip
                            return
                    if now - last_progress > self.poll_timeout_s:
                        raise KafkaClientError(
                            f"reading {t}-{p}: no record for {self.poll_timeout_s:g} s at offset {pos} (range ends at "
                            f"{end}) from {self._servers}; check the brokers or raise kafkaConsumer.pollTimeoutMs"
                        )
        finally:
            consumer.unassign()

    def read_real_time(self, start: Offset, stop: Any) -> Iterator[RealTimeChunk]:
        """Yield records as they arrive, from ``start``, until ``stop`` is set.

        Called once per real-time batch, on the query thread. One low-latency consumer reads every
        topic-partition: it blocks on ``poll`` until the first record arrives, then takes whatever
        else is already fetched (``consume`` without waiting), and yields all of it as one chunk
        (any topic-partitions; the offsets of every partition just after them). New partitions
        are looked up about every second on a background thread, so the reading loop never waits
        for a metadata request.
        """
        assert isinstance(stop, threading.Event)
        pos = _flat(start)
        for tp in self._partitions_now():
            pos.setdefault(tp, 0)
        wm = self._metadata().watermarks(pos)
        for tp in list(pos):
            if tp not in wm:
                self._data_loss(f"{tp[0]}-{tp[1]} no longer exists on {self._servers} (topic or partition deleted)")
                del pos[tp]
        consumer = Consumer(consumer_config(self.options, self.group_id))
        discovery = _Discovery(self, set(pos), stop)
        try:
            consumer.assign([TopicPartition(t, p, o) for (t, p), o in pos.items()])
            discovery.start()
            while not stop.is_set():
                if discovery.found:
                    new = discovery.take()
                    for tp in new:
                        pos[tp] = 0
                    consumer.incremental_assign([TopicPartition(t, p, 0) for t, p in new])
                    yield RealTimeChunk(to_record_batch([], new[0][0], new[0][1], self.include_headers),
                                        _nested(pos), ())  # fmt: skip
                first = consumer.poll(0.02)  # returns as soon as one record is there
                if first is None:
                    continue
                more = consumer.consume(_CONSUME_BATCH, timeout=0)  # what is fetched already, no waiting
                chunk = self._chunk(consumer, [first, *more] if more else [first], pos)
                if chunk is not None:
                    yield chunk
        finally:
            discovery.finish()
            consumer.close()

    def _chunk(self, consumer: Consumer, msgs: list[Any], pos: dict[TP, int]) -> RealTimeChunk | None:
        """The records of ``msgs`` as one chunk; ``pos`` moves past them. Errors: data loss or raise."""
        if any(map(_error, msgs)):
            good: list[Any] = []
            for m in msgs:
                err = m.error()
                if err is None:
                    good.append(m)
                    continue
                if err.code() == KafkaError._PARTITION_EOF:
                    continue
                t, p = m.topic(), m.partition()
                if err.code() in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE) and (t, p) in pos:
                    low = self._low_watermark(consumer, t, p)
                    if low is not None and low > pos[(t, p)]:
                        self._data_loss(f"{t}-{p}: offsets {pos[(t, p)]}..{low - 1} are gone (earliest available is {low})")
                        pos[(t, p)] = low
                        consumer.seek(TopicPartition(t, p, low))
                        continue
                raise KafkaClientError(f"reading {t}-{p} from {self._servers}: {err.str()}")
            if not good:
                return None
            msgs = good
        topics, parts, offsets = list(map(_topic, msgs)), list(map(_partition, msgs)), list(map(_offset, msgs))
        batch, times = convert(msgs, self.include_headers, topics, parts, offsets)
        for tp, off in dict(zip(zip(topics, parts, strict=True), offsets, strict=True)).items():  # last offset per partition
            pos[tp] = off + 1
        return RealTimeChunk(batch, _nested(pos), times)
