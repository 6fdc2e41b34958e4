"""The options of the ``kinesis`` source and sink, declared once (no boto3 import here).

Names are the Databricks Kinesis connector's, matched case-insensitively. Options marked
"headrace extension" are not in the reference.
"""

from __future__ import annotations

import datetime

from headrace.options import (
    Boolean,
    Choice,
    Duration,
    Float,
    Integer,
    Option,
    OptionProblem,
    Options,
    OptionSchema,
    Rule,
    Size,
    String,
    Timestamp,
    all_or_none,
    exactly_one_of,
    requires,
)

__all__ = ["ARN_PATTERN", "COMMON_OPTIONS", "SINK_OPTIONS", "SOURCE_OPTIONS"]

ARN_PATTERN = r"arn:aws[a-zA-Z-]*:kinesis:[a-z0-9-]+:\d{12}:stream/[a-zA-Z0-9_.-]{1,128}"

_STREAM_AND_AUTH = [
    Option("streamName", String(pattern=r"[a-zA-Z0-9_.-]{1,128}", hint="1-128 of a-z A-Z 0-9 _ . -"),
           doc="The Kinesis data stream. Exactly one of streamName / streamARN."),
    Option("streamARN", String(pattern=ARN_PATTERN, hint="arn:aws:kinesis:REGION:ACCOUNT:stream/NAME"),
           doc="The stream's ARN; its region is used unless `region` is given."),
    Option("region", String(pattern=r"[a-z]{2}(-[a-z]+)+-\d", hint="an AWS region such as us-east-1"),
           doc="AWS region. Default: from streamARN, else the AWS SDK's (AWS_REGION, profile)."),
    Option("endpoint", String(pattern=r"https?://\S+", hint="a URL such as https://kinesis.us-east-1.amazonaws.com"),
           doc="Kinesis endpoint URL (VPC endpoints, kinesalite, LocalStack). Default: the region's."),
    Option("awsAccessKey", String(), secret=True, doc="Access key id; with awsSecretKey. Default: the AWS credential chain."),
    Option("awsSecretKey", String(), secret=True, doc="Secret access key; with awsAccessKey."),
    Option("awsSessionToken", String(), secret=True,
           doc="Session token of temporary credentials; needs awsAccessKey/awsSecretKey (headrace extension)."),
    Option("roleArn", String(pattern=r"arn:aws[a-zA-Z-]*:iam::\d{12}:role/\S+", hint="arn:aws:iam::ACCOUNT:role/NAME"),
           doc="IAM role to assume with STS (credentials refreshed before they expire).", aliases=("awsSTSRoleARN",)),
    Option("roleExternalId", String(), doc="External id passed to AssumeRole; needs roleArn."),
    Option("roleSessionName", String(pattern=r"[\w+=,.@-]{2,64}", hint="2-64 of letters, digits and +=,.@_-"),
           default="headrace-kinesis", doc="Session name of the assumed role.", aliases=("awsSTSSessionName",)),
    Option("stsEndpoint", String(pattern=r"https?://\S+", hint="a URL"),
           doc="STS endpoint URL used to assume roleArn. Default: the region's."),
    Option("awsUseInstanceProfile", Boolean(), default=True,
           doc="Accepted for compatibility: without keys or a role the AWS default credential chain is used."),
    Option("serviceCredential", String(),
           unsupported="Databricks Unity Catalog service credentials exist only on Databricks; use awsAccessKey/awsSecretKey, roleArn or the AWS credential chain"),
]


def _at_timestamp_needs_timestamp(opts: Options) -> list[OptionProblem]:
    pos = opts["initialPosition"]
    if pos == "at_timestamp" and not opts.is_set("initialTimestamp"):
        return [OptionProblem("initialPosition", "at_timestamp needs initialTimestamp (e.g. '2024-05-01T12:00:00Z' or epoch ms)")]
    if pos != "at_timestamp" and opts.is_set("initialTimestamp"):
        return [OptionProblem("initialTimestamp", f"only applies with initialPosition=at_timestamp (it is {pos!r})")]
    return []


