"""The options of the ``delta`` source and sink, declared once (no client library imported).

Names are the Delta Lake / Databricks names, matched case-insensitively. Options marked
"headrace extension" have no counterpart in the reference.
"""

from __future__ import annotations

import datetime
from typing import Any

from headrace.errors import OptionProblem
from headrace.helpers.auto_cdc import AUTO_CDC_OPTIONS, AUTO_CDC_RULES
from headrace.options import (
    Boolean,
    Choice,
    Duration,
    Integer,
    OneOf,
    Option,
    Options,
    OptionSchema,
    PassThrough,
    Regex,
    Size,
    String,
    StringList,
    Timestamp,
    all_or_none,
    at_most_one_of,
    requires,
    rule,
)

__all__ = ["SINK_OPTIONS", "SOURCE_OPTIONS", "STORAGE_PREFIX"]

STORAGE_PREFIX = "storage."
"""Options starting with this prefix go to delta-rs as ``storage_options`` (prefix removed)."""

_STORAGE = PassThrough(
    STORAGE_PREFIX,
    doc="Passed to delta-rs as storage_options without the prefix, e.g. storage.AWS_ENDPOINT_URL, "
    "storage.AWS_REGION, storage.AWS_SECRET_ACCESS_KEY (headrace extension; keys with secret/token/"
    "password in their name are kept secret).",
)

_PATH = Option(
    "path",
    String(),
    required=True,
    doc="The table: a local folder, file:// or s3:// URI (load(path) / start(path) or this option).",
)

_UC = "Unity Catalog is Databricks-only; give the table's storage path with load(path)/start(path)"


@rule("withEventTimeOrder needs eventTimeColumn")
def _event_time_rule(opts: Options) -> list[OptionProblem]:
    if opts.is_set("withEventTimeOrder") and opts["withEventTimeOrder"] and not opts.is_set("eventTimeColumn"):
        return [
            OptionProblem(
                "withEventTimeOrder",
                "needs eventTimeColumn (the event-time column whose file statistics order the "
                "initial snapshot), e.g. .option('eventTimeColumn', 'ts')",
            )
        ]
    return []


SOURCE_OPTIONS = OptionSchema(
    [
        _PATH,
        Option(
            "maxFilesPerTrigger",
            Integer(min=1),
            default=1000,
            read_limit="max_files",
            doc="At most this many new files per micro-batch.",
        ),
        Option(
            "maxBytesPerTrigger",
            Size(),
            read_limit="max_bytes",
            doc="About this many bytes of new files per micro-batch (soft: a batch always takes at least "
            "one file). With maxFilesPerTrigger, the first limit reached ends the batch.",
        ),
        Option(
            "startingVersion",
            OneOf(Integer(min=0), Choice("latest")),
            doc="Start from the changes of this table version (no initial snapshot); 'latest' reads only "
            "changes committed after the stream starts. New checkpoints only.",
        ),
        Option(
            "startingTimestamp",
            Timestamp(),
            doc="Start from the first version committed at or after this time (no initial snapshot); a "
            "time before the first commit starts at the earliest version. New checkpoints only.",
        ),
        Option(
            "skipChangeCommits",
            Boolean(),
            default=False,
            doc="Skip commits that remove or rewrite data (DELETE, UPDATE, MERGE, OVERWRITE) entirely; "
            "only appends are streamed.",
        ),
        Option(
            "ignoreDeletes",
            Boolean(),
            default=False,
            doc="Skip commits that only remove files (e.g. deleting whole partitions).",
        ),
        Option(
            "ignoreChanges",
            Boolean(),
            default=False,
            doc="Legacy: re-emit the files that UPDATE/MERGE/DELETE rewrote (duplicates downstream); "
            "deletes are not propagated. Prefer skipChangeCommits.",
        ),
        Option(
            "withEventTimeOrder",
            Boolean(),
            default=False,
            doc="Process the initial snapshot in event-time ranges, oldest first, using the files' "
            "min/max statistics of eventTimeColumn. Cannot change while the snapshot is processed.",
        ),
        Option(
            "eventTimeColumn",
            String(),
            doc="The event-time column for withEventTimeOrder (headrace extension: Spark takes it from "
            "the watermark).",
        ),
        Option(
            "failOnDataLoss",
            Boolean(),
            default=True,
            doc="Fail when log entries or data files the stream needs are gone (log retention, VACUUM); "
            "false skips them and continues.",
        ),
        Option(
            "readChangeFeed",
            Boolean(),
            default=False,
            doc="Stream the change data feed: rows with _change_type, _commit_version, _commit_timestamp "
            "(the table needs delta.enableChangeDataFeed=true).",
        ),
        Option(
            "excludeRegex",
            Regex(),
            doc="Ignore data files whose path matches this regular expression.",
        ),
        Option(
            "schemaTrackingLocation",
            String(),
            unsupported="non-additive schema evolution tracking is not implemented; restart the stream to "
            "pick up a new schema",
        ),
        Option("tableName", String(), unsupported=_UC),
    ],
    rules=[
        at_most_one_of("startingVersion", "startingTimestamp"),
        at_most_one_of("skipChangeCommits", "ignoreChanges"),
        requires("eventTimeColumn", "withEventTimeOrder"),
        _event_time_rule,
    ],
    passthrough=[_STORAGE],
)

