"""The options of the ``kafka`` source and sink, declared once (Spark's names, case-insensitive).

Importing this module imports neither confluent-kafka nor anything that does I/O: the registry
reads these schemas to validate options and render ``headrace describe kafka``.
"""

from __future__ import annotations

import re
from typing import Any

from headrace.errors import OptionProblem
from headrace.options import (
    Boolean,
    Choice,
    Duration,
    Integer,
    Json,
    OneOf,
    Option,
    Options,
    OptionSchema,
    PassThrough,
    String,
    StringList,
    Timestamp,
    exactly_one_of,
    rule,
)

__all__ = ["SINK_OPTIONS", "SOURCE_OPTIONS"]

_BOOTSTRAP_DOC = "Comma-separated host:port list of the Kafka brokers (passed as bootstrap.servers)."
_CONNECT_TIMEOUT_DOC = (
    "headrace extension: how long the first contact with the brokers ({what}) may wait before the query "
    "fails with an error naming the servers ('10 seconds'; default 30 s, like librdkafka's "
    "socket.connection.setup.timeout.ms)."
)

# kafka.* settings that Spark's Kafka integration rejects, or that are Java-only and mean nothing to
# librdkafka. Each maps to the fix shown to the user.
_SOURCE_FORBIDDEN = {
    "auto.offset.reset": "offsets are managed by the source: use startingOffsets instead",
    "enable.auto.commit": "offsets live in the checkpoint, never in consumer-group commits: remove it",
    "key.deserializer": "keys are always read as binary: cast the key column in map_batches",
    "value.deserializer": "values are always read as binary: cast the value column in map_batches",
    "interceptor.classes": "Java interceptors do not exist in librdkafka: remove it",
    "sasl.jaas.config": "a Java (JAAS) setting; librdkafka uses kafka.sasl.mechanism, kafka.sasl.username "
    "and kafka.sasl.password",
    "ssl.truststore.location": "a Java (JKS) setting; librdkafka uses kafka.ssl.ca.location (a PEM file)",
    "enable.partition.eof": "the source decides where reads end: remove it",
}
_SINK_FORBIDDEN = {
    "key.serializer": "keys are written as binary (or UTF-8 strings): remove it",
    "value.serializer": "values are written as binary (or UTF-8 strings): remove it",
    "transactional.id": "set the option transactional=true; the sink derives one transactional id per query",
    "interceptor.classes": "Java interceptors do not exist in librdkafka: remove it",
    "sasl.jaas.config": "a Java (JAAS) setting; librdkafka uses kafka.sasl.mechanism, kafka.sasl.username "
    "and kafka.sasl.password",
    "ssl.truststore.location": "a Java (JKS) setting; librdkafka uses kafka.ssl.ca.location (a PEM file)",
}


def _forbidden(table: dict[str, str]) -> Any:
    @rule("kafka.* settings the connector manages itself are rejected: " + ", ".join(f"kafka.{k}" for k in table))
    def check(opts: Options) -> list[OptionProblem]:
        problems = []
        for key in opts.passthrough("kafka."):
            fix = table.get(key.lower())
            if fix is not None:
                problems.append(OptionProblem(f"kafka.{key}", f"is not supported ({fix})"))
        return problems

    return check


def _client_config(role: str) -> Any:
    """librdkafka itself checks the ``kafka.*`` settings (names and values) at load(): a client
    made with no bootstrap servers validates its configuration without any network I/O (about a
    millisecond). Skipped when confluent-kafka is not installed (the connector says so at start)."""

    @rule(f"kafka.* settings must be valid librdkafka {role} settings")
    def check(opts: Options) -> list[OptionProblem]:
        settings = opts.passthrough("kafka.")
        if not settings:
            return []
        try:
            import logging

            from confluent_kafka import Consumer, KafkaException, Producer
        except ImportError:
            return []
        quiet = logging.getLogger(__name__ + ".config_check")
        quiet.disabled = True
        conf = {**settings, "bootstrap.servers": "", "logger": quiet}
        if role == "consumer":
            conf.setdefault("group.id", "headrace-config-check")
        try:
            client = Consumer(conf) if role == "consumer" else Producer(conf)
        except KafkaException as e:
            err = e.args[0] if e.args else e
            text = err.str() if hasattr(err, "str") else str(err)
            if text.startswith("Failed to create"):  # the build or the machine (e.g. no GSSAPI), not a value
                return []
            return [OptionProblem("kafka.*", f"librdkafka refuses the settings: {text}")]
        if role == "consumer":
            client.close()
        return []

    return check


