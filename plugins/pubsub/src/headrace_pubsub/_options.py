"""The options of the ``pubsub`` source and sink, declared once.

Names are Databricks' (``subscriptionId``, ``maxRecordsPerFetch``, ``clientEmail``...), matched
case-insensitively by the core. Options marked "headrace extension" are not in the reference.
This module imports no client library: the registry loads it at start-up.
"""

from __future__ import annotations

from headrace.options import (
    Boolean,
    Duration,
    Integer,
    Option,
    OptionSchema,
    Size,
    String,
    all_or_none,
    at_most_one_of,
)

__all__ = ["CONNECTION_OPTIONS", "SINK_OPTIONS", "SOURCE_OPTIONS"]

# Resource ids: Pub/Sub wants 3-255 chars, starting with a letter (topics/subscriptions);
# project ids are 6-30 chars but the emulator accepts any, so only the charset is checked.
_RESOURCE_ID = String(
    pattern=r"[A-Za-z][A-Za-z0-9\-_.~+%]{2,254}",
    hint="a Pub/Sub id is 3-255 characters, starts with a letter, then letters, digits, - _ . ~ + %",
)
_PROJECT_ID = String(pattern=r"[A-Za-z0-9][A-Za-z0-9\-.:]*", hint="a Google Cloud project id such as my-project")

CONNECTION_OPTIONS: list[Option] = [
    Option("projectId", _PROJECT_ID, required=True, doc="The Google Cloud project of the topic (and subscription)."),
    Option("topicId", _RESOURCE_ID, required=True, doc="The topic id (not the full path)."),
    Option("clientEmail", String(), secret=True,
           doc="Service account e-mail; with clientId, privateKey and privateKeyId."),
    Option("clientId", String(), secret=True, doc="Service account client id."),
    Option("privateKey", String(), secret=True, doc="Service account private key (PEM)."),
    Option("privateKeyId", String(), secret=True, doc="Service account private key id."),
    Option("credentialsFile", String(),
           doc="Path of a service-account JSON key file (headrace extension). Without it and without "
               "clientEmail/..., application default credentials are used."),
    Option("serviceCredential", String(),
           unsupported="Databricks Unity Catalog service credentials exist only on Databricks; use "
                       "clientEmail/clientId/privateKey/privateKeyId, credentialsFile or application default credentials"),
    Option("endpoint", String(),
           doc="host:port of a Pub/Sub emulator (plaintext, no credentials), or https://host[:port] for "
               "another TLS endpoint (headrace extension). Default: $PUBSUB_EMULATOR_HOST if set, else Google's."),
]  # fmt: skip

_AUTH_RULES = [
    all_or_none("clientEmail", "clientId", "privateKey", "privateKeyId"),
    at_most_one_of("credentialsFile", "privateKey"),
]

SOURCE_OPTIONS = OptionSchema(
    [
        Option("subscriptionId", _RESOURCE_ID, required=True,
               doc="The subscription to read; created on topicId when it does not exist."),
        *CONNECTION_OPTIONS,
        Option("deleteSubscriptionOnStreamStop", Boolean(), default=False,
               doc="Delete the subscription when the query stops (not when it is killed)."),
        Option("maxBytesPerTrigger", Size(), read_limit="max_bytes",
               doc="Soft limit of payload bytes per micro-batch (a batch may go over it by one pull)."),
        Option("maxRecordsPerFetch", Integer(min=1), default=1000,
               doc="Messages each fetch partition pulls per micro-batch, at most."),
        Option("maxFetchPeriod", Duration(), default="10 seconds",
               doc="Longest time each fetch partition pulls before the micro-batch starts."),
        Option("numFetchPartitions", Integer(min=1, max=64), default=1,
               doc="Fetch partitions per micro-batch, each with three pulls in flight (one under "
                   "maxBytesPerTrigger); each stages its own part file of every segment (a read partition)."),
        Option("fetchIdleTimeout", Duration(), default="100 milliseconds",
               doc="A fetch ends once the subscription has delivered nothing for this long "
                   "(headrace extension; lower latency than always waiting maxFetchPeriod)."),
        Option("dedupWindow", Duration(), default="10 minutes",
               doc="Redelivered messages whose messageId was staged within this window are dropped "
                   "(and acked) (headrace extension)."),
        Option("ackDeadlineSeconds", Integer(min=1, max=600), default=60,
               doc="Ack deadline of a subscription headrace creates (headrace extension; Pub/Sub allows 10-600)."),
        Option("enableMessageOrdering", Boolean(), default=False,
               doc="Create the subscription with message ordering (headrace extension; only on creation)."),
    ],
    rules=_AUTH_RULES,
)  # fmt: skip

