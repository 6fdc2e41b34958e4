"""Building confluent-kafka clients from validated options, and driver-side metadata lookups."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterable
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition

from headrace.errors import HeadraceError
from headrace.options import Options
from headrace_kafka._options import KAFKA_BOOTSTRAP_SERVERS  # typed option handles

__all__ = ["TP", "KafkaClientError", "Metadata", "client_logger", "consumer_config", "producer_config", "redact_servers"]

TP = tuple[str, int]
"""A topic-partition as a hashable pair."""

client_logger = logging.getLogger(__name__).getChild("librdkafka")  # the client library's own log lines
"""librdkafka's own log lines go here (instead of stderr)."""


class KafkaClientError(HeadraceError):
    """The Kafka client failed (brokers unreachable, unknown topic, delivery failure...)."""


def _servers(options: Options) -> str:
    return str(options.reveal(KAFKA_BOOTSTRAP_SERVERS))


def consumer_config(options: Options, group_id: str) -> dict[str, Any]:
    """librdkafka consumer settings: ours first, then every ``kafka.*`` option (which win).

    Contains secrets when the user passed some: never log or repr it.
    """
    conf: dict[str, Any] = {
        "bootstrap.servers": _servers(options),
        "group.id": group_id,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "error",
        "enable.partition.eof": False,
        # librdkafka's default of 1000 ms idles the fetcher after each fetch (about 7x slower here)
        "fetch.queue.backoff.ms": 10,
        # how long the broker holds a fetch when there is no new data. Low for real-time reads, and
        # for batch reads too: a consumer reused by the next batch's read must wait for its fetch
        # past the end of the data to come back before it can fetch at the new offsets (100 ms
        # here cost up to 100 ms per read partition per batch)
        "fetch.wait.max.ms": 10,
        "logger": client_logger,
    }
    conf.update(options.passthrough("kafka."))
    conf["bootstrap.servers"] = _servers(options)
    return conf


def producer_config(options: Options) -> dict[str, Any]:
    """librdkafka producer settings: idempotent by default, then every ``kafka.*`` option."""
    conf: dict[str, Any] = {
        "bootstrap.servers": _servers(options),
        "enable.idempotence": True,
        "logger": client_logger,
    }
    conf.update(options.passthrough("kafka."))
    conf["bootstrap.servers"] = _servers(options)
    return conf


def redact_servers(servers: str) -> str:
    """Bootstrap servers for error messages (they carry no secrets, but strip any user:pass@)."""
    return re.sub(r"[^,@/]+@", "***@", servers)


class Metadata:
    """Driver-side lookups (topics, partitions, watermarks, offsets by time) on one consumer.

    Created lazily by the source on the driver; never pickled.
    """

    def __init__(self, conf: dict[str, Any], *, retries: int, retry_interval_s: float, timeout_s: float = 30.0) -> None:
        self._consumer = Consumer(conf)
        self._servers = redact_servers(str(conf.get("bootstrap.servers", "")))
        self.retries = retries
        self.retry_interval_s = retry_interval_s
        self.timeout_s = timeout_s

    def _retry(self, what: str, fn: Any) -> Any:
        last: Exception | None = None
        for attempt in range(self.retries + 1):
            try:
                return fn()
            except KafkaException as e:
                last = e
                if attempt < self.retries:
                    time.sleep(self.retry_interval_s)
        raise KafkaClientError(
            f"Kafka at {self._servers}: {what} failed after {self.retries + 1} attempt(s): {last}; check that the "
            "brokers are reachable (kafka.bootstrap.servers) or raise fetchOffset.numRetries"
        ) from last

    def topics(self) -> dict[str, list[int]]:
        """Every topic the cluster reports (except internal ``__`` ones) with its partition ids."""
        md = self._retry("listing topics", lambda: self._consumer.list_topics(timeout=self.timeout_s))
        out: dict[str, list[int]] = {}
        for name, tm in md.topics.items():
            if name.startswith("__") or tm.error is not None:
                continue
            out[name] = sorted(tm.partitions)
        return out

    def watermarks(self, tps: Iterable[TP]) -> dict[TP, tuple[int, int]]:
        """(low, high) watermark of each topic-partition; a partition that no longer exists is left out."""
        out: dict[TP, tuple[int, int]] = {}
        for t, p in tps:
            try:
                out[(t, p)] = self._retry(
                    f"reading the offsets of {t}-{p}",
                    lambda t=t, p=p: self._consumer.get_watermark_offsets(
                        TopicPartition(t, p), timeout=self.timeout_s, cached=False
                    ),
                )
            except KafkaClientError as e:
                if "UNKNOWN_TOPIC_OR_PART" in str(e):
                    continue
                raise
        return out

    def offsets_for_times(self, wanted: dict[TP, int]) -> dict[TP, int]:
        """The first offset at or after each epoch-ms timestamp; -1 where there is none."""
        if not wanted:
            return {}
        tps = [TopicPartition(t, p, ts) for (t, p), ts in wanted.items()]
        got = self._retry("looking up offsets by timestamp",
                          lambda: self._consumer.offsets_for_times(tps, timeout=self.timeout_s))  # fmt: skip
        return {(tp.topic, tp.partition): int(tp.offset) for tp in got}

    def close(self) -> None:
        self._consumer.close()
