"""``KinesisSink``: PutRecords in batches within the service limits; at-least-once.

``write`` sends the rows as they come, in PutRecords calls of at most ``maxRecordsPerRequest``
(<= 500) records and 5 MiB; of a partial failure only the failed records are sent again, with
exponential backoff and jitter, up to ``maxRetries`` times. ``write`` returns only when every
record of the batch has been accepted, so a committed batch is fully in the stream. Records of a
batch that crashed before its commit are sent again when the batch is replayed: duplicates are
possible (at-least-once, as Spark's Kinesis sink); Kinesis has no transactional put.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from headrace.errors import HeadraceError
from headrace.helpers.retry import backoff
from headrace.options import Options
from headrace.protocols import CommitMessage, Sink, SinkContext
from headrace_kinesis._client import StreamRef, make_client, stream_ref, with_backoff
from headrace_kinesis._options import (  # typed option handles
    DATA_COLUMN,
    EXPLICIT_HASH_KEY_COLUMN,
    MAX_RECORDS_PER_REQUEST,
    MAX_RETRIES,
    PARTITION_KEY_COLUMN,
    RETRY_BACKOFF,
)

__all__ = ["KinesisSink", "Written"]

log = logging.getLogger(__name__)

MAX_RECORD_BYTES = 1024 * 1024  # data + partition key
MAX_REQUEST_BYTES = 5 * 1024 * 1024
MAX_KEY_CHARS = 256


@dataclass(frozen=True)
class Written(CommitMessage):
    """What one ``write`` sent: record count and PutRecords calls (picklable)."""

    records: int
    requests: int
    retried: int


class KinesisSink(Sink):
    """Writes rows to a Kinesis stream: a partition key column, a data column (binary or
    string), optionally an explicit hash key column."""

    idempotent_commit = False
    output_modes = ("append", "update")

    def __init__(self, options: Options, context: SinkContext) -> None:
        """Called once per query run (and per Spark task); cheap, no I/O."""
        super().__init__(options, context)
        self.ref: StreamRef = stream_ref(options)
        self.key_col: str = options[PARTITION_KEY_COLUMN]
        self.data_col: str = options[DATA_COLUMN]
        self.hash_col: str | None = options[EXPLICIT_HASH_KEY_COLUMN]
        self.per_request: int = options[MAX_RECORDS_PER_REQUEST]
        self.max_retries: int = options[MAX_RETRIES]
        self.backoff: float = options[RETRY_BACKOFF]
        self._client: Any = None
        self._stats = {"records": 0, "requests": 0, "retriedRecords": 0}

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_client": None}

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = make_client(self.options)
        return self._client

    def _columns(self, batch: pa.RecordBatch) -> tuple[list[Any], list[Any], list[Any] | None]:
        names = batch.schema.names
        missing = [c for c in (self.key_col, self.data_col, self.hash_col) if c and c not in names]
        if missing:
            raise HeadraceError(
                f"kinesis sink: the data has no column {', '.join(repr(m) for m in missing)} (columns: {', '.join(names)}); "
                "fix: add them with map_batches, or set partitionKeyColumn / dataColumn / explicitHashKeyColumn"
            )
        dtype = batch.schema.field(self.data_col).type
        if not (pa.types.is_binary(dtype) or pa.types.is_large_binary(dtype) or pa.types.is_string(dtype)
                or pa.types.is_large_string(dtype)):  # fmt: skip
            raise HeadraceError(
                f"kinesis sink: column {self.data_col!r} is {dtype}; it must be binary or string; fix: cast or serialise it "
                "(e.g. pyarrow.compute.cast(col, pa.string()) or a JSON encoding) in map_batches"
            )
        keys = batch.column(self.key_col).cast(pa.string()).to_pylist()
        data = batch.column(self.data_col).to_pylist()
        hashes = batch.column(self.hash_col).cast(pa.string()).to_pylist() if self.hash_col else None
        return keys, data, hashes

    def _entries(self, batch: pa.RecordBatch, row0: int) -> Iterator[tuple[dict[str, Any], int]]:
        keys, data, hashes = self._columns(batch)
        for i, (k, d) in enumerate(zip(keys, data, strict=True)):
            if k is None or k == "" or len(k) > MAX_KEY_CHARS:
                raise HeadraceError(
                    f"kinesis sink: row {row0 + i} has partition key {k!r}; it must be 1-{MAX_KEY_CHARS} characters; "
                    f"fix: fill column {self.key_col!r}"
                )
            if d is None:
                raise HeadraceError(f"kinesis sink: row {row0 + i} has no data (null in column {self.data_col!r}); fix: drop or fill it")
            if isinstance(d, str):
                d = d.encode()
            size = len(d) + len(k.encode())
            if size > MAX_RECORD_BYTES:
                raise HeadraceError(
                    f"kinesis sink: row {row0 + i} is {size} bytes (data + partition key); Kinesis takes at most "
                    f"{MAX_RECORD_BYTES}; fix: split or compress the data"
                )
            entry: dict[str, Any] = {"Data": d, "PartitionKey": k}
            if hashes is not None and hashes[i] is not None:
                entry["ExplicitHashKey"] = hashes[i]
            yield entry, size

    def write(self, batch_id: int, data: Iterator[pa.RecordBatch]) -> CommitMessage:
        """Send every row of the batch; return when all are accepted.

        Called once per batch (per task under Spark), maybe in a worker thread. Rows become
        visible in the stream at once (at-least-once sink). The returned message is picklable.
        """
        pending: list[dict[str, Any]] = []
        pending_bytes = 0
        sent = requests = retried = 0
        row = 0
        for batch in data:
            for entry, size in self._entries(batch, row):
                if pending and (len(pending) >= self.per_request or pending_bytes + size > MAX_REQUEST_BYTES):
                    r, q = self._put(pending)
                    requests += q
                    retried += r
                    sent += len(pending)
                    pending, pending_bytes = [], 0
                pending.append(entry)
                pending_bytes += size
            row += batch.num_rows
        if pending:
            r, q = self._put(pending)
            requests += q
            retried += r
            sent += len(pending)
        self._stats["records"] += sent
        self._stats["requests"] += requests
        self._stats["retriedRecords"] += retried
        return Written(sent, requests, retried)

    def _put(self, entries: list[dict[str, Any]]) -> tuple[int, int]:
        """PutRecords ``entries`` until all are accepted; returns (records retried, calls made)."""
        todo = entries
        retried = 0
        for attempt in range(self.max_retries + 1):
            resp = with_backoff(lambda todo=todo: self.client.put_records(StreamName=self.ref.name, Records=todo),  # type: ignore[misc]
                                what=f"PutRecords on stream {self.ref}")  # fmt: skip
            if not resp.get("FailedRecordCount"):
                return retried, attempt + 1
            failed = [e for e, res in zip(todo, resp["Records"], strict=True) if res.get("ErrorCode")]
            codes = sorted({res["ErrorCode"] for res in resp["Records"] if res.get("ErrorCode")})
            if attempt == self.max_retries:
                raise HeadraceError(
                    f"kinesis sink: {len(failed)} of {len(todo)} records still rejected by stream {self.ref} after "
                    f"{self.max_retries} retries ({', '.join(codes)}); fix: add shards, lower the write rate "
                    "(maxRecordsPerRequest, trigger interval) or raise maxRetries"
                )
            log.debug("kinesis sink: %d records rejected (%s); retrying them", len(failed), ", ".join(codes))
            retried += len(failed)
            todo = failed
            time.sleep(backoff(attempt + 1, base=self.backoff))
        raise AssertionError("unreachable")

    def commit(self, batch_id: int, messages: Sequence[CommitMessage | None]) -> None:
        """Nothing left to do: ``write`` returned only after every record was accepted.
        Called once per batch (again on a replay) on the driver."""

    def abort(self, batch_id: int, messages: Sequence[CommitMessage | None]) -> None:
        """Records already accepted by Kinesis cannot be taken back. Called at most once per failed batch."""
        n = sum(m.records for m in messages if isinstance(m, Written))
        if n:
            log.warning("kinesis sink: batch %d failed after %d records were written; they stay in the stream", batch_id, n)

    def metrics(self) -> dict[str, int]:
        """Records, PutRecords calls and retried records so far (progress report)."""
        return dict(self._stats)

    def close(self) -> None:
        """Drop the client. Called once when the query stops; idempotent."""
        self._client = None
