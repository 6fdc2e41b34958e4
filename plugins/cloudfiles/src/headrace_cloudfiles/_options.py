"""The options of the ``cloudFiles`` source, declared once, with Databricks Auto Loader's names.

Imports nothing but :mod:`headrace.options` (no client library, no I/O): the registry loads it
at start-up to validate options and to render ``headrace describe cloudFiles``.
"""

from __future__ import annotations

import datetime
from typing import Any

from headrace.errors import OptionProblem
from headrace.helpers.badrecords import BAD_RECORD_OPTIONS
from headrace.options import (
    Boolean,
    Choice,
    Duration,
    Integer,
    Option,
    Options,
    OptionSchema,
    Size,
    String,
    StringList,
    Timestamp,
    rule,
)

__all__ = ["FORMATS", "SOURCE_OPTIONS", "UNSUPPORTED_FORMATS"]

FORMATS = ("json", "csv", "parquet", "text", "binaryFile", "avro")
"""File formats read by this plugin (``cloudFiles.format``)."""

UNSUPPORTED_FORMATS = ("orc", "xml")

_CLOUD_QUEUE = (
    "sets up {what} for Databricks' file notification mode on {cloud}; headrace uses "
    "cloudFiles.useNotifications (watchdog) on local folders and directory listing on S3"
)


def _queue(name: str, what: str, cloud: str) -> Option:
    return Option(name, String(), unsupported=_CLOUD_QUEUE.format(what=what, cloud=cloud))


@rule("cloudFiles.cleanSource.moveDestination is required when cloudFiles.cleanSource is MOVE")
def _move_needs_destination(opts: Options) -> list[OptionProblem]:
    mode = opts["cloudFiles.cleanSource"]
    if mode == "MOVE" and not opts["cloudFiles.cleanSource.moveDestination"]:
        return [OptionProblem("cloudFiles.cleanSource.moveDestination",
                              "is required with cloudFiles.cleanSource=MOVE: give the folder processed files move to")]  # fmt: skip
    if mode != "MOVE" and opts.is_set("cloudFiles.cleanSource.moveDestination"):
        return [OptionProblem("cloudFiles.cleanSource.moveDestination",
                              f"only applies with cloudFiles.cleanSource=MOVE (it is {mode}); remove it or set MOVE")]  # fmt: skip
    return []


@rule("modifiedAfter must be earlier than modifiedBefore")
def _modified_window(opts: Options) -> list[OptionProblem]:
    a, b = opts["modifiedAfter"], opts["modifiedBefore"]
    if a is not None and b is not None and a >= b:
        return [OptionProblem("modifiedAfter / modifiedBefore",
                              f"modifiedAfter ({a.isoformat()}) must be earlier than modifiedBefore ({b.isoformat()})")]  # fmt: skip
    return []


@rule("cloudFiles.useIncrementalListing only applies without cloudFiles.useNotifications")
def _notifications_or_listing(opts: Options) -> list[OptionProblem]:
    if opts["cloudFiles.useNotifications"] and opts.is_set("cloudFiles.useIncrementalListing"):
        return [OptionProblem("cloudFiles.useIncrementalListing",
                              "applies to directory listing mode only; remove it or set cloudFiles.useNotifications=false")]  # fmt: skip
    return []


@rule("cloudFiles.format must be one headrace reads")
def _format_supported(opts: Options) -> list[OptionProblem]:
    fmt = str(opts["cloudFiles.format"] or "")
    if fmt.lower() in UNSUPPORTED_FORMATS:
        return [OptionProblem("cloudFiles.format",
                              f"{fmt!r} is not supported by headrace yet; supported: {', '.join(FORMATS)}")]  # fmt: skip
    return []


class _Glob(String):
    """A file-name glob, compiled when the options are parsed so that a bad one (``*.{json``)
    is an options error at ``load()``, not a ``re.error`` at ``start()``."""

    label = "glob"

    def parse(self, value: Any) -> Any:
        import re

        from headrace_cloudfiles.source import glob_regex

        text = super().parse(value)
        try:
            glob_regex(text)
        except (re.error, RecursionError, OverflowError) as e:
            raise ValueError(f"{text[:60]!r} is not a valid glob ({e}); e.g. '*.json' or '*.{{csv,tsv}}'") from None
        return text