_STREAM_RULES = [
    exactly_one_of("streamName", "streamARN"),
    all_or_none("awsAccessKey", "awsSecretKey"),
    requires("awsSessionToken", "awsAccessKey", "awsSecretKey"),
    requires("roleExternalId", "roleArn"),
    requires("stsEndpoint", "roleArn"),
]

COMMON_OPTIONS = OptionSchema(_STREAM_AND_AUTH, rules=_STREAM_RULES)

SOURCE_OPTIONS = OptionSchema(
    [
        *_STREAM_AND_AUTH,
        Option("initialPosition", Choice("latest", "trim_horizon", "earliest", "at_timestamp"), default="latest",
               doc="Where a new query starts: latest (records after the start), trim_horizon / earliest (the oldest "
                   "retained record), at_timestamp (records arriving at or after initialTimestamp). Only for a new checkpoint."),
        Option("initialTimestamp", Timestamp(),
               doc="With initialPosition=at_timestamp: ISO 8601 or epoch milliseconds."),
        Option("maxRecordsPerFetch", Integer(min=1, max=10000), default=10000, doc="Records asked for per GetRecords call."),
        Option("maxFetchRate", Float(min=0.001), default=1.0,
               doc="Read rate per shard, in MB/s, at most (a shard gives 2 MB/s shared by all its consumers)."),
        Option("minFetchPeriod", Duration(), default=0.4,
               doc="Shortest time between two GetRecords calls on one shard (AWS allows 5 per second per shard)."),
        Option("maxFetchDuration", Duration(min=0.001), default=10.0,
               doc="Longest time one trigger spends fetching new records before the batch is cut."),
        Option("fetchBufferSize", Size(), default=20 * 1024**3, read_limit="max_bytes",
               doc="Bytes fetched for one batch, at most (soft: a batch always advances)."),
        Option("shardFetchInterval", Duration(), default=1.0, doc="How often the shard list is polled for resharding."),
        Option("failOnDataLoss", Boolean(), default=True,
               doc="Fail when records the query needs were trimmed by retention (false: log, skip them, continue)."),
        Option("consumerMode", Choice("polling", "efo"), default="polling",
               doc="polling (GetRecords). efo (enhanced fan-out) is not implemented and rejected."),
        Option("consumerName", String(), unsupported="enhanced fan-out (consumerMode=efo) is not implemented; use consumerMode=polling"),
        Option("requireConsumerDeregistration", Boolean(),
               unsupported="enhanced fan-out (consumerMode=efo) is not implemented; use consumerMode=polling"),
        Option("shardsPerTask", Integer(min=1), default=1,
               doc="Shards read per partition (read task). headrace default 1: one partition per shard."),
        Option("coalesceThresholdBlockSize", Size(), unsupported="a Spark task-coalescing knob of Databricks; headrace reads one partition per shard group (shardsPerTask)"),
        Option("coalesceBinSize", Size(), unsupported="a Spark task-coalescing knob of Databricks; headrace reads one partition per shard group (shardsPerTask)"),
    ],
    rules=[*_STREAM_RULES, Rule("initialTimestamp with initialPosition=at_timestamp", _at_timestamp_needs_timestamp),
           Rule("consumerMode=efo is not implemented", lambda o: [OptionProblem(
               "consumerMode", "'efo' (enhanced fan-out, SubscribeToShard) is not implemented by headrace-kinesis; "
               "use consumerMode=polling (the default)")] if o["consumerMode"] == "efo" else [])],
)

SINK_OPTIONS = OptionSchema(
    [
        *_STREAM_AND_AUTH,
        Option("partitionKeyColumn", String(), default="partitionKey",
               doc="Column (string) holding each record's partition key (headrace extension; Databricks: `partitionKey`)."),
        Option("dataColumn", String(), default="data",
               doc="Column (binary or string) holding each record's data (headrace extension; Databricks: `data`)."),
        Option("explicitHashKeyColumn", String(),
               doc="Optional column (decimal string) with an explicit hash key per record (headrace extension)."),
        Option("maxRecordsPerRequest", Integer(min=1, max=500), default=500,
               doc="Records per PutRecords call (service limit 500; requests are also kept under 5 MiB)."),
        Option("maxRetries", Integer(min=0), default=10,
               doc="Retries of the failed records of a partial PutRecords failure (or a throttled call), with backoff."),
        Option("retryBackoff", Duration(min=0.0), default=0.1,
               doc="First backoff between retries; doubles each retry, with jitter, up to 5 seconds."),
    ],
    rules=[*_STREAM_RULES],
)