SINK_OPTIONS = OptionSchema(
    [
        *CONNECTION_OPTIONS,
        Option("batchMaxMessages", Integer(min=1, max=1000), default=100,
               doc="Messages per publish request, at most (client BatchSettings.max_messages)."),
        Option("batchMaxBytes", Size(), default=1_048_576,
               doc="Bytes per publish request, at most (client BatchSettings.max_bytes; server limit 10 MB)."),
        Option("batchMaxLatency", Duration(), default="10 milliseconds",
               doc="Longest a message waits for its publish request to fill (client BatchSettings.max_latency)."),
        Option("maxOutstandingMessages", Integer(min=1), default=10000,
               doc="Messages published but not yet confirmed, at most; publishing blocks beyond it."),
        Option("maxOutstandingBytes", Size(), default=104_857_600,
               doc="Bytes published but not yet confirmed, at most; publishing blocks beyond it."),
        Option("enableMessageOrdering", Boolean(),
               doc="Publish with ordering keys in order. Default: on when the data has an orderingKey column."),
        Option("publishTimeout", Duration(), default="120 seconds",
               doc="Longest a micro-batch waits for its publishes to be confirmed before it fails."),
    ],
    rules=_AUTH_RULES,
)  # fmt: skip

# Typed handles: options[HANDLE] is typed (string keys keep working).
ACK_DEADLINE_SECONDS: Option[int] = SOURCE_OPTIONS["ackDeadlineSeconds"]
BATCH_MAX_BYTES: Option[int] = SINK_OPTIONS["batchMaxBytes"]
BATCH_MAX_LATENCY: Option[float] = SINK_OPTIONS["batchMaxLatency"]
BATCH_MAX_MESSAGES: Option[int] = SINK_OPTIONS["batchMaxMessages"]
CLIENT_EMAIL: Option[str | None] = SINK_OPTIONS["clientEmail"]
CLIENT_ID: Option[str | None] = SINK_OPTIONS["clientId"]
CREDENTIALS_FILE: Option[str | None] = SINK_OPTIONS["credentialsFile"]
DEDUP_WINDOW: Option[float] = SOURCE_OPTIONS["dedupWindow"]
DELETE_SUBSCRIPTION_ON_STREAM_STOP: Option[bool] = SOURCE_OPTIONS["deleteSubscriptionOnStreamStop"]
ENABLE_MESSAGE_ORDERING: Option[bool | None] = SINK_OPTIONS["enableMessageOrdering"]
ENDPOINT: Option[str | None] = SINK_OPTIONS["endpoint"]
FETCH_IDLE_TIMEOUT: Option[float] = SOURCE_OPTIONS["fetchIdleTimeout"]
MAX_BYTES_PER_TRIGGER: Option[int | None] = SOURCE_OPTIONS["maxBytesPerTrigger"]
MAX_FETCH_PERIOD: Option[float] = SOURCE_OPTIONS["maxFetchPeriod"]
MAX_OUTSTANDING_BYTES: Option[int] = SINK_OPTIONS["maxOutstandingBytes"]
MAX_OUTSTANDING_MESSAGES: Option[int] = SINK_OPTIONS["maxOutstandingMessages"]
MAX_RECORDS_PER_FETCH: Option[int] = SOURCE_OPTIONS["maxRecordsPerFetch"]
NUM_FETCH_PARTITIONS: Option[int] = SOURCE_OPTIONS["numFetchPartitions"]
PRIVATE_KEY: Option[str | None] = SINK_OPTIONS["privateKey"]
PRIVATE_KEY_ID: Option[str | None] = SINK_OPTIONS["privateKeyId"]
PROJECT_ID: Option[str] = SINK_OPTIONS["projectId"]
PUBLISH_TIMEOUT: Option[float] = SINK_OPTIONS["publishTimeout"]
SUBSCRIPTION_ID: Option[str] = SOURCE_OPTIONS["subscriptionId"]
TOPIC_ID: Option[str] = SINK_OPTIONS["topicId"]
__all__ += ["ACK_DEADLINE_SECONDS", "BATCH_MAX_BYTES", "BATCH_MAX_LATENCY", "BATCH_MAX_MESSAGES", "CLIENT_EMAIL", "CLIENT_ID", "CREDENTIALS_FILE", "DEDUP_WINDOW", "DELETE_SUBSCRIPTION_ON_STREAM_STOP", "ENABLE_MESSAGE_ORDERING", "ENDPOINT", "FETCH_IDLE_TIMEOUT", "MAX_BYTES_PER_TRIGGER", "MAX_FETCH_PERIOD", "MAX_OUTSTANDING_BYTES", "MAX_OUTSTANDING_MESSAGES", "MAX_RECORDS_PER_FETCH", "NUM_FETCH_PARTITIONS", "PRIVATE_KEY", "PRIVATE_KEY_ID", "PROJECT_ID", "PUBLISH_TIMEOUT", "SUBSCRIPTION_ID", "TOPIC_ID"]
