"""Talking to Kinesis for ``KinesisSource``: the client, shard iterators, GetRecords with rate
limits and loss checks, the available-now boundary of open shards, and re-reading a range on replay.

``ShardReader`` is a mixin of :class:`~headrace_kinesis.source.KinesisSource`. ``_fetch_once`` and
the boundary polls run on the driver from ``latest_offset`` (once per trigger, per shard, under
the source's lock); ``_reread`` runs from ``read`` (once per partition per batch, maybe in a worker
thread or on a pickled copy, whose client is created again on first use).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from headrace.errors import HeadraceError
from headrace.helpers.dataloss import DataLossPolicy
from headrace.options import Options
from headrace_kinesis._client import StreamRef, error_code, make_client, with_backoff
from headrace_kinesis._partitions import ShardRange
from headrace_kinesis._schema import records_to_batch
from headrace_kinesis._shards import Position

__all__ = ["ShardReader"]

log = logging.getLogger(__name__)


@dataclass
class _Boundary:
    """Available-now, for one shard open at the start of the run: a LATEST iterator taken then
    (renewed by every poll that finds nothing), and once a record arrived after the start, its
    sequence number (records from there on are left for the next run)."""

    iterator: str | None
    polled: float
    seq: str | None = None


_BOUNDARY_REFRESH = 60.0  # poll an unused boundary iterator this often, well before its 300 s expiry


@dataclass
class _Fetch:
    """One shard's fetch state during ``latest_offset`` (driver only)."""

    shard_id: str
    start: Position
    iterator: str | None = None
    batches: list[pa.RecordBatch] | None = None
    first_seq: str | None = None
    last_seq: str | None = None
    last_ts: int | None = None
    count: int = 0
    done: bool = False
    caught_up: bool = False
    iterator_ok: bool = True  # the iterator points right after last_seq


def _ms(t: Any) -> int:
    return int(t.timestamp() * 1000) if hasattr(t, "timestamp") else int(float(t) * 1000)