# Typed handles: options[HANDLE] is typed (string keys keep working).
AWS_ACCESS_KEY: Option[str | None] = COMMON_OPTIONS["awsAccessKey"]
AWS_SECRET_KEY: Option[str | None] = COMMON_OPTIONS["awsSecretKey"]
AWS_SESSION_TOKEN: Option[str | None] = COMMON_OPTIONS["awsSessionToken"]
DATA_COLUMN: Option[str] = SINK_OPTIONS["dataColumn"]
ENDPOINT: Option[str | None] = COMMON_OPTIONS["endpoint"]
EXPLICIT_HASH_KEY_COLUMN: Option[str | None] = SINK_OPTIONS["explicitHashKeyColumn"]
FAIL_ON_DATA_LOSS: Option[bool] = SOURCE_OPTIONS["failOnDataLoss"]
FETCH_BUFFER_SIZE: Option[int] = SOURCE_OPTIONS["fetchBufferSize"]
INITIAL_POSITION: Option[str] = SOURCE_OPTIONS["initialPosition"]
INITIAL_TIMESTAMP: Option[datetime.datetime | None] = SOURCE_OPTIONS["initialTimestamp"]
MAX_FETCH_DURATION: Option[float] = SOURCE_OPTIONS["maxFetchDuration"]
MAX_FETCH_RATE: Option[float] = SOURCE_OPTIONS["maxFetchRate"]
MAX_RECORDS_PER_FETCH: Option[int] = SOURCE_OPTIONS["maxRecordsPerFetch"]
MAX_RECORDS_PER_REQUEST: Option[int] = SINK_OPTIONS["maxRecordsPerRequest"]
MAX_RETRIES: Option[int] = SINK_OPTIONS["maxRetries"]
MIN_FETCH_PERIOD: Option[float] = SOURCE_OPTIONS["minFetchPeriod"]
PARTITION_KEY_COLUMN: Option[str] = SINK_OPTIONS["partitionKeyColumn"]
REGION: Option[str | None] = COMMON_OPTIONS["region"]
RETRY_BACKOFF: Option[float] = SINK_OPTIONS["retryBackoff"]
ROLE_ARN: Option[str | None] = COMMON_OPTIONS["roleArn"]
ROLE_EXTERNAL_ID: Option[str | None] = COMMON_OPTIONS["roleExternalId"]
ROLE_SESSION_NAME: Option[str] = COMMON_OPTIONS["roleSessionName"]
SHARDS_PER_TASK: Option[int] = SOURCE_OPTIONS["shardsPerTask"]
SHARD_FETCH_INTERVAL: Option[float] = SOURCE_OPTIONS["shardFetchInterval"]
STREAM_ARN: Option[str | None] = COMMON_OPTIONS["streamARN"]
STREAM_NAME: Option[str | None] = COMMON_OPTIONS["streamName"]
STS_ENDPOINT: Option[str | None] = COMMON_OPTIONS["stsEndpoint"]
__all__ += ["AWS_ACCESS_KEY", "AWS_SECRET_KEY", "AWS_SESSION_TOKEN", "DATA_COLUMN", "ENDPOINT", "EXPLICIT_HASH_KEY_COLUMN", "FAIL_ON_DATA_LOSS", "FETCH_BUFFER_SIZE", "INITIAL_POSITION", "INITIAL_TIMESTAMP", "MAX_FETCH_DURATION", "MAX_FETCH_RATE", "MAX_RECORDS_PER_FETCH", "MAX_RECORDS_PER_REQUEST", "MAX_RETRIES", "MIN_FETCH_PERIOD", "PARTITION_KEY_COLUMN", "REGION", "RETRY_BACKOFF", "ROLE_ARN", "ROLE_EXTERNAL_ID", "ROLE_SESSION_NAME", "SHARDS_PER_TASK", "SHARD_FETCH_INTERVAL", "STREAM_ARN", "STREAM_NAME", "STS_ENDPOINT"]
