"""Unreachable brokers: the source and the sink fail within connectTimeout with an error naming
the servers, the time waited and the fix; librdkafka's log lines go through the module's logger
with repeats collapsed, so stderr is not flooded; no secret shows."""

from __future__ import annotations

import logging
import re
import socket
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from headrace.plugins import registry
from headrace.protocols import SinkContext, SourceContext
from headrace.testing import run_pipeline
from headrace_kafka._client import KafkaClientError, RepeatFilter, client_logger
from headrace_kafka.sink import KafkaSink
from headrace_kafka.source import KafkaSource
from tests.plugins.kafka.helpers import produce, unique

CANARY = "Canary-Sasl-Pw-7f3e91"
SASL = {"kafka.security.protocol": "SASL_PLAINTEXT", "kafka.sasl.mechanism": "PLAIN", "kafka.sasl.username": "u",
        "kafka.sasl.password": CANARY}  # fmt: skip
CONNECT_S = 2.0
WAITED = re.compile(r"no Kafka broker of 127\.0\.0\.1:([0-9]+) answered within connectTimeout 2 s \(waited ([0-9.]+) s\)")


def closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound once to pick it, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Records(logging.Handler):
    """Collects the records of one logger."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []  # appended under the handler's own lock (Handler.handle)

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def messages(self) -> list[str]:
        assert self.lock is not None  # made by Handler.__init__ (createLock)
        with self.lock:
            return [r.getMessage() for r in self.records]


@pytest.fixture
def librdkafka_logs() -> Iterator[Records]:
    h = Records()
    client_logger.addHandler(h)
    try:
        yield h
    finally:
        client_logger.removeHandler(h)


def check_error(text: str, port: int) -> float:
    """The error names the servers, the timeout, the time waited, the cause and the fix; returns the time waited."""
    m = WAITED.search(text)
    assert m, text[-3000:]
    assert int(m.group(1)) == port
    assert "Connection refused" in text and "raise connectTimeout" in text and "kafka.bootstrap.servers" in text
    return float(m.group(2))


# ---------------------------------------------------------------------- whole queries, in a subprocess

SOURCE_SPEC: dict[str, Any] = {
    "format": "kafka", "options": {"subscribe": "events", "connectTimeout": "2 seconds", **SASL}}  # fmt: skip
ROWS = {"format": "rate-micro-batch", "options": {"rowsPerBatch": 10, "totalRows": 10}}


@pytest.mark.parametrize(
    ("role", "transactional"),
    [
        pytest.param("source", False, id="source"),
        pytest.param("sink", False, id="sink-at-least-once"),
        pytest.param("sink", True, id="sink-transactional"),
    ],
)
def test_an_unreachable_broker_fails_the_query_within_connect_timeout_quietly(
    tmp_path: Path, role: str, transactional: bool
) -> None:
    port = closed_port()
    servers = {"kafka.bootstrap.servers": f"127.0.0.1:{port}"}
    if role == "source":
        spec: dict[str, Any] = {"source": {**SOURCE_SPEC, "options": {**SOURCE_SPEC["options"], **servers}},
                                "sink": {"format": "noop", "options": {}}}  # fmt: skip
    else:
        spec = {"source": ROWS, "transform": "tests.plugins.kafka.helpers:to_kafka_value",
                "sink": {"format": "kafka", "options": {**servers, "topic": "events", "connectTimeout": "2 seconds",
                                                        "transactional": str(transactional).lower(), **SASL}}}  # fmt: skip
    spec["checkpoint"] = str(tmp_path / "chk")
    res = run_pipeline(spec, timeout=90)
    assert res.returncode == 1, res.stderr[-3000:]
    waited = check_error(res.stderr, port)
    assert CONNECT_S <= waited < CONNECT_S + 5
    if role == "sink":
        assert ("kafka sink, starting transactions" if transactional else "kafka sink, connecting") in res.stderr
    else:
        assert "kafka source, first metadata request" in res.stderr
    assert res.elapsed < 60, f"took {res.elapsed:.0f} s"  # before: 4 lookups x 30 s, or flushTimeout (300 s)
    # librdkafka tried to connect about 20 times a second: stderr shows the first line and counts
    refused = [line for line in res.stderr.splitlines() if "Connection refused" in line and "FAIL [rdkafka#" in line]
    assert 1 <= len(refused) <= 6, "\n".join(refused[:20])
    assert any("repeated" in line for line in refused), "\n".join(refused)
    assert CANARY not in res.stderr and CANARY not in res.stdout


# ---------------------------------------------------------------------- in process: the logger and the waits


def make_source(servers: str, **options: Any) -> KafkaSource:
    opts = registry().get("kafka").source_options.parse({"kafka.bootstrap.servers": servers, **options}, connector="kafka")
    return KafkaSource(opts, SourceContext(query_id=uuid.uuid4().hex))


def make_sink(servers: str, tmp_path: Path, **options: Any) -> KafkaSink:
    opts = registry().get("kafka").sink_options.parse({"kafka.bootstrap.servers": servers, **options}, connector="kafka")
    return KafkaSink(opts, SinkContext(query_id=uuid.uuid4().hex, state_path=str(tmp_path / "sink")))


def test_librdkafka_lines_go_through_the_logger_collapsed(librdkafka_logs: Records) -> None:
    port = closed_port()
    src = make_source(f"127.0.0.1:{port}", subscribe="events", connectTimeout="1 second", **SASL)
    try:
        with pytest.raises(KafkaClientError) as e:
            src.initial_offset()
    finally:
        src.close()
    assert "within connectTimeout 1 s" in str(e.value) and CANARY not in str(e.value)
    assert {r.name for r in librdkafka_logs.records} == {"headrace_kafka._client.librdkafka"}
    refused = [m for m in librdkafka_logs.messages() if "Connection refused" in m]
    assert refused and "repeated" not in refused[0]
    counts = [int(n) for m in refused for n in re.findall(r"\(repeated ([0-9]+) more times\)", m)]
    assert counts and counts[0] >= 5, refused  # about 20 attempts in that second, counted, not printed
    assert len(refused) <= 4, refused
    assert not any(CANARY in m for m in librdkafka_logs.messages())


def test_a_reachable_cluster_connects_without_waiting(kafka: Any, tmp_path: Path) -> None:
    topic = kafka.create_topic(unique(), 1)
    produce(kafka.bootstrap_servers, topic, range(3))
    src = make_source(kafka.bootstrap_servers, subscribe=topic, startingOffsets="earliest", connectTimeout="1 second")
    try:
        assert src.initial_offset() == {topic: {"0": 0}}
    finally:
        src.close()
    sink = make_sink(kafka.bootstrap_servers, tmp_path, topic=topic, connectTimeout="1 second")
    try:
        sink.commit(0, [sink.write(0, iter(pa.table({"value": ["x"]}).to_batches()))])
    finally:
        sink.close()


def test_the_source_waits_for_a_broker_that_comes_up_within_connect_timeout(kafka: Any) -> None:
    topic = kafka.create_topic(unique(), 1)
    kafka.set_broker_up(-1, up=False)
    up = threading.Timer(1.5, lambda: kafka.set_broker_up(-1, up=True))
    src = make_source(kafka.bootstrap_servers, subscribe=topic, connectTimeout="20 seconds")
    up.start()
    try:
        assert src.initial_offset() == {topic: {"0": 0}}
    finally:
        up.cancel()
        kafka.set_broker_up(-1, up=True)
        src.close()


# ---------------------------------------------------------------------- the filter itself


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def record(text: str, client: str = "rdkafka#consumer-1", level: int = logging.ERROR) -> logging.LogRecord:
    return logging.LogRecord("x", level, __file__, 1, "%s [%s] %s", ("FAIL", client, text), None)


def refused(ms: int) -> str:
    return f"[thrd:b/bootstrap]: b: Connect to ipv4#127.0.0.1:9 failed: Connection refused (after {ms}ms in state CONNECT)"


def test_repeat_filter_lets_the_first_line_through_then_counts_every_interval() -> None:
    clock = Clock()
    f = RepeatFilter(interval_s=30.0, clock=clock)
    assert f.filter(record(refused(0)))
    assert not any(f.filter(record(refused(i % 3))) for i in range(99))  # timings differ: still the same line
    assert f.filter(record("another line"))
    assert f.filter(record(refused(0), client="rdkafka#consumer-2"))  # another client
    assert f.filter(record(refused(0), level=logging.WARNING))  # another level
    clock.now += 31
    again = record(refused(1))
    assert f.filter(again)
    assert again.getMessage().endswith("(repeated 100 times in the last 31 s)")
    assert not f.filter(record(refused(2)))


def test_repeat_filter_flush_logs_the_counts_once() -> None:
    clock = Clock()
    f = RepeatFilter(interval_s=30.0, clock=clock)
    logger = logging.getLogger("tests.kafka.repeat_filter")
    logger.propagate = False
    logger.addFilter(f)
    got = Records()
    logger.addHandler(got)
    try:
        for i in range(5):
            logger.handle(record(refused(i)))
        f.flush(logger)
        f.flush(logger)  # nothing new: nothing logged
        logger.handle(record(refused(7)))  # still within the interval: counted again, not printed
        f.flush(logger)
    finally:
        logger.removeHandler(got)
        logger.removeFilter(f)
    msgs = got.messages()
    assert len(msgs) == 3, msgs
    assert "repeated" not in msgs[0]
    assert msgs[1].endswith("Connection refused (after 4ms in state CONNECT) (repeated 4 more times)")
    assert msgs[2].endswith("(repeated 1 more times)")