SOURCE_OPTIONS = OptionSchema(
    [
        # ---------------------------------------------------------------- where and what
        Option("path", String(), required=True,
               doc="The folder to ingest: a local directory (or file:// URL) or s3://bucket/prefix. Given by load(path)."),
        Option("cloudFiles.format", Choice(*FORMATS, *UNSUPPORTED_FORMATS), required=True,
               doc="File format: json (newline-delimited), csv, parquet, text, binaryFile, avro (needs fastavro)."),
        Option("pathGlobFilter", _Glob(), aliases=("fileNamePattern",),
               doc="Only files whose name matches this glob (e.g. '*.json', '*.{csv,tsv}')."),
        Option("recursiveFileLookup", Boolean(), default=False,
               doc="Nested folders are always listed (as in Auto Loader); true also turns off partition-column inference from key=value folders."),
        Option("modifiedAfter", Timestamp(), doc="Only files modified after this time (ISO 8601 or epoch ms)."),
        Option("modifiedBefore", Timestamp(), doc="Only files modified before this time (ISO 8601 or epoch ms)."),
        Option("cloudFiles.includeExistingFiles", Boolean(), default=True,
               doc="Ingest the files already present when the stream first starts; false: only files that arrive later."),
        Option("cloudFiles.allowOverwrites", Boolean(), default=False,
               doc="Re-ingest a file whose content changed (new modification time or size) after it was ingested."),
        Option("cloudFiles.maxFileAge", Duration(min=0.0),
               doc="Ignore files older than this, and forget (from the dedup index) files older than this (default: keep all)."),
        Option("ignoreCorruptFiles", Boolean(), default=False,
               doc="Skip a file that cannot be parsed (logging its path) instead of failing the batch."),
        Option("ignoreMissingFiles", Boolean(), default=False,
               doc="Skip a file deleted between listing and reading instead of failing the batch."),
        # ---------------------------------------------------------------- rate limits
        Option("cloudFiles.maxFilesPerTrigger", Integer(min=1), default=1000, aliases=("maxFilesPerTrigger",), read_limit="max_files",
               doc="At most this many new files per micro-batch."),
        Option("cloudFiles.maxBytesPerTrigger", Size(), aliases=("maxBytesPerTrigger",), read_limit="max_bytes",
               doc="Soft cap on the bytes of new files per micro-batch (a batch always takes at least one file)."),
        # ---------------------------------------------------------------- discovery
        Option("cloudFiles.useIncrementalListing", Choice("auto", "true", "false"), default="auto",
               doc="List only paths after the last one seen (names that sort lexically). auto: full listings until one shows new names sorting after those seen, then incremental with a full listing after every 7 incremental ones; full listings for good once a new file sorts before the last seen."),
        Option("cloudFiles.useNotifications", Boolean(), default=False,
               doc="File-event mode: watch the (local) folder with watchdog instead of listing it each trigger; a full listing runs at start and every backfillInterval."),
        Option("cloudFiles.backfillInterval", Duration(min=0.0),
               doc="Run a full listing at this interval (file-event and incremental-listing modes) so no file is missed."),
        # ---------------------------------------------------------------- schema
        Option("cloudFiles.schemaLocation", String(),
               doc="Folder where the inferred schema and its versions are stored (_schemas/<n>). Required unless a schema is given with .schema() or the format has a fixed schema (text, binaryFile)."),
        Option("cloudFiles.inferColumnTypes", Boolean(), default=False,
               doc="Infer column types for json and csv; false: every column is a string (as in Auto Loader)."),
        Option("cloudFiles.schemaHints", String(),
               doc="Column types that override (or add to) the inferred schema, as DDL: 'a INT, b STRING'."),
        Option("cloudFiles.schemaEvolutionMode", Choice("addNewColumns", "rescue", "failOnNewColumns", "none"),
               doc="On a new column: addNewColumns (default without .schema(): fail the batch naming it, store the evolved schema, a restart continues with it), rescue (keep it in the rescued data column), failOnNewColumns (fail until the schema is changed), none (default with .schema(): ignore it)."),
        Option("rescuedDataColumn", String(), default="_rescued_data",
               doc="Column that gets, as JSON, the fields that do not fit the schema (new columns in rescue mode, type mismatches, malformed records) with _file_path. Present unless schemaEvolutionMode is none and this option is not given."),
        Option("cloudFiles.partitionColumns", StringList(),
               doc="Hive-style key=value folder names that become (string) columns; default: inferred from the folders of the first files. Give '' for none."),
        Option("cloudFiles.schemaInference.sampleSize.numFiles", Integer(min=1), default=1000,
               aliases=("spark.databricks.cloudFiles.schemaInference.sampleSize.numFiles",),
               doc="Files sampled to infer the schema on first start (the first ones listed)."),
        Option("cloudFiles.schemaInference.sampleSize.numBytes", Size(), default=50 * 1024**3,
               aliases=("spark.databricks.cloudFiles.schemaInference.sampleSize.numBytes",),
               doc="Bytes read to infer the schema on first start, summed over the sampled files (each counts at most schemaInference.bytesPerFile, except multiLine json)."),
        Option("cloudFiles.schemaInference.bytesPerFile", Size(), default=64 * 1024,
               doc="headrace extension: schema inference reads only this prefix of each sampled json-lines, csv or avro file (cut at a line end; parquet: the footer only); columns first appearing later are handled by schema evolution / rescue."),
        # ---------------------------------------------------------------- clean-up
        Option("cloudFiles.cleanSource", Choice("OFF", "MOVE", "DELETE"), default="OFF",
               doc="What happens to a file once its batch is committed: OFF (nothing), MOVE (to moveDestination), DELETE."),
        Option("cloudFiles.cleanSource.retentionDuration", Duration(min=0.0), default=30 * 86400.0,
               doc="How long after its batch is committed a file is moved or deleted."),
        Option("cloudFiles.cleanSource.moveDestination", String(),
               doc="Folder (same file system or bucket as path, not inside it) that processed files move to, keeping their relative path."),
        # ---------------------------------------------------------------- format options
        Option("multiLine", Boolean(), default=False,
               doc="json: each file is one JSON document (an object or an array of objects) instead of one object per line."),
        Option("header", Boolean(), default=False,
               doc="csv: the first line holds the column names (else _c0, _c1, ...)."),
        Option("sep", String(), default=",", aliases=("delimiter",), doc="csv: the field separator (one character)."),
        Option("quote", String(), default='"', doc="csv: the quote character ('' for none)."),
        Option("escape", String(), default="\\", doc="csv: the escape character inside quoted values."),
        Option("nullValue", String(), default="", doc="csv: the text that stands for null."),
        Option("wholeText", Boolean(), default=False, doc="text: one row per file instead of one per line."),
        Option("encoding", Choice("UTF-8", "utf8"), default="UTF-8", doc="Character set of json, csv and text files (UTF-8 only)."),
        # ---------------------------------------------------------------- S3 (headrace extension)
        Option("cloudFiles.region", String(),
               doc="AWS region of the S3 bucket (default: the AWS environment)."),
        Option("s3.endpointUrl", String(),
               doc="headrace extension: S3 endpoint URL (MinIO, moto, ...); default: AWS_ENDPOINT_URL or AWS."),
        Option("s3.accessKeyId", String(), secret=True,
               doc="headrace extension: AWS access key id; default: the AWS credential chain."),
        Option("s3.secretAccessKey", String(), secret=True,
               doc="headrace extension: AWS secret access key; default: the AWS credential chain."),
        Option("s3.sessionToken", String(), secret=True, doc="headrace extension: AWS session token."),
        Option("s3.addressingStyle", Choice("auto", "path", "virtual"), default="auto",
               doc="headrace extension: S3 addressing style (path for most S3-compatible servers)."),
        # ---------------------------------------------------------------- accepted, nothing to do
        Option("cloudFiles.validateOptions", Boolean(), default=True,
               doc="Accepted for compatibility: headrace always validates options before any I/O."),
        # ---------------------------------------------------------------- not supported
        Option("cloudFiles.useStrictGlobber", Boolean(),
               unsupported="glob patterns in the load path are not implemented; load the folder and use pathGlobFilter"),
        Option("cloudFiles.readerCaseSensitive", Boolean(),
               unsupported="column names are always matched case-sensitively by headrace"),
        Option("cloudFiles.useManagedFileEvents", Boolean(),
               unsupported="managed file events need Unity Catalog external locations (Databricks only); use cloudFiles.useNotifications on a local folder"),
        Option("databricks.serviceCredential", String(),
               unsupported="Unity Catalog service credentials exist only on Databricks; give S3 credentials with s3.accessKeyId / s3.secretAccessKey"),
        _queue("cloudFiles.queueUrl", "an SQS queue", "AWS"),
        _queue("cloudFiles.roleArn", "the IAM role", "AWS"),
        _queue("cloudFiles.roleExternalId", "the IAM role", "AWS"),
        _queue("cloudFiles.roleSessionName", "the IAM role session", "AWS"),
        _queue("cloudFiles.stsEndpoint", "the STS endpoint", "AWS"),
        _queue("cloudFiles.awsAccessKey", "SNS/SQS credentials", "AWS"),
        _queue("cloudFiles.awsSecretKey", "SNS/SQS credentials", "AWS"),
        _queue("cloudFiles.resourceTag", "tags of the queue resources", "AWS, Azure and GCP"),
        _queue("cloudFiles.fetchParallelism", "queue fetch threads", "AWS, Azure and GCP"),
        _queue("cloudFiles.pathRewrites", "path rewrites of queue events", "AWS"),
        _queue("cloudFiles.connectionString", "a storage queue", "Azure"),
        _queue("cloudFiles.resourceGroup", "an Event Grid subscription", "Azure"),
        _queue("cloudFiles.subscriptionId", "an Event Grid subscription", "Azure"),
        _queue("cloudFiles.tenantId", "a service principal", "Azure"),
        _queue("cloudFiles.clientId", "a service principal", "Azure"),
        _queue("cloudFiles.clientSecret", "a service principal", "Azure"),
        _queue("cloudFiles.queueName", "a storage queue", "Azure"),
        _queue("cloudFiles.projectId", "a Pub/Sub subscription", "GCP"),
        _queue("cloudFiles.client", "a service account", "GCP"),
        _queue("cloudFiles.clientEmail", "a service account", "GCP"),
        _queue("cloudFiles.privateKey", "a service account", "GCP"),
        _queue("cloudFiles.privateKeyId", "a service account", "GCP"),
        _queue("cloudFiles.subscription", "a Pub/Sub subscription", "GCP"),
    ],
    rules=[
        _move_needs_destination,
        _modified_window,
        _format_supported,
        _notifications_or_listing,
    ],
)