class ShardReader:
    """Mixin of ``KinesisSource``: Kinesis API calls and records (see the module docstring)."""

    # set by KinesisSource.__init__
    options: Options
    ref: StreamRef
    max_per_fetch: int
    max_rate: float
    min_period: float
    fail_on_data_loss: bool
    _client: Any
    _next_fetch: dict[str, float]
    _behind: dict[str, int]
    _an_open: dict[str, _Boundary] | None
    _closed: set[str]

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = make_client(self.options)
        return self._client

    def _call(self, what: str, fn: Any, **kwargs: Any) -> Any:
        try:
            return with_backoff(lambda: fn(**kwargs), what=f"{what} on stream {self.ref}")
        except HeadraceError:
            raise
        except Exception as e:
            code = error_code(e)
            if code == "ResourceNotFoundException":
                raise HeadraceError(
                    f"kinesis: stream {self.ref} (or one of its shards) not found ({e}); fix: check streamName/streamARN, "
                    "region and endpoint"
                ) from e
            raise

    def _poll_boundary(self, sid: str, b: _Boundary) -> None:
        """Look for the first record after the start on ``b``'s LATEST iterator (a few calls at
        most); renews the iterator when there is none yet."""
        for _ in range(5):
            if b.iterator is None or b.seq is not None:
                return
            try:
                resp = self._call("GetRecords", self.client.get_records, ShardIterator=b.iterator, Limit=1)
            except Exception as e:
                if error_code(e) != "ExpiredIteratorException":
                    raise
                # unused for 5 minutes (a very long batch): the exact end is lost; read the shard
                # until caught up instead, which still reads everything present at start
                log.info("kinesis: available-now: the start boundary of shard %s expired; reading it until caught up", sid)
                b.iterator = None
                return
            b.polled = time.monotonic()
            self._next_fetch[sid] = max(self._next_fetch.get(sid, 0.0), b.polled + self.min_period)
            records = resp.get("Records", [])
            if records:
                b.seq, b.iterator = str(records[0]["SequenceNumber"]), None
                return
            b.iterator = resp.get("NextShardIterator")
            if not resp.get("MillisBehindLatest"):
                return

    def _iterator(self, sid: str, pos: Position, *, check_at: bool = True) -> tuple[str | None, bool]:
        """A fresh iterator at ``pos``; for ``after`` positions it starts AT the sequence number so
        that trimming can be seen (returns True in the second item: skip the first record if it is
        that sequence number)."""
        kwargs: dict[str, Any] = {"StreamName": self.ref.name, "ShardId": sid}
        at_seq = False
        if pos[0] == "after":
            kwargs.update(ShardIteratorType="AT_SEQUENCE_NUMBER" if check_at else "AFTER_SEQUENCE_NUMBER",
                          StartingSequenceNumber=pos[1])  # fmt: skip
            at_seq = check_at
        elif pos[0] == "at":
            kwargs.update(ShardIteratorType="AT_TIMESTAMP", Timestamp=int(pos[1]) / 1000)
        else:
            kwargs.update(ShardIteratorType="TRIM_HORIZON")
        try:
            return self._call("GetShardIterator", self.client.get_shard_iterator, **kwargs)["ShardIterator"], at_seq
        except Exception as e:
            if pos[0] == "at" and error_code(e) == "InvalidArgumentException" and "greater than" in str(e):
                return None, False  # the timestamp is ahead of the server clock: nothing to read yet
            raise

    def _data_loss(self, sid: str, what: str) -> None:
        msg = (f"kinesis: records of stream {self.ref} shard {sid} are gone ({what}); they were probably trimmed by the "
               "stream's retention period while the query was stopped or behind")  # fmt: skip
        DataLossPolicy(self.fail_on_data_loss, "kinesis", fix="set failOnDataLoss=false to skip them and continue from "
                       "the oldest retained record, or start a new checkpoint").lost(msg, skip="skipping them")  # fmt: skip

    def _get_records(self, f: _Fetch, limit: int) -> tuple[list[dict[str, Any]], int]:
        """One GetRecords for ``f`` (renewing an expired iterator); returns (records, bytes)."""
        assert f.iterator is not None
        try:
            resp = self._call("GetRecords", self.client.get_records, ShardIterator=f.iterator, Limit=limit)
        except Exception as e:
            if error_code(e) != "ExpiredIteratorException":
                raise
            log.info("kinesis: iterator of shard %s expired; renewing it", f.shard_id)
            pos: Position = ("after", f.last_seq) if f.last_seq else f.start
            f.iterator, _ = self._iterator(f.shard_id, pos, check_at=False)
            if f.iterator is None:
                return [], 0
            return self._get_records(f, limit)
        records = resp.get("Records", [])
        f.iterator = resp.get("NextShardIterator")
        self._behind[f.shard_id] = int(resp.get("MillisBehindLatest", 0) or 0)
        if f.iterator is None:
            f.done = True
        elif not records and not resp.get("MillisBehindLatest") and f.shard_id not in self._closed:
            # a closed shard can answer "nothing, 0 ms behind" before its end (kinesalite does until
            # the iterator passes the shard's ending time): it is finished only without a next iterator
            f.caught_up = True
        size = sum(len(r["Data"]) + len(r["PartitionKey"]) for r in records)
        return records, size

    def _fetch_once(self, f: _Fetch, rows_left: int | None) -> tuple[int, int]:
        """One GetRecords call on ``f`` and its bookkeeping (rate limit, loss check, cut-offs).

        Returns (records kept, bytes fetched)."""
        skip_seq: str | None = None
        if f.iterator is None:
            pos: Position = ("after", f.last_seq) if f.last_seq else f.start
            f.iterator, at_seq = self._iterator(f.shard_id, pos)
            if f.iterator is None:
                f.caught_up = True
                return 0, 0
            skip_seq = pos[1] if at_seq else None
        limit = self.max_per_fetch if rows_left is None else max(1, min(self.max_per_fetch, rows_left + (1 if skip_seq else 0)))
        records, size = self._get_records(f, limit)
        t = time.monotonic()
        self._next_fetch[f.shard_id] = t + max(self.min_period, size / self.max_rate)
        if skip_seq is not None:
            if records and records[0]["SequenceNumber"] == skip_seq:
                records = records[1:]
            else:
                self._data_loss(f.shard_id, f"the last record read, sequence number {skip_seq}, is no longer retained")
        boundary = self._an_open.get(f.shard_id) if self._an_open is not None else None
        if boundary is not None and records:
            if boundary.seq is None:  # polled after this fetch: no record after the start yet means all of these are before it
                self._poll_boundary(f.shard_id, boundary)
            if boundary.seq is not None:
                cut = int(boundary.seq)
                keep = [r for r in records if int(r["SequenceNumber"]) < cut]
                if len(keep) < len(records):
                    records = keep
                    f.caught_up = True
                    f.iterator_ok = False
                    f.done = False
        if not records:
            return 0, size
        assert f.batches is not None
        f.batches.append(records_to_batch(records, self.ref.name, f.shard_id))
        if f.first_seq is None:
            f.first_seq = records[0]["SequenceNumber"]
        f.last_seq = records[-1]["SequenceNumber"]
        f.last_ts = _ms(records[-1]["ApproximateArrivalTimestamp"])
        f.count += len(records)
        return len(records), size

    def _reread(self, r: ShardRange) -> Iterator[pa.RecordBatch]:
        last = int(r.last_seq)
        expect: str | None = None  # the sequence number the first record must have
        skip_first = False
        if r.first_seq:
            it, _ = self._iterator(r.shard_id, ("after", r.first_seq), check_at=True)
            expect = r.first_seq
        else:
            it, at_seq = self._iterator(r.shard_id, r.start, check_at=True)
            expect, skip_first = (r.start[1], True) if at_seq else (None, False)
        f = _Fetch(r.shard_id, r.start, iterator=it)
        checked = expect is None
        while True:
            if f.iterator is None:
                self._data_loss(r.shard_id, f"the shard ended before sequence number {r.last_seq} while replaying a batch")
                return
            records, _ = self._get_records(f, self.max_per_fetch)
            if not checked and records:
                checked = True
                if records[0]["SequenceNumber"] == expect:
                    if skip_first:
                        records = records[1:]
                else:
                    self._data_loss(r.shard_id, f"sequence number {expect} is no longer retained")
            out = [x for x in records if int(x["SequenceNumber"]) <= last]
            if out:
                yield records_to_batch(out, self.ref.name, r.shard_id)
            if len(out) < len(records) or (out and out[-1]["SequenceNumber"] == r.last_seq):
                return
            if not records and (f.done or f.caught_up):
                self._data_loss(r.shard_id, f"sequence number {r.last_seq} was not found while replaying a batch")
                return