@rule("AUTO CDC needs keys")
def _cdc_keys(opts: Options) -> list[OptionProblem]:
    if (opts.is_set("sequenceBy") or opts.is_set("applyAsDeletes")) and not opts.is_set("keys"):
        return [OptionProblem("keys", "AUTO CDC (sequenceBy / applyAsDeletes) needs the target's key columns, e.g. keys=id")]
    if opts.is_set("storedAsScdType") and opts["storedAsScdType"] == "2" and not opts.is_set("sequenceBy"):
        return [OptionProblem("storedAsScdType", "2 needs sequenceBy (its values become __START_AT / __END_AT)")]
    return []


@rule("trackHistoryColumnList / trackHistoryExceptColumnList need storedAsScdType=2")
def _track_history_scd2(opts: Options) -> list[OptionProblem]:
    for name in ("trackHistoryColumnList", "trackHistoryExceptColumnList"):
        if opts.is_set(name) and opts["storedAsScdType"] != "2":
            return [OptionProblem(name, "applies only to SCD type 2 history: set storedAsScdType=2 (and sequenceBy)")]
    return []


SINK_OPTIONS = OptionSchema(
    [
        _PATH,
        Option(
            "partitionBy",
            StringList(),
            doc="Partition columns of a new table (partition_by(...) on the writer or this option).",
        ),
        Option("mergeSchema", Boolean(), default=False, doc="Add new columns of the batch to the table schema."),
        Option(
            "overwriteSchema",
            Boolean(),
            default=False,
            doc="Replace the table schema with the batch's (output mode complete only).",
        ),
        Option("userMetadata", String(), doc="Stored as commitInfo.userMetadata in every commit."),
        Option(
            "txnAppId",
            String(),
            doc="Application id of the idempotent write (default: the query id). Only with txnVersion.",
        ),
        Option(
            "txnVersion",
            Integer(min=0),
            doc="Version of the idempotent write (default: the batch id). Only with txnAppId.",
        ),
        Option(
            "targetFileSize",
            Size(),
            doc="Target size of the data files written (headrace extension; delta-rs default).",
        ),
        Option(
            "optimizeWrite",
            Boolean(),
            unsupported="optimized writes are a Databricks runtime feature; run OPTIMIZE (DeltaTable.optimize) instead",
        ),
        Option("tableName", String(), unsupported=_UC),
        Option("keys", StringList(min_items=1), doc="AUTO CDC: the key columns of the target table."),
        Option(
            "storedAsScdType",
            Choice("1", "2"),
            default="1",
            doc="AUTO CDC: 1 keeps the latest row per key (upserts and deletes); 2 keeps the history, one row "
            "per version with __START_AT / __END_AT (the sequenceBy values; __END_AT NULL for the current row).",
        ),
        *AUTO_CDC_OPTIONS,
        Option(
            "trackHistoryColumnList",
            StringList(min_items=1),
            doc="AUTO CDC, SCD type 2: only a change to one of these columns opens a new version; a change to "
            "other columns only updates the current version in place (Databricks' TRACK HISTORY ON columns).",
        ),
        Option(
            "trackHistoryExceptColumnList",
            StringList(min_items=1),
            doc="AUTO CDC, SCD type 2: a change to these columns only updates the current version in place; a "
            "change to any other column opens a new version (TRACK HISTORY ON * EXCEPT (columns)).",
        ),
        Option(
            "tombstoneRetention",
            Duration(min=0.0),
            default="2 days",
            doc="AUTO CDC, SCD type 1 with sequenceBy: how long a deleted key's sequence is kept so that an older "
            "event arriving after the delete does not bring the row back (headrace extension, the counterpart "
            "of pipelines.cdc.tombstoneGCThresholdInSeconds). 0 keeps no tombstones.",
        ),
    ],
    rules=[all_or_none("txnAppId", "txnVersion"), at_most_one_of("mergeSchema", "overwriteSchema"), *AUTO_CDC_RULES,
           _cdc_keys, at_most_one_of("trackHistoryColumnList", "trackHistoryExceptColumnList"), _track_history_scd2],
    passthrough=[_STORAGE],
)