def _check_partition_map(name: str, value: Any, *, values: str, lowest: int) -> list[OptionProblem]:
    """``{"topic": {"0": 23, "1": -2}}`` with int partitions and ints >= ``lowest``."""
    example = '{"topicA": {"0": 23, "1": -2}}' if lowest == -2 else '{"topicA": {"0": 23, "1": -1}}'
    if not isinstance(value, dict) or not value:
        return [OptionProblem(name, f"{value!r} is not a JSON object of topics to partitions ({values}), e.g. {example}")]
    for topic, parts in value.items():
        if not isinstance(parts, dict):
            return [OptionProblem(name, f"topic {topic!r} maps to {parts!r}, expected an object of partitions, e.g. {example}")]
        for p, off in parts.items():
            if not re.fullmatch(r"[0-9]{1,10}", str(p)):
                return [OptionProblem(name, f"topic {topic!r}: partition {p!r} is not a partition number, e.g. {example}")]
            if isinstance(off, bool) or not isinstance(off, int) or off < lowest:
                return [OptionProblem(name, f"{topic}-{p}: {off!r} is not valid ({values}), e.g. {example}")]
    return []


@rule("startingOffsets / endingOffsets / *ByTimestamp / assign JSON must be well-formed")
def _check_json_shapes(opts: Options) -> list[OptionProblem]:
    problems: list[OptionProblem] = []
    so = opts["startingOffsets"]
    if opts.is_set("startingOffsets") and not isinstance(so, str):
        problems += _check_partition_map("startingOffsets", so, values="an offset, -2 for earliest or -1 for latest",
                                         lowest=-2)
    eo = opts["endingOffsets"]
    if opts.is_set("endingOffsets") and not isinstance(eo, str):
        problems += _check_partition_map("endingOffsets", eo, values="an offset or -1 for latest", lowest=-1)
    for name in ("startingOffsetsByTimestamp", "endingOffsetsByTimestamp"):
        if opts.is_set(name):
            problems += _check_partition_map(name, opts[name], values="epoch milliseconds", lowest=0)
    if opts.is_set("assign"):
        a = opts["assign"]
        ok = isinstance(a, dict) and a and all(
            isinstance(ps, list) and ps and all(isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in ps)
            for ps in a.values()
        )
        if not ok:
            problems.append(OptionProblem("assign", f"{a!r} is not a JSON object of topics to partition lists, "
                                                    'e.g. {"topicA": [0, 1], "topicB": [2, 4]}'))
    if opts.is_set("endingOffsets") and opts["endingOffsets"] == "earliest":
        problems.append(OptionProblem("endingOffsets", "'earliest' is not allowed for endingOffsets; use 'latest' or JSON"))
    return problems


@rule("minOffsetsPerTrigger <= maxOffsetsPerTrigger")
def _check_min_max(opts: Options) -> list[OptionProblem]:
    lo, hi = opts["minOffsetsPerTrigger"], opts["maxOffsetsPerTrigger"]
    if lo is not None and hi is not None and lo > hi:
        return [OptionProblem("minOffsetsPerTrigger", f"{lo} is more than maxOffsetsPerTrigger {hi}; lower it or raise "
                                                      "maxOffsetsPerTrigger")]  # fmt: skip
    return []


