"""``KinesisSource``: a replayable, per-shard Kinesis Data Streams source with resharding.

How a batch is made (see :mod:`headrace_kinesis._shards` for the offset):

- ``latest_offset`` fetches new records of every readable shard (GetRecords, rate-limited by
  ``minFetchPeriod`` / ``maxFetchRate``, cut by ``maxFetchDuration`` and the read limit) and keeps
  them in memory; the end offset holds, per shard, the last sequence number fetched.
- ``partitions`` gives one :class:`ShardRange` per shard with records: first and last sequence
  number, inclusive. ``read`` hands out the fetched records; on a replay (after a crash) or on a
  pickled copy it reads the same range again with an AT_SEQUENCE_NUMBER iterator and stops exactly
  at the last sequence number, so every replay gives the same rows.
- A closed shard read to its end is marked ``done``; a child shard is read only from the batch
  after all its parents are done. The shard list is polled every ``shardFetchInterval``.
- ``trigger(available_now=True)`` reads exactly the records present when the run starts, by
  sequence number, never by comparing arrival times with the local clock (clock skew, and
  kinesalite's future arrival times in fresh child shards, cut records present at start): at
  start every shard is listed; a shard closed then is read to its end; an open one gets a LATEST
  iterator, whose first record (polled after each fetch that returned records, until one shows
  up) is the first record *after* the start, so the run stops just before it; shards created
  after the start are left for the next run.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa

from headrace.options import Options
from headrace.protocols import Offset, Partition, ReadLimit, Source, SourceContext
from headrace_kinesis._client import StreamRef, stream_ref
from headrace_kinesis._options import (  # typed option handles
    FAIL_ON_DATA_LOSS,
    FETCH_BUFFER_SIZE,
    INITIAL_POSITION,
    INITIAL_TIMESTAMP,
    MAX_FETCH_DURATION,
    MAX_FETCH_RATE,
    MAX_RECORDS_PER_FETCH,
    MIN_FETCH_PERIOD,
    SHARD_FETCH_INTERVAL,
    SHARDS_PER_TASK,
)
from headrace_kinesis._partitions import ShardRange, ShardsPartition
from headrace_kinesis._reader import _BOUNDARY_REFRESH, ShardReader, _Boundary, _Fetch
from headrace_kinesis._schema import SCHEMA
from headrace_kinesis._shards import (
    Position,
    add_listed,
    compact,
    eligible,
    new_offset,
    position,
    shard_sort_key,
)

__all__ = ["KinesisSource", "ShardRange", "ShardsPartition"]

log = logging.getLogger(__name__)

_ITERATOR_MAX_AGE = 270.0  # AWS iterators expire after 300 s


class KinesisSource(ShardReader, Source):
    """Reads a Kinesis data stream; offsets are per-shard sequence numbers (replayable)."""

    replayable = True

    def __init__(self, options: Options, context: SourceContext) -> None:
        """Called once per query run on the driver; validates nothing further and does no I/O
        (the client is created on first use)."""
        super().__init__(options, context)
        self.ref: StreamRef = stream_ref(options)
        self.max_per_fetch: int = options[MAX_RECORDS_PER_FETCH]
        self.max_rate: float = options[MAX_FETCH_RATE] * 1_000_000  # bytes/s per shard
        self.min_period: float = options[MIN_FETCH_PERIOD]
        self.max_duration: float = options[MAX_FETCH_DURATION]
        self.buffer_bytes: int = options[FETCH_BUFFER_SIZE]
        self.list_interval: float = options[SHARD_FETCH_INTERVAL]
        self.fail_on_data_loss: bool = options[FAIL_ON_DATA_LOSS]
        self.shards_per_task: int = options[SHARDS_PER_TASK]
        self._client: Any = None
        self._lock = threading.Lock()
        self._cache: dict[tuple[str, str, str], list[pa.RecordBatch]] = {}
        self._iters: dict[str, tuple[Position, str, float]] = {}
        self._next_fetch: dict[str, float] = {}
        self._behind: dict[str, int] = {}
        self._idle: dict[str, bool] = {}
        self._last_list = 0.0
        self._list_due = True
        self._an_open: dict[str, _Boundary] | None = None  # available-now: shards open at start
        self._an_closed: set[str] = set()  # available-now: shards closed at start (read to their end)
        self._an_last: tuple[int, str] | None = None  # available-now: the highest shard id listed at start
        self._closed: set[str] = set()  # shards a listing showed closed: read until the end, never "caught up"

    # ------------------------------------------------------------------ plumbing
    def __getstate__(self) -> dict[str, Any]:
        """A pickled copy (for ``read`` elsewhere) keeps options and stream only: no client, no cache."""
        state = self.__dict__.copy()
        state.update(_client=None, _lock=None, _cache={}, _iters={}, _next_fetch={}, _behind={}, _idle={},
                     _an_open=None, _an_closed=set())  # fmt: skip
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    @property
    def schema(self) -> pa.Schema:
        """The fixed Kinesis record schema. Called once after construction."""
        return SCHEMA

    def _list_shards(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        kwargs: dict[str, Any] = {"StreamName": self.ref.name}
        while True:
            resp = self._call("ListShards", self.client.list_shards, **kwargs)
            out.extend(resp.get("Shards", []))
            token = resp.get("NextToken")
            if not token:
                break
            kwargs = {"NextToken": token}
        self._closed.update(s["ShardId"] for s in out if s.get("SequenceNumberRange", {}).get("EndingSequenceNumber"))
        return out

    def _list(self, offset: Offset, **kw: Any) -> Offset:
        after = offset.get("after")
        shards = self._list_shards()
        if after is not None:
            shards = [s for s in shards if s["ShardId"] > after]
        self._last_list = time.monotonic()
        self._list_due = False
        return add_listed(offset, shards, **kw)

    # ------------------------------------------------------------------ offsets
    def initial_offset(self) -> Offset:
        """Called once for a new checkpoint: lists the shards and fixes the start of each."""
        pos = self.options[INITIAL_POSITION]
        start = new_offset(self.ref.name)
        if pos in ("trim_horizon", "earliest"):
            return self._list(start)
        if pos == "at_timestamp":
            at = self.options[INITIAL_TIMESTAMP]  # a rule makes it set with at_timestamp
            assert at is not None
            return self._list(start, initial={"at": int(at.timestamp() * 1000)})
        # latest: LATEST iterators now (kept in memory), AT_TIMESTAMP(now) after a restart.
        now_ms = int(time.time() * 1000)
        offset = self._list(start, initial={"at": now_ms}, closed_done=True)
        for sid in eligible(offset):
            it = self._call("GetShardIterator", self.client.get_shard_iterator, StreamName=self.ref.name,
                            ShardId=sid, ShardIteratorType="LATEST")["ShardIterator"]  # fmt: skip
            self._iters[sid] = (("at", str(now_ms)), it, time.monotonic())
        return offset

    def prepare_for_available_now(self) -> bool:
        """Called once for ``trigger(available_now=True)``, on the driver: lists the shards and
        takes a LATEST iterator of each open one, so that the run reads every record present
        now and none that arrives later (see the module docstring). 1 + open shards calls."""
        opened: dict[str, _Boundary] = {}
        closed: set[str] = set()
        for shard in self._list_shards():
            sid = shard["ShardId"]
            if shard.get("SequenceNumberRange", {}).get("EndingSequenceNumber") is not None:
                closed.add(sid)
                continue
            it = self._call("GetShardIterator", self.client.get_shard_iterator, StreamName=self.ref.name,
                            ShardId=sid, ShardIteratorType="LATEST")["ShardIterator"]  # fmt: skip
            opened[sid] = _Boundary(it, time.monotonic())
        self._an_open, self._an_closed = opened, closed
        self._an_last = max((shard_sort_key(sid) for sid in (*opened, *closed)), default=None)
        return True

    def _in_run(self, sid: str) -> bool:
        """Available-now: the shard existed when the run started (else all its records are later).
        Shard ids grow with every split or merge, so a shard created after the start has an id
        above every id listed then; a lower id not listed (expired) is read as usual."""
        if self._an_open is None or sid in self._an_open or sid in self._an_closed:
            return True
        return self._an_last is not None and shard_sort_key(sid) <= self._an_last

    def latest_offset(self, start: Offset, limit: ReadLimit) -> Offset:
        """Fetch new records of every readable shard from ``start`` and return the end.

        Called once per trigger on the driver. Returns ``start`` when nothing is new. The
        fetched records are kept in memory for ``read`` of the batch that follows.
        """
        with self._lock:
            self._cache.clear()
            # shards finished in an earlier batch are dropped now (not in the batch that finished
            # them: that batch's end must still hold their last sequence number)
            end = compact(start)
            if self._list_due or time.monotonic() - self._last_list >= self.list_interval:
                end = self._list(end)
            shards = [sid for sid in eligible(start) if self._in_run(sid)]
            if self._an_open:
                now = time.monotonic()
                for sid, b in self._an_open.items():
                    if b.seq is None and b.iterator is not None and now - b.polled >= _BOUNDARY_REFRESH:
                        self._poll_boundary(sid, b)
            fetches = {sid: _Fetch(sid, position(start["shards"][sid]), batches=[]) for sid in shards}
            now = time.monotonic()
            for f in fetches.values():
                cached = self._iters.pop(f.shard_id, None)
                if cached is not None and cached[0] == f.start and now - cached[2] < _ITERATOR_MAX_AGE:
                    f.iterator = cached[1]
            rows_left = limit.max_rows
            bytes_left = limit.max_bytes
            deadline = now + self.max_duration
            # an idle shard (caught up at its last fetch) is polled again only when due; a shard
            # with a backlog is waited for (rate limit), within maxFetchDuration
            active = [f for f in fetches.values()
                      if not self._idle.get(f.shard_id) or self._next_fetch.get(f.shard_id, 0.0) <= now]  # fmt: skip
            while active:
                now = time.monotonic()
                due = [f for f in active if self._next_fetch.get(f.shard_id, 0.0) <= now]
                if not due:
                    wait = min(self._next_fetch.get(f.shard_id, 0.0) for f in active) - now
                    if now + wait > deadline:
                        break
                    time.sleep(max(0.0, wait))
                    continue
                for f in due:
                    if rows_left is not None and rows_left <= 0:
                        break
                    n, size = self._fetch_once(f, rows_left)
                    if rows_left is not None:
                        rows_left -= n
                    if bytes_left is not None:
                        bytes_left -= size
                active = [f for f in active if not (f.done or f.caught_up or not f.iterator_ok)]
                if (rows_left is not None and rows_left <= 0) or (bytes_left is not None and bytes_left <= 0):
                    break
                if time.monotonic() >= deadline:
                    break
            for f in fetches.values():
                if f.caught_up or f.done:
                    self._idle[f.shard_id] = True
                elif f.count or f.iterator is not None:
                    self._idle[f.shard_id] = False
                st = end["shards"][f.shard_id]
                if f.last_seq is not None:
                    st.update(seq=f.last_seq, ts=f.last_ts)
                    st.pop("at", None)
                    assert f.first_seq is not None and f.batches is not None
                    self._cache[(f.shard_id, f.first_seq, f.last_seq)] = f.batches
                if f.done:
                    st["done"] = True
                    self._list_due = True
                elif f.iterator is not None and f.iterator_ok:
                    self._iters[f.shard_id] = (position(st), f.iterator, time.monotonic())
            return end if end != start else start

    # ------------------------------------------------------------------ reading
    def partitions(self, start: Offset, end: Offset) -> Sequence[Partition]:
        """One partition per ``shardsPerTask`` shards with records in ``[start, end)``; ``[]``
        when nothing was read. Called once per batch on the driver; the result is picklable."""
        ranges: list[ShardRange] = []
        for sid, st in end["shards"].items():
            before = start["shards"].get(sid, {})
            if not st.get("seq") or before.get("seq") == st["seq"]:
                continue
            first = next((k[1] for k in self._cache if k[0] == sid and k[2] == st["seq"]), "")
            ranges.append(ShardRange(sid, position(before), first, st["seq"]))
        k = self.shards_per_task
        return [ShardsPartition(tuple(ranges[i : i + k])) for i in range(0, len(ranges), k)]

    def read(self, partition: Partition) -> Iterator[pa.RecordBatch]:
        """Yield the partition's records, each batch with exactly :data:`SCHEMA`.

        Called once per partition per batch, maybe in a worker thread or on a pickled copy:
        the in-memory records of ``latest_offset`` are used when present, else the range is
        read again from Kinesis (deterministic: same rows, stopping at ``last_seq``).
        """
        assert isinstance(partition, ShardsPartition)
        for r in partition.ranges:
            with self._lock:
                batches = self._cache.pop((r.shard_id, r.first_seq, r.last_seq), None)
            if batches is not None:
                yield from batches
            else:
                yield from self._reread(r)

    def commit(self, end: Offset) -> None:
        """Nothing to acknowledge: Kinesis keeps records for the retention period. Called once per batch."""

    def metrics(self, latest: Offset) -> Mapping[str, Any]:
        """Per-shard ``millisBehindLatest`` from the last GetRecords of each shard, and shard counts.
        Called once per batch; no I/O."""
        behind = {sid: ms for sid, ms in self._behind.items() if sid in latest["shards"]}
        return {
            "avgMsBehindLatest": (sum(behind.values()) / len(behind)) if behind else 0.0,
            "maxMsBehindLatest": max(behind.values(), default=0),
            "minMsBehindLatest": min(behind.values(), default=0),
            "msBehindLatest": behind,
            "numShards": len(latest["shards"]),
            "numReadableShards": len(eligible(latest)),
        }

    def close(self) -> None:
        """Drop the client and buffered records. Called once when the query stops; idempotent."""
        self._cache.clear()
        self._iters.clear()
        self._client = None
