"""Helpers for the kafka plugin's tests: produce and read with plain confluent-kafka, transforms
importable from a subprocess, unique names."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any, cast

import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import Consumer, Producer, TopicPartition

from headrace.testing import wait_for

__all__ = ["consume_all", "int_values", "produce", "to_kafka_value", "unique", "wait_for"]


def unique(prefix: str = "t") -> str:
    """A fresh topic / query name."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


_producers: dict[str, Producer] = {}


def _producer(servers: str) -> Producer:
    """One idempotent producer per cluster for the whole session: a new idempotent producer waits
    about 0.5 s for its producer id before its first delivery."""
    p = _producers.get(servers)
    if p is None:
        # its log lines go to logging (not stderr): it outlives the test brokers and would report them gone
        p = _producers[servers] = Producer({"bootstrap.servers": servers, "linger.ms": 5, "enable.idempotence": True,
                                            "logger": logging.getLogger("tests.kafka.producer")})  # fmt: skip
    return p


def produce(
    servers: str,
    topic: str,
    values: Iterable[Any],
    *,
    partition: int | None = None,
    partitions: int | None = None,
    key: Callable[[Any], bytes | None] | None = None,
    headers: list[tuple[str, bytes]] | None = None,
    timestamp_ms: int | None = None,
    fresh: bool = False,
) -> int:
    """Produce ``values`` (as UTF-8 text), round-robin over ``partitions`` or to ``partition``; flushed.

    ``fresh``: with a new producer (for a topic that was deleted and re-created, whose partitions
    and sequence numbers the shared producer would have wrong)."""
    p = Producer({"bootstrap.servers": servers, "linger.ms": 5, "enable.idempotence": True}) if fresh else _producer(servers)
    n = 0
    for i, v in enumerate(values):
        part = partition if partition is not None else (i % partitions if partitions else -1)
        kw: dict[str, Any] = {}
        if headers is not None:
            kw["headers"] = headers
        if timestamp_ms is not None:
            kw["timestamp"] = timestamp_ms
        p.produce(topic, str(v).encode(), key(v) if key else None, part, **kw)
        n += 1
        if n % 10000 == 0:
            p.poll(0)
    assert p.flush(30) == 0, "undelivered test records"
    return n


def consume_all(servers: str, topic: str, partitions: int | None = None, *, timeout: float = 20.0, expect: int | None = None,
                read_committed: bool = False) -> list[Any]:  # fmt: skip
    """Every record of ``topic`` from the start (until ``expect`` records or the high watermarks)."""
    c = Consumer({"bootstrap.servers": servers, "group.id": unique("g"), "enable.auto.commit": False,
                  "fetch.wait.max.ms": 10, "fetch.queue.backoff.ms": 10,
                  "isolation.level": "read_committed" if read_committed else "read_uncommitted"})  # fmt: skip
    try:
        if partitions is None:
            partitions = len(c.list_topics(topic, timeout=10).topics[topic].partitions)
        tps = [TopicPartition(topic, p, 0) for p in range(partitions)]
        highs = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)[1] for p in range(partitions)}
        c.assign(tps)
        out: list[Any] = []
        pos = dict.fromkeys(range(partitions), 0)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if expect is not None and len(out) >= expect:
                # drain a little longer to catch duplicates
                for m in c.consume(10000, timeout=0.3):
                    if m.error() is None:
                        out.append(m)
                break
            if expect is None and all(
                c.position([TopicPartition(topic, p)])[0].offset >= highs[p] or highs[p] == 0 for p in range(partitions)
            ):
                break
            for m in c.consume(10000, timeout=0.1):
                if m.error() is None:
                    out.append(m)
                    pos[cast(int, m.partition())] = cast(int, m.offset()) + 1  # set: no error
        return out
    finally:
        c.close()


def int_values(msgs: Iterable[Any]) -> list[int]:
    return [int(m.value()) for m in msgs]


def to_kafka_value(table: pa.Table) -> pa.Table:
    """Rate rows (timestamp, value int64) -> a kafka sink's input: value as UTF-8 text, key too."""
    text = pc.cast(table.column("value"), pa.string())
    return pa.table({"key": text, "value": text})


def kafka_to_int(table: pa.Table) -> pa.Table:
    """Kafka source rows -> (value int64, topic, partition, offset): the value text parsed."""
    values = pc.cast(pc.cast(table.column("value"), pa.string()), pa.int64())
    return pa.table({"value": values, "topic": table.column("topic"), "partition": table.column("partition"),
                     "offset": table.column("offset")})  # fmt: skip


def select_key_value(table: pa.Table) -> pa.Table:
    """Kafka source rows -> kafka sink rows (key, value)."""
    return table.select(["key", "value"])
