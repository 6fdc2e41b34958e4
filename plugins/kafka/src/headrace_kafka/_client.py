"""Building confluent-kafka clients from validated options, and driver-side metadata lookups."""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from headrace.errors import HeadraceError, redact
from headrace.options import Options
from headrace_kafka._options import KAFKA_BOOTSTRAP_SERVERS  # typed option handles

__all__ = [
    "REPEAT_REPORT_S",
    "TP",
    "BrokerErrors",
    "KafkaClientError",
    "Metadata",
    "RepeatFilter",
    "await_brokers",
    "client_logger",
    "consumer_config",
    "producer_config",
    "redact_servers",
]

TP = tuple[str, int]
"""A topic-partition as a hashable pair."""

REPEAT_REPORT_S = 30.0
"""How often a librdkafka log line that keeps repeating is let through again, with its count."""

_MAX_REPEAT_KEYS = 512
_VARYING = re.compile(r"\(after [0-9]+ms in state [A-Z_]+\)|\b[0-9]+ms\b")  # parts that differ between repeats


class RepeatFilter(logging.Filter):
    """Collapses repeated librdkafka log lines: the first occurrence passes; later identical ones
    (same level, client, facility and text, timings aside) are counted and one of them is let
    through every :data:`REPEAT_REPORT_S` seconds with "(repeated N times in the last S s)" added.

    An unreachable broker makes librdkafka log the same "Connection refused" line about 20 times
    a second; this keeps the first and a count. Installed on :data:`client_logger`. ``filter``
    is called for every librdkafka log record, on whichever thread serves the client's queue
    (``poll``, ``consume``, ``flush``...); thread-safe.
    """

    def __init__(self, interval_s: float = REPEAT_REPORT_S, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.interval_s = interval_s
        self._clock = clock
        self._lock = threading.Lock()
        # key -> [when last let through (clock), repeats since, the last repeat's args]
        self._seen: dict[tuple[Any, ...], list[Any]] = {}

    @staticmethod
    def _key(record: logging.LogRecord) -> tuple[Any, ...]:
        args = record.args if isinstance(record.args, tuple) else ()
        return (record.levelno, record.msg, *(_VARYING.sub("", a) if isinstance(a, str) else a for a in args))

    def filter(self, record: logging.LogRecord) -> bool:
        """Whether ``record`` is logged (see the class docstring); may add the repeat count to it."""
        if getattr(record, "headrace_repeats", None) is not None:  # a count logged by flush
            return True
        key = self._key(record)
        now = self._clock()
        with self._lock:
            seen = self._seen.get(key)
            if seen is None:
                if len(self._seen) >= _MAX_REPEAT_KEYS:  # forget the line unseen for longest (first in the dict)
                    del self._seen[next(iter(self._seen))]
                self._seen[key] = [now, 0, None]
                return True
            self._seen[key] = self._seen.pop(key)  # the most recent last: eviction drops the longest unseen
            if now - seen[0] < self.interval_s:
                seen[1] += 1
                seen[2] = record.args
                return False
            repeats, since = seen[1] + 1, now - seen[0]
            seen[0], seen[1], seen[2] = now, 0, None
        record.msg = f"{record.msg} (repeated {repeats} times in the last {since:.0f} s)"
        return True

    def flush(self, logger: logging.Logger) -> None:
        """Log how often each line was repeated since it was last let through (and start counting
        again). Called when a client gives up connecting or closes, so that a burst of repeats does
        not go uncounted; on the caller's thread."""
        with self._lock:
            pending = [(k, list(v)) for k, v in self._seen.items() if v[1]]
            for _, v in self._seen.items():
                v[1], v[2] = 0, None
        for (level, msg, *_), (_, repeats, args) in pending:
            logger.log(level, f"{msg} (repeated {repeats} more times)", *(args or ()), extra={"headrace_repeats": repeats})


repeat_filter = RepeatFilter()
"""The filter installed on :data:`client_logger`."""

client_logger = logging.getLogger(__name__).getChild("librdkafka")  # the client library's own log lines
"""librdkafka's own log lines go here (instead of stderr), repeats collapsed by :data:`repeat_filter`."""
client_logger.addFilter(repeat_filter)


class KafkaClientError(HeadraceError):
    """The Kafka client failed (brokers unreachable, unknown topic, delivery failure...)."""


class BrokerErrors:
    """A client's ``error_cb``: remembers librdkafka's last error about a broker (connection
    refused, TLS or SASL failure...) for the message of :func:`await_brokers`.

    Called by confluent-kafka while the client's queue is served (``poll``, ``flush``...), on
    that thread; the log lines say the same, so nothing is logged here.
    """

    def __init__(self) -> None:
        self.last: str | None = None

    def __call__(self, err: Any) -> None:
        try:
            if err.code() == KafkaError._ALL_BROKERS_DOWN and self.last is not None:
                return  # "1/1 brokers are down" says less than the error before it
            text = err.str()
        except Exception:
            text = str(err)
        self.last = redact(_VARYING.sub("", str(text)).strip())


def await_brokers(client: Any, servers: str, timeout_s: float, *, errors: BrokerErrors | None = None,
                  what: str = "kafka") -> None:  # fmt: skip
    """Wait until one of the brokers answers a metadata request, at most ``timeout_s`` seconds
    (the ``connectTimeout`` option), else raise :class:`KafkaClientError` naming the servers, the
    time waited, librdkafka's last error and the fix.

    Called once per client that talks to the brokers first (the source's metadata consumer, the
    sink's producer), on the thread that uses it, before its first request.
    """
    started = time.monotonic()
    deadline = started + timeout_s
    while True:
        try:
            # in slices: librdkafka takes the timeout in int milliseconds
            client.list_topics(timeout=max(0.001, min(deadline - time.monotonic(), 3600.0)))
            return
        except KafkaException as e:
            last: Exception = e
        if time.monotonic() >= deadline:
            break
        time.sleep(0.05)  # a retry backoff, in case librdkafka failed the request before its timeout
    waited = time.monotonic() - started
    with contextlib.suppress(Exception):
        client.poll(0)  # serve the queued log lines and errors (error_cb)
    repeat_filter.flush(client_logger)
    cause = errors.last if errors is not None and errors.last else str(last)
    raise KafkaClientError(
        redact(
            f"{what}: no Kafka broker of {servers} answered within connectTimeout {timeout_s:g} s (waited "
            f"{waited:.1f} s); last error: {cause}. Check kafka.bootstrap.servers, that the brokers are running "
            "and reachable from this machine (and kafka.security.protocol / kafka.sasl.* / kafka.ssl.*), or raise "
            "connectTimeout"
        )
    ) from None


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

    def __init__(self, conf: dict[str, Any], *, retries: int, retry_interval_s: float, timeout_s: float = 30.0,
                 connect_timeout_s: float = 30.0) -> None:  # fmt: skip
        self._errors = BrokerErrors()
        self._consumer = Consumer({**conf, "error_cb": self._errors})
        self._servers = redact_servers(str(conf.get("bootstrap.servers", "")))
        self.retries = retries
        self.retry_interval_s = retry_interval_s
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s

    def connect(self) -> None:
        """Wait for the first contact with the brokers (at most ``connect_timeout_s``), else raise
        :class:`KafkaClientError`. Called once, by the source, right after creating this object."""
        await_brokers(self._consumer, self._servers, self.connect_timeout_s, errors=self._errors,
                      what="kafka source, first metadata request")  # fmt: skip

    def _retry(self, what: str, fn: Any) -> Any:
        last: Exception | None = None
        for attempt in range(self.retries + 1):
            try:
                return fn()
            except KafkaException as e:
                last = e
                if attempt < self.retries:
                    time.sleep(self.retry_interval_s)
            finally:
                self._consumer.poll(0)  # serve librdkafka's log lines (this consumer reads no records)
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
        """Close the consumer. Called once, when the source closes (or gives up connecting)."""
        self._consumer.close()
        repeat_filter.flush(client_logger)
