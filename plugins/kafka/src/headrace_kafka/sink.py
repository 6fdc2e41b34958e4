"""``KafkaSink``: rows to Kafka records, at-least-once (Spark's guarantee) or exactly-once with
Kafka transactions (a headrace extension, ``transactional=true``).

Input columns, as in Spark: ``value`` (required), ``key``, ``topic`` (unless the ``topic``
option is set, which wins), ``partition`` and ``headers`` (``list<struct<key: string, value:
binary>>``), strings or binary. Other columns are ignored.

At-least-once: an idempotent producer (no duplicates from retries); ``write`` waits for every
delivery (``flush``) and a delivery failure fails the batch. A crash after the records are
delivered but before the checkpoint commit replays the batch: duplicates downstream.

Exactly-once (``transactional``): the producer's ``transactional.id`` is
``transactionalIdPrefix + query id``, so a restarted query fences the previous instance and
aborts its open transaction. A batch is one transaction: ``write`` begins it and produces,
``commit`` adds the batch id as the committed offset of the consumer group
``transactionalIdPrefix + query id`` (on partition 0 of the marker topic) and commits. Records
and marker become visible atomically; a replayed batch whose id is already marked is aborted
instead of committed. Readers must use ``isolation.level=read_committed``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from headrace.errors import HeadraceError
from headrace.helpers.durable import atomic_write
from headrace.options import Options
from headrace.protocols import CommitMessage, Sink, SinkContext
from headrace_kafka._client import (
    BrokerErrors,
    KafkaClientError,
    await_brokers,
    client_logger,
    producer_config,
    redact_servers,
    repeat_filter,
)
from headrace_kafka._options import (  # typed option handles
    CONNECT_TIMEOUT,
    FLUSH_TIMEOUT,
    KAFKA_BOOTSTRAP_SERVERS,
    TOPIC,
    TRANSACTIONAL,
)

__all__ = ["KafkaCommitMessage", "KafkaSink"]

log = logging.getLogger(__name__)

_SETTLE_S = 0.02
_TEXT = (pa.string(), pa.large_string(), pa.binary(), pa.large_binary(), pa.string_view(), pa.binary_view())


@dataclass(frozen=True)
class KafkaCommitMessage(CommitMessage):
    """What one ``write`` produced. Picklable."""

    rows: int
    transactional: bool


@dataclass(frozen=True)
class _Columns:
    value: int
    key: int | None
    topic: int | None
    partition: int | None
    headers: int | None


class KafkaSink(Sink):
    """Writes record batches to Kafka. Real-time capable: each record batch is produced as it
    arrives and delivered (flushed) before the batch commits.

    Created once per query run on the driver; the producer is created here (at-least-once) or on
    the first write (transactional, which talks to the transaction coordinator). Either way its
    first contact with the brokers waits at most ``connectTimeout``, then fails the query.
    """

    idempotent_commit = False  # at-least-once by default; see ``transactional`` (module docstring)
    supports_real_time = True
    output_modes = ("append", "update", "complete")

    def __init__(self, options: Options, context: SinkContext) -> None:
        super().__init__(options, context)
        self.topic: str | None = options[TOPIC]
        self.transactional: bool = options[TRANSACTIONAL]
        self.flush_timeout: float = options[FLUSH_TIMEOUT]
        self.connect_timeout: float = options[CONNECT_TIMEOUT]
        self._servers = redact_servers(str(options.reveal(KAFKA_BOOTSTRAP_SERVERS)))
        suffix = context.query_id or context.query_name or "headrace"
        self.transactional_id = f"{options['transactionalIdPrefix']}{suffix}"
        self._producer: Producer | None = None
        self._producer_born = 0.0
        self._producer_settled = False
        self._contacted = False  # the brokers answered the producer once (see _await_brokers)
        self._broker_errors = BrokerErrors()
        self._lock = threading.Lock()
        self._errors: list[str] = []
        self._written = 0
        # transactional state
        self._txn_open_for: int | None = None
        self._last_committed: int = -1
        self._marker_topic: str | None = self.topic
        self._group_consumer: Consumer | None = None
        if self.transactional and context.state_path:
            state = os.path.join(context.state_path, "kafka_txn.json")
            if os.path.exists(state):
                with open(state) as f:
                    self._marker_topic = self._marker_topic or json.load(f).get("markerTopic")
        if not self.transactional:
            # Connect now, not at the first write: records produced in the first ~10 ms of a new
            # idempotent producer waited ~0.5 s for their first delivery (librdkafka's mock
            # cluster); created here, the producer is usually older than that when the first batch
            # arrives (``write`` waits out the rest). A configuration error surfaces at the first
            # write, as before. The first contact with the brokers is made here too (at most
            # connectTimeout): brokers that go away later fail deliveries (message.timeout.ms).
            with contextlib.suppress(KafkaException, ValueError, TypeError):
                self._get_producer()
            if self._producer is not None:
                self._await_brokers(self._producer, "connecting")

    def __repr__(self) -> str:
        return f"KafkaSink(topic={self.topic!r}, servers={self._servers!r}, transactional={self.transactional})"

    # ------------------------------------------------------------------ producer
    def _on_delivery(self, err: Any, msg: Any) -> None:
        if err is not None:
            self._errors.append(f"{msg.topic()}[{msg.partition()}]: {err.str()}")

    def _get_producer(self) -> Producer:
        with self._lock:
            if self._producer is None:
                conf = producer_config(self.options)
                conf["on_delivery"] = self._on_delivery
                conf["error_cb"] = self._broker_errors
                conf.setdefault("delivery.report.only.error", True)
                if self.transactional:
                    conf["transactional.id"] = self.transactional_id
                producer = Producer(conf)
                self._producer_born = time.monotonic()
                if self.transactional:
                    # first contact bounded by connectTimeout: init_transactions would wait flushTimeout
                    self._await_brokers(producer, "starting transactions")
                    try:
                        producer.init_transactions(self.flush_timeout)
                    except KafkaException as e:
                        raise KafkaClientError(
                            f"cannot start Kafka transactions on {self._servers} (transactional.id "
                            f"{self.transactional_id}): {e}; the brokers must support transactions (Kafka >= 0.11 "
                            "with a transaction coordinator), or set transactional=false"
                        ) from e
                    self._last_committed = self._read_marker()
                self._producer = producer
            return self._producer

    def _await_brokers(self, producer: Producer, what: str) -> None:
        """The producer's first contact with the brokers, at most connectTimeout; once per producer."""
        if not self._contacted:
            await_brokers(producer, self._servers, self.connect_timeout, errors=self._broker_errors,
                          what=f"kafka sink, {what}")  # fmt: skip
            self._contacted = True

    def _group(self) -> Consumer:
        if self._group_consumer is None:
            conf = {k: v for k, v in producer_config(self.options).items() if k not in ("enable.idempotence",)}
            conf = {k: v for k, v in conf.items() if not k.startswith(("linger", "acks", "compression", "batch",
                                                                       "queue.buffering", "message.send"))}  # fmt: skip
            conf.update({"group.id": self.transactional_id, "enable.auto.commit": False, "logger": client_logger})
            self._group_consumer = Consumer(conf)
        return self._group_consumer

    def _read_marker(self) -> int:
        """The last batch id committed by this query (-1 if none), from the marker group's offset."""
        if self._marker_topic is None:
            return -1
        got = self._group().committed([TopicPartition(self._marker_topic, 0)], timeout=self.flush_timeout)
        off = got[0].offset if got else -1
        return off - 1 if off >= 0 else -1

    # ------------------------------------------------------------------ writing
    def _columns(self, schema: pa.Schema) -> _Columns:
        names = {n.lower(): i for i, n in enumerate(schema.names)}

        def col(name: str, allowed: tuple[pa.DataType, ...], what: str) -> int | None:
            i = names.get(name)
            if i is not None and schema.field(i).type not in allowed:
                raise HeadraceError(
                    f"kafka sink: column {name!r} has type {schema.field(i).type}; it must be {what} "
                    "(cast it in map_batches)"
                )
            return i

        value = col("value", _TEXT, "string or binary")
        if value is None:
            raise HeadraceError(
                f"kafka sink: the data has no 'value' column (columns: {', '.join(schema.names)}); add one with "
                "map_batches (string or binary)"
            )
        topic = col("topic", (pa.string(), pa.large_string(), pa.string_view()), "string")
        if topic is None and self.topic is None:
            raise HeadraceError(
                "kafka sink: no topic: set the option topic=... or add a 'topic' column (string) to the data"
            )
        headers_ok = tuple(
            pa.list_(pa.struct([pa.field("key", kt), pa.field("value", vt)]))
            for kt in (pa.string(), pa.large_string()) for vt in _TEXT
        )  # fmt: skip
        hi = names.get("headers")
        if hi is not None and not (pa.types.is_list(schema.field(hi).type) or pa.types.is_large_list(schema.field(hi).type)):
            col("headers", headers_ok, "list<struct<key: string, value: binary>>")
        return _Columns(
            value=value,
            key=col("key", _TEXT, "string or binary"),
            topic=None if self.topic is not None else topic,
            partition=col("partition", (pa.int8(), pa.int16(), pa.int32(), pa.int64()), "an integer"),
            headers=hi,
        )

    def _raise_delivery_errors(self, batch_id: int) -> None:
        if self._errors:
            errors, self._errors = self._errors, []
            more = f" (and {len(errors) - 3} more)" if len(errors) > 3 else ""
            raise KafkaClientError(
                f"kafka sink, batch {batch_id}: {len(errors)} record(s) were not delivered to {self._servers}: "
                f"{'; '.join(errors[:3])}{more}; the batch failed and will be replayed on restart"
            )

    def _produce_all(self, producer: Producer, batch: pa.RecordBatch, cols: _Columns) -> None:
        n = batch.num_rows
        values = batch.column(cols.value).to_pylist()
        keys = batch.column(cols.key).to_pylist() if cols.key is not None else None
        if cols.topic is not None:
            topics = batch.column(cols.topic).to_pylist()
            if None in topics:
                raise HeadraceError("kafka sink: a row has a null 'topic'; set the topic option or fill the column")
        else:
            topics = None
        parts = batch.column(cols.partition).to_pylist() if cols.partition is not None else None
        headers = None
        if cols.headers is not None:
            headers = [None if h is None else [(e["key"], e["value"]) for e in h]
                       for h in batch.column(cols.headers).to_pylist()]  # fmt: skip
        produce = producer.produce
        topic: Any = self.topic
        simple = topics is None and parts is None and headers is None
        i = 0
        while i < n:
            try:
                if simple:
                    if keys is None:
                        for i in range(i, n):  # noqa: B020
                            produce(topic, values[i])
                    else:
                        for i in range(i, n):  # noqa: B020
                            produce(topic, values[i], keys[i])
                else:
                    for i in range(i, n):  # noqa: B020
                        produce(
                            topics[i] if topics is not None else topic,
                            values[i],
                            keys[i] if keys is not None else None,
                            -1 if parts is None or parts[i] is None else int(parts[i]),
                            headers=headers[i] if headers is not None else None,
                        )
                i += 1
            except BufferError:  # the local queue is full: serve deliveries, then go on with row i
                producer.poll(0.05)
        producer.poll(0)

    def write(self, batch_id: int, data: Iterator[pa.RecordBatch]) -> CommitMessage:
        """Produce every row of ``data``; return once all are delivered (flushed).

        Called once per batch by the local engine (possibly from several threads for one batch);
        in real-time mode ``data`` is live and each record batch is produced as soon as it
        arrives. Transactional: begins the batch's transaction (once per batch). The result is
        picklable.
        """
        producer = self._get_producer()
        if not self._contacted:  # the producer was not made in __init__: its first contact now
            with self._lock:  # no record is produced before a broker answered (else flushTimeout applies)
                self._await_brokers(producer, f"batch {batch_id}")
        if not self._producer_settled:
            self._producer_settled = True
            young = _SETTLE_S - (time.monotonic() - self._producer_born)
            if young > 0:  # see __init__: let a brand-new producer connect before the first record
                producer.poll(young)
        if self.transactional and batch_id <= self._last_committed:
            # a replay of a batch this query already committed in Kafka: write nothing
            log.info("kafka sink: batch %d is already committed in Kafka; skipping its replay", batch_id)
            rows = sum(rb.num_rows for rb in data)
            return KafkaCommitMessage(rows, self.transactional)
        if self.transactional:
            with self._lock:
                if self._txn_open_for is None:
                    producer.begin_transaction()
                    self._txn_open_for = batch_id
        rows = 0
        cols: _Columns | None = None
        schema: pa.Schema | None = None
        for rb in data:
            if rb.num_rows == 0:
                continue
            if cols is None or rb.schema != schema:
                schema = rb.schema
                cols = self._columns(schema)
            if self._marker_topic is None and self.transactional:
                first = rb.column(cols.topic).to_pylist()[0] if cols.topic is not None else self.topic
                self._remember_marker_topic(str(first))
            self._produce_all(producer, rb, cols)
            rows += rb.num_rows
            self._raise_delivery_errors(batch_id)
        deadline = time.monotonic() + self.flush_timeout
        while producer.flush(min(1.0, max(0.0, deadline - time.monotonic()))) > 0:
            if time.monotonic() >= deadline:
                raise KafkaClientError(
                    f"kafka sink, batch {batch_id}: {len(producer)} record(s) still undelivered to {self._servers} "
                    f"after flushTimeout {self.flush_timeout:g} s; check the brokers or raise flushTimeout"
                )
        self._raise_delivery_errors(batch_id)
        self._written += rows
        return KafkaCommitMessage(rows, self.transactional)

    def _remember_marker_topic(self, topic: str) -> None:
        self._marker_topic = topic
        if self.context.state_path:
            os.makedirs(self.context.state_path, exist_ok=True)
            atomic_write(os.path.join(self.context.state_path, "kafka_txn.json"),
                         json.dumps({"markerTopic": topic}).encode())  # fmt: skip

    def commit(self, batch_id: int, messages: Sequence[CommitMessage | None]) -> None:
        """Make the batch durable. Called once per batch on the driver, again after a replay.

        At-least-once: waits for any delivery still pending. Transactional: commits the batch's
        transaction together with its batch id; a batch id already committed (a replay after a
        crash between the Kafka commit and the checkpoint commit) is aborted instead.
        """
        producer = self._get_producer()
        if not self.transactional:
            producer.flush(self.flush_timeout)
            self._raise_delivery_errors(batch_id)
            return
        with self._lock:
            if batch_id <= self._last_committed:
                log.info("kafka sink: batch %d was already committed in Kafka; aborting its replay", batch_id)
                if self._txn_open_for is not None:
                    producer.abort_transaction(self.flush_timeout)
                    self._txn_open_for = None
                return
            if self._txn_open_for is None:
                producer.begin_transaction()
            if self._marker_topic is None:
                raise HeadraceError(
                    "kafka sink: transactional mode needs a topic to keep its batch marker in; set the topic option"
                )
            marker = TopicPartition(self._marker_topic, 0, batch_id + 1, f"{self.context.query_id}:{batch_id}")
            try:
                producer.send_offsets_to_transaction([marker], self._group().consumer_group_metadata(),
                                                     self.flush_timeout)  # fmt: skip
                producer.commit_transaction(self.flush_timeout)
            except KafkaException as e:
                err = e.args[0] if e.args else None
                fenced = isinstance(err, KafkaError) and err.fatal()
                raise KafkaClientError(
                    f"kafka sink, batch {batch_id}: committing the transaction of {self.transactional_id} failed: {e}"
                    + ("; another instance of this query took over (fenced): stop one of them" if fenced else "")
                ) from e
            finally:
                self._txn_open_for = None
            self._last_committed = batch_id

    def abort(self, batch_id: int, messages: Sequence[CommitMessage | None]) -> None:
        """Discard the batch: aborts its transaction (transactional); at-least-once records already
        delivered cannot be taken back. Called at most once per failed batch."""
        if self.transactional and self._producer is not None and self._txn_open_for is not None:
            try:
                self._producer.abort_transaction(self.flush_timeout)
            except KafkaException as e:
                log.warning("kafka sink: aborting the transaction of batch %d failed: %s", batch_id, e)
            self._txn_open_for = None

    def metrics(self) -> Mapping[str, Any]:
        """Records written by this run (for the progress report)."""
        return {"recordsWritten": self._written}

    def close(self) -> None:
        """Deliver what is pending and release the producer. Called once when the query stops."""
        producer, self._producer = self._producer, None
        if producer is not None:
            if self.transactional and self._txn_open_for is not None:
                with contextlib.suppress(KafkaException):
                    producer.abort_transaction(10)
            producer.flush(10)
        if self._group_consumer is not None:
            consumer, self._group_consumer = self._group_consumer, None
            consumer.close()
        repeat_filter.flush(client_logger)