# one bad-record policy for every parsing source (headrace.badrecords)
SOURCE_OPTIONS = SOURCE_OPTIONS.extended(BAD_RECORD_OPTIONS.options, rules=BAD_RECORD_OPTIONS.rules)
# Typed handles: options[HANDLE] is typed (string keys keep working).
CLOUD_FILES_ALLOW_OVERWRITES: Option[bool] = SOURCE_OPTIONS["cloudFiles.allowOverwrites"]
CLOUD_FILES_BACKFILL_INTERVAL: Option[float | None] = SOURCE_OPTIONS["cloudFiles.backfillInterval"]
CLOUD_FILES_CLEAN_SOURCE: Option[str] = SOURCE_OPTIONS["cloudFiles.cleanSource"]
CLOUD_FILES_CLEAN_SOURCE_MOVE_DESTINATION: Option[str | None] = SOURCE_OPTIONS["cloudFiles.cleanSource.moveDestination"]
CLOUD_FILES_CLEAN_SOURCE_RETENTION_DURATION: Option[float] = SOURCE_OPTIONS["cloudFiles.cleanSource.retentionDuration"]
CLOUD_FILES_FORMAT: Option[str] = SOURCE_OPTIONS["cloudFiles.format"]
CLOUD_FILES_INCLUDE_EXISTING_FILES: Option[bool] = SOURCE_OPTIONS["cloudFiles.includeExistingFiles"]
CLOUD_FILES_INFER_COLUMN_TYPES: Option[bool] = SOURCE_OPTIONS["cloudFiles.inferColumnTypes"]
CLOUD_FILES_MAX_BYTES_PER_TRIGGER: Option[int | None] = SOURCE_OPTIONS["cloudFiles.maxBytesPerTrigger"]
CLOUD_FILES_MAX_FILES_PER_TRIGGER: Option[int] = SOURCE_OPTIONS["cloudFiles.maxFilesPerTrigger"]
CLOUD_FILES_MAX_FILE_AGE: Option[float | None] = SOURCE_OPTIONS["cloudFiles.maxFileAge"]
CLOUD_FILES_PARTITION_COLUMNS: Option[list[str] | None] = SOURCE_OPTIONS["cloudFiles.partitionColumns"]
CLOUD_FILES_REGION: Option[str | None] = SOURCE_OPTIONS["cloudFiles.region"]
CLOUD_FILES_SCHEMA_EVOLUTION_MODE: Option[str | None] = SOURCE_OPTIONS["cloudFiles.schemaEvolutionMode"]
CLOUD_FILES_SCHEMA_HINTS: Option[str | None] = SOURCE_OPTIONS["cloudFiles.schemaHints"]
CLOUD_FILES_SCHEMA_INFERENCE_BYTES_PER_FILE: Option[int] = SOURCE_OPTIONS["cloudFiles.schemaInference.bytesPerFile"]
CLOUD_FILES_SCHEMA_INFERENCE_SAMPLE_SIZE_NUM_BYTES: Option[int] = SOURCE_OPTIONS["cloudFiles.schemaInference.sampleSize.numBytes"]
CLOUD_FILES_SCHEMA_INFERENCE_SAMPLE_SIZE_NUM_FILES: Option[int] = SOURCE_OPTIONS["cloudFiles.schemaInference.sampleSize.numFiles"]
CLOUD_FILES_SCHEMA_LOCATION: Option[str | None] = SOURCE_OPTIONS["cloudFiles.schemaLocation"]
CLOUD_FILES_USE_INCREMENTAL_LISTING: Option[str] = SOURCE_OPTIONS["cloudFiles.useIncrementalListing"]
CLOUD_FILES_USE_NOTIFICATIONS: Option[bool] = SOURCE_OPTIONS["cloudFiles.useNotifications"]
ESCAPE: Option[str] = SOURCE_OPTIONS["escape"]
HEADER: Option[bool] = SOURCE_OPTIONS["header"]
IGNORE_CORRUPT_FILES: Option[bool] = SOURCE_OPTIONS["ignoreCorruptFiles"]
IGNORE_MISSING_FILES: Option[bool] = SOURCE_OPTIONS["ignoreMissingFiles"]
MODIFIED_AFTER: Option[datetime.datetime | None] = SOURCE_OPTIONS["modifiedAfter"]
MODIFIED_BEFORE: Option[datetime.datetime | None] = SOURCE_OPTIONS["modifiedBefore"]
MULTI_LINE: Option[bool] = SOURCE_OPTIONS["multiLine"]
NULL_VALUE: Option[str] = SOURCE_OPTIONS["nullValue"]
PATH: Option[str] = SOURCE_OPTIONS["path"]
PATH_GLOB_FILTER: Option[str | None] = SOURCE_OPTIONS["pathGlobFilter"]
QUOTE: Option[str] = SOURCE_OPTIONS["quote"]
RECURSIVE_FILE_LOOKUP: Option[bool] = SOURCE_OPTIONS["recursiveFileLookup"]
RESCUED_DATA_COLUMN: Option[str] = SOURCE_OPTIONS["rescuedDataColumn"]
S3_ADDRESSING_STYLE: Option[str] = SOURCE_OPTIONS["s3.addressingStyle"]
S3_ENDPOINT_URL: Option[str | None] = SOURCE_OPTIONS["s3.endpointUrl"]
SEP: Option[str] = SOURCE_OPTIONS["sep"]
WHOLE_TEXT: Option[bool] = SOURCE_OPTIONS["wholeText"]
__all__ += ["CLOUD_FILES_ALLOW_OVERWRITES", "CLOUD_FILES_BACKFILL_INTERVAL", "CLOUD_FILES_CLEAN_SOURCE", "CLOUD_FILES_CLEAN_SOURCE_MOVE_DESTINATION", "CLOUD_FILES_CLEAN_SOURCE_RETENTION_DURATION", "CLOUD_FILES_FORMAT", "CLOUD_FILES_INCLUDE_EXISTING_FILES", "CLOUD_FILES_INFER_COLUMN_TYPES", "CLOUD_FILES_MAX_BYTES_PER_TRIGGER", "CLOUD_FILES_MAX_FILES_PER_TRIGGER", "CLOUD_FILES_MAX_FILE_AGE", "CLOUD_FILES_PARTITION_COLUMNS", "CLOUD_FILES_REGION", "CLOUD_FILES_SCHEMA_EVOLUTION_MODE", "CLOUD_FILES_SCHEMA_HINTS", "CLOUD_FILES_SCHEMA_INFERENCE_BYTES_PER_FILE", "CLOUD_FILES_SCHEMA_INFERENCE_SAMPLE_SIZE_NUM_BYTES", "CLOUD_FILES_SCHEMA_INFERENCE_SAMPLE_SIZE_NUM_FILES", "CLOUD_FILES_SCHEMA_LOCATION", "CLOUD_FILES_USE_INCREMENTAL_LISTING", "CLOUD_FILES_USE_NOTIFICATIONS", "ESCAPE", "HEADER", "IGNORE_CORRUPT_FILES", "IGNORE_MISSING_FILES", "MODIFIED_AFTER", "MODIFIED_BEFORE", "MULTI_LINE", "NULL_VALUE", "PATH", "PATH_GLOB_FILTER", "QUOTE", "RECURSIVE_FILE_LOOKUP", "RESCUED_DATA_COLUMN", "S3_ADDRESSING_STYLE", "S3_ENDPOINT_URL", "SEP", "WHOLE_TEXT"]