SOURCE_OPTIONS = OptionSchema(
    [
        Option("kafka.bootstrap.servers", String(), required=True, doc=_BOOTSTRAP_DOC),
        Option("subscribe", StringList(min_items=1), doc="Comma-separated list of topics to read."),
        Option("subscribePattern", String(), doc="Regular expression of topics to read; new matching topics are "
                                                 "picked up between batches."),
        Option("assign", Json(), doc='JSON of topic-partitions to read, e.g. {"topicA": [0, 1]}.'),
        Option(
            "startingOffsets",
            OneOf(Choice("earliest", "latest"), Json()),
            default="latest",
            doc='Where a new query starts: earliest, latest, or JSON {"topic": {"0": 23, "1": -2}} '
            "(-2 earliest, -1 latest; every partition must be listed). Ignored when the checkpoint has "
            "offsets. Partitions discovered later start at their earliest offset.",
        ),
        Option(
            "startingOffsetsByTimestamp",
            Json(),
            doc='JSON {"topic": {"0": epochMs}}: start each partition at the first offset whose timestamp is '
            ">= the given one. Takes precedence over startingOffsets.",
        ),
        Option(
            "startingTimestamp",
            OneOf(Integer(min=0), Timestamp()),
            doc="Epoch ms (or, as a headrace extension, an ISO timestamp) applied to every partition. Takes "
            "precedence over startingOffsetsByTimestamp and startingOffsets.",
        ),
        Option(
            "startingOffsetsByTimestampStrategy",
            Choice("error", "latest"),
            default="error",
            doc="When no offset matches a starting timestamp: error fails the query, latest starts at the end.",
        ),
        Option(
            "endingOffsets",
            OneOf(Choice("latest", "earliest"), Json()),
            doc='Bounded run: the stream stops growing at these offsets (latest = the end at query start, or JSON '
            '{"topic": {"0": 50, "1": -1}}). In Spark a batch-query option; here it bounds a stream.',
        ),
        Option("endingOffsetsByTimestamp", Json(), doc='Bounded run, like endingOffsets, by JSON {"topic": {"0": epochMs}}.'),
        Option("endingTimestamp", OneOf(Integer(min=0), Timestamp()), doc="Bounded run: stop every partition at this time."),
        Option("maxOffsetsPerTrigger", Integer(min=1), read_limit="max_rows", doc="At most this many offsets per batch, split across "
                                                           "topic-partitions in proportion to their lag."),
        Option("minOffsetsPerTrigger", Integer(min=1), read_limit="min_rows", doc="Wait until this many new offsets are available "
                                                           "(or maxTriggerDelay has passed) before a batch."),
        Option("maxTriggerDelay", Duration(), default=900.0, read_limit="max_trigger_delay", doc="Longest wait for minOffsetsPerTrigger (default 15m)."),
        Option(
            "failOnDataLoss",
            Boolean(),
            default=True,
            doc="Fail when offsets the query needs are gone (retention, deleted topic or partition, offsets reset); "
            "false logs a warning, skips what is gone and continues.",
        ),
        Option("includeHeaders", Boolean(), default=False, doc="Add the headers column (list of key, value)."),
        Option("minPartitions", Integer(min=1), doc="Split large topic-partition ranges so that a batch has at "
                                                    "least this many read partitions."),
        Option("maxRecordsPerPartition", Integer(min=1), doc="Split a topic-partition range into read partitions "
                                                             "of at most this many offsets."),
        Option("groupIdPrefix", String(), default="headrace-kafka-source",
               doc="Prefix of the consumer group id the client uses (no offsets are ever committed to it)."),
        Option("kafkaConsumer.pollTimeoutMs", Integer(min=1), default=120000,
               doc="Fail a read that gets no record for this long while offsets remain in its range."),
        Option("fetchOffset.numRetries", Integer(min=0), default=3, doc="Retries of a failed watermark lookup."),
        Option("fetchOffset.retryIntervalMs", Integer(min=0), default=10, doc="Wait between those retries (ms)."),
        Option("connectTimeout", Duration(min=0.1), default=30.0, doc=_CONNECT_TIMEOUT_DOC.format(what="the source's first metadata request")),
        Option("serviceCredential", String(), unsupported="Databricks Unity Catalog service credentials do not "
               "exist outside Databricks; pass kafka.sasl.* options instead"),
    ],
    rules=[
        exactly_one_of("subscribe", "subscribePattern", "assign"),
        _check_json_shapes,
        _check_min_max,
        _forbidden(_SOURCE_FORBIDDEN),
        _client_config("consumer"),
    ],
    passthrough=[PassThrough("kafka.", doc="Any other librdkafka consumer setting (kafka.security.protocol, "
                                           "kafka.sasl.password, ...); secrets are redacted.")],
)

SINK_OPTIONS = OptionSchema(
    [
        Option("kafka.bootstrap.servers", String(), required=True, doc=_BOOTSTRAP_DOC),
        Option("topic", String(), doc="Topic of every row; overrides the topic column. Without it each row "
                                      "needs a topic column."),
        Option(
            "transactional",
            Boolean(),
            default=False,
            doc="headrace extension: exactly-once. Each batch is written in one Kafka transaction, with a "
            "transactional id derived from the query id (a restarted query fences the old one), and the batch "
            "id is committed inside the transaction so a replayed batch is not written twice. Readers must use "
            "isolation.level=read_committed.",
        ),
        Option("transactionalIdPrefix", String(), default="headrace-",
               doc="headrace extension: prefix of the transactional id (prefix + query id)."),
        Option("flushTimeout", Duration(), default=300.0,
               doc="headrace extension: how long a batch waits for its deliveries before it fails."),
        Option("connectTimeout", Duration(min=0.1), default=30.0,
               doc=_CONNECT_TIMEOUT_DOC.format(what="the producer's, as the query starts; with transactional=true, "
                                                   "before the first transaction starts")),
    ],
    rules=[_forbidden(_SINK_FORBIDDEN), _client_config("producer")],
    passthrough=[PassThrough("kafka.", doc="Any other librdkafka producer setting (kafka.acks, kafka.linger.ms, "
                                           "kafka.compression.type, ...); secrets are redacted.")],
)