# Typed handles: options[HANDLE] is typed (string keys keep working).
EVENT_TIME_COLUMN: Option[str | None] = SOURCE_OPTIONS["eventTimeColumn"]
EXCLUDE_REGEX: Option[str | None] = SOURCE_OPTIONS["excludeRegex"]
FAIL_ON_DATA_LOSS: Option[bool] = SOURCE_OPTIONS["failOnDataLoss"]
IGNORE_CHANGES: Option[bool] = SOURCE_OPTIONS["ignoreChanges"]
IGNORE_DELETES: Option[bool] = SOURCE_OPTIONS["ignoreDeletes"]
MAX_BYTES_PER_TRIGGER: Option[int | None] = SOURCE_OPTIONS["maxBytesPerTrigger"]
MAX_FILES_PER_TRIGGER: Option[int] = SOURCE_OPTIONS["maxFilesPerTrigger"]
MERGE_SCHEMA: Option[bool] = SINK_OPTIONS["mergeSchema"]
OVERWRITE_SCHEMA: Option[bool] = SINK_OPTIONS["overwriteSchema"]
PARTITION_BY: Option[list[str] | None] = SINK_OPTIONS["partitionBy"]
PATH: Option[str] = SINK_OPTIONS["path"]
READ_CHANGE_FEED: Option[bool] = SOURCE_OPTIONS["readChangeFeed"]
SKIP_CHANGE_COMMITS: Option[bool] = SOURCE_OPTIONS["skipChangeCommits"]
STARTING_TIMESTAMP: Option[datetime.datetime | None] = SOURCE_OPTIONS["startingTimestamp"]
STARTING_VERSION: Option[Any] = SOURCE_OPTIONS["startingVersion"]
TARGET_FILE_SIZE: Option[int | None] = SINK_OPTIONS["targetFileSize"]
TXN_APP_ID: Option[str | None] = SINK_OPTIONS["txnAppId"]
TXN_VERSION: Option[int | None] = SINK_OPTIONS["txnVersion"]
USER_METADATA: Option[str | None] = SINK_OPTIONS["userMetadata"]
WITH_EVENT_TIME_ORDER: Option[bool] = SOURCE_OPTIONS["withEventTimeOrder"]
__all__ += ["EVENT_TIME_COLUMN", "EXCLUDE_REGEX", "FAIL_ON_DATA_LOSS", "IGNORE_CHANGES", "IGNORE_DELETES", "MAX_BYTES_PER_TRIGGER", "MAX_FILES_PER_TRIGGER", "MERGE_SCHEMA", "OVERWRITE_SCHEMA", "PARTITION_BY", "PATH", "READ_CHANGE_FEED", "SKIP_CHANGE_COMMITS", "STARTING_TIMESTAMP", "STARTING_VERSION", "TARGET_FILE_SIZE", "TXN_APP_ID", "TXN_VERSION", "USER_METADATA", "WITH_EVENT_TIME_ORDER"]

# Typed handles: options[HANDLE] is typed (string keys keep working).
KEYS: Option[list[str] | None] = SINK_OPTIONS["keys"]
STORED_AS_SCD_TYPE: Option[str] = SINK_OPTIONS["storedAsScdType"]
TRACK_HISTORY_COLUMN_LIST: Option[list[str] | None] = SINK_OPTIONS["trackHistoryColumnList"]
TRACK_HISTORY_EXCEPT_COLUMN_LIST: Option[list[str] | None] = SINK_OPTIONS["trackHistoryExceptColumnList"]
TOMBSTONE_RETENTION: Option[float] = SINK_OPTIONS["tombstoneRetention"]
__all__ += ["KEYS", "STORED_AS_SCD_TYPE", "TOMBSTONE_RETENTION", "TRACK_HISTORY_COLUMN_LIST", "TRACK_HISTORY_EXCEPT_COLUMN_LIST"]