# Typed handles: options[HANDLE] is typed (string keys keep working).
ASSIGN: Option[Any] = SOURCE_OPTIONS["assign"]
CONNECT_TIMEOUT: Option[float] = SINK_OPTIONS["connectTimeout"]
ENDING_OFFSETS: Option[Any] = SOURCE_OPTIONS["endingOffsets"]
ENDING_OFFSETS_BY_TIMESTAMP: Option[Any] = SOURCE_OPTIONS["endingOffsetsByTimestamp"]
ENDING_TIMESTAMP: Option[Any] = SOURCE_OPTIONS["endingTimestamp"]
FAIL_ON_DATA_LOSS: Option[bool] = SOURCE_OPTIONS["failOnDataLoss"]
FETCH_OFFSET_NUM_RETRIES: Option[int] = SOURCE_OPTIONS["fetchOffset.numRetries"]
FETCH_OFFSET_RETRY_INTERVAL_MS: Option[int] = SOURCE_OPTIONS["fetchOffset.retryIntervalMs"]
FLUSH_TIMEOUT: Option[float] = SINK_OPTIONS["flushTimeout"]
INCLUDE_HEADERS: Option[bool] = SOURCE_OPTIONS["includeHeaders"]
KAFKA_BOOTSTRAP_SERVERS: Option[str] = SINK_OPTIONS["kafka.bootstrap.servers"]
KAFKA_CONSUMER_POLL_TIMEOUT_MS: Option[int] = SOURCE_OPTIONS["kafkaConsumer.pollTimeoutMs"]
MAX_OFFSETS_PER_TRIGGER: Option[int | None] = SOURCE_OPTIONS["maxOffsetsPerTrigger"]
MAX_RECORDS_PER_PARTITION: Option[int | None] = SOURCE_OPTIONS["maxRecordsPerPartition"]
MAX_TRIGGER_DELAY: Option[float] = SOURCE_OPTIONS["maxTriggerDelay"]
MIN_OFFSETS_PER_TRIGGER: Option[int | None] = SOURCE_OPTIONS["minOffsetsPerTrigger"]
MIN_PARTITIONS: Option[int | None] = SOURCE_OPTIONS["minPartitions"]
STARTING_OFFSETS: Option[Any] = SOURCE_OPTIONS["startingOffsets"]
STARTING_OFFSETS_BY_TIMESTAMP: Option[Any] = SOURCE_OPTIONS["startingOffsetsByTimestamp"]
STARTING_OFFSETS_BY_TIMESTAMP_STRATEGY: Option[str] = SOURCE_OPTIONS["startingOffsetsByTimestampStrategy"]
STARTING_TIMESTAMP: Option[Any] = SOURCE_OPTIONS["startingTimestamp"]
SUBSCRIBE: Option[list[str] | None] = SOURCE_OPTIONS["subscribe"]
SUBSCRIBE_PATTERN: Option[str | None] = SOURCE_OPTIONS["subscribePattern"]
TOPIC: Option[str | None] = SINK_OPTIONS["topic"]
TRANSACTIONAL: Option[bool] = SINK_OPTIONS["transactional"]
__all__ += ["ASSIGN", "CONNECT_TIMEOUT", "ENDING_OFFSETS", "ENDING_OFFSETS_BY_TIMESTAMP", "ENDING_TIMESTAMP", "FAIL_ON_DATA_LOSS", "FETCH_OFFSET_NUM_RETRIES", "FETCH_OFFSET_RETRY_INTERVAL_MS", "FLUSH_TIMEOUT", "INCLUDE_HEADERS", "KAFKA_BOOTSTRAP_SERVERS", "KAFKA_CONSUMER_POLL_TIMEOUT_MS", "MAX_OFFSETS_PER_TRIGGER", "MAX_RECORDS_PER_PARTITION", "MAX_TRIGGER_DELAY", "MIN_OFFSETS_PER_TRIGGER", "MIN_PARTITIONS", "STARTING_OFFSETS", "STARTING_OFFSETS_BY_TIMESTAMP", "STARTING_OFFSETS_BY_TIMESTAMP_STRATEGY", "STARTING_TIMESTAMP", "SUBSCRIBE", "SUBSCRIBE_PATTERN", "TOPIC", "TRANSACTIONAL"]
