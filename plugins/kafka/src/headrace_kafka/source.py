"""``KafkaSource``: topics read over checkpointed offset ranges, like Spark's Kafka source.

Offsets are ``{"topic": {"partition": next_offset}}`` (Spark's JSON shape) and live only in the
checkpoint: the source never joins a consumer group nor commits offsets; every read ``assign``\\ s
explicit offsets. A batch ``[start, end)`` becomes one read partition per topic-partition range
(more with ``minPartitions`` / ``maxRecordsPerPartition``); a read stops exactly at its end offset,
so a replayed batch reads the same records.
"""

from __future__ import annotations

import logging
import re
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa
from confluent_kafka import Consumer

from headrace.errors import HeadraceError
from headrace.helpers.dataloss import DataLossPolicy
from headrace.options import Options
from headrace.protocols import Offset, Partition, ReadLimit, Source, SourceContext
from headrace_kafka._arrow import schema
from headrace_kafka._client import TP, KafkaClientError, Metadata, consumer_config, redact_servers
from headrace_kafka._offsets import KafkaPartition, _flat, _ms, _nested
from headrace_kafka._options import (  # typed option handles
    ASSIGN,
    CONNECT_TIMEOUT,
    ENDING_OFFSETS,
    ENDING_OFFSETS_BY_TIMESTAMP,
    ENDING_TIMESTAMP,
    FAIL_ON_DATA_LOSS,
    FETCH_OFFSET_NUM_RETRIES,
    FETCH_OFFSET_RETRY_INTERVAL_MS,
    INCLUDE_HEADERS,
    KAFKA_BOOTSTRAP_SERVERS,
    KAFKA_CONSUMER_POLL_TIMEOUT_MS,
    MAX_RECORDS_PER_PARTITION,
    MIN_PARTITIONS,
    STARTING_OFFSETS,
    STARTING_OFFSETS_BY_TIMESTAMP,
    STARTING_OFFSETS_BY_TIMESTAMP_STRATEGY,
    STARTING_TIMESTAMP,
    SUBSCRIBE,
    SUBSCRIBE_PATTERN,
)
from headrace_kafka._reader import KafkaReader

__all__ = ["KafkaPartition", "KafkaSource"]

log = logging.getLogger(__name__)

_DATA_LOSS_FIX = "set failOnDataLoss=false to skip what is gone and continue, or start a new checkpoint"


class KafkaSource(KafkaReader, Source):
    """Reads Kafka topics. Replayable (ranges of offsets) and real-time capable.

    Created once per query run on the driver; connects lazily (first ``initial_offset`` or
    ``latest_offset``). ``read`` may run on a pickled copy: the copy carries the validated
    options (secrets stay wrapped) and opens its own consumers.
    """

    replayable = True
    supports_real_time = True
    supports_planning_ahead = True  # latest_offset reads the partitions' watermarks, bounded at available-now's start

    def __init__(self, options: Options, context: SourceContext) -> None:
        super().__init__(options, context)
        self.include_headers: bool = options[INCLUDE_HEADERS]
        self.columns: frozenset[str] | None = None
        self.fail_on_data_loss: bool = options[FAIL_ON_DATA_LOSS]
        self.min_partitions: int | None = options[MIN_PARTITIONS]
        self.max_records_per_partition: int | None = options[MAX_RECORDS_PER_PARTITION]
        self.poll_timeout_s: float = options[KAFKA_CONSUMER_POLL_TIMEOUT_MS] / 1000
        self._subscribe: list[str] | None = options[SUBSCRIBE]
        pattern = options[SUBSCRIBE_PATTERN]
        try:
            self._pattern = re.compile(pattern) if pattern is not None else None
        except re.error as e:
            raise HeadraceError(f"subscribePattern {pattern!r} is not a valid regular expression ({e}); fix the pattern") from None
        assign = options[ASSIGN]
        self._assign: list[TP] | None = (
            sorted((t, int(p)) for t, ps in assign.items() for p in ps) if assign is not None else None
        )
        user_group = options.passthrough("kafka.").get("group.id")
        suffix = context.query_id or uuid.uuid4().hex
        self.group_id: str = user_group or f"{options['groupIdPrefix']}-{suffix}"
        self._servers = redact_servers(str(options.reveal(KAFKA_BOOTSTRAP_SERVERS)))
        self._meta: Metadata | None = None
        self._ending: dict[TP, int] | None = None
        self._ending_resolved = False
        self._available_now: dict[TP, int] | None = None
        self._prepared_available_now = False
        self._last_batch_at = time.monotonic()
        self._last_watermarks: dict[TP, tuple[int, int]] = {}
        self._local = threading.local()
        self._consumers: list[Consumer] = []
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ pickling
    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        for k in ("_meta", "_local", "_consumers", "_lock"):
            state.pop(k, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._meta = None
        self._local = threading.local()
        self._consumers = []
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        what = self._subscribe or (self._pattern.pattern if self._pattern else None) or self._assign
        return f"KafkaSource({what!r}, servers={self._servers!r})"

    # ------------------------------------------------------------------ driver side
    @property
    def schema(self) -> pa.Schema:
        """key, value, topic, partition, offset, timestamp, timestampType (+ headers). Called once per run."""
        return schema(self.include_headers)

    def prune_columns(self, columns: frozenset[str]) -> None:
        """Batch reads build only ``columns`` (e.g. ``value`` and what locates a record for
        ``from_json``): no key, timestamp or header objects per message when the query does not
        read them. Called at most once per run, on the driver, before the first ``partitions``;
        kept on pickled copies. Real-time reads keep every column."""
        self.columns = frozenset(columns) & frozenset(self.schema.names) or None

    def _metadata(self) -> Metadata:
        if self._meta is None:
            meta = Metadata(
                consumer_config(self.options, self.group_id),
                retries=self.options[FETCH_OFFSET_NUM_RETRIES],
                retry_interval_s=self.options[FETCH_OFFSET_RETRY_INTERVAL_MS] / 1000,
                connect_timeout_s=self.options[CONNECT_TIMEOUT],
            )
            try:
                meta.connect()  # the first contact with the brokers, bounded by connectTimeout
            except BaseException:
                meta.close()
                raise
            self._meta = meta
        return self._meta

    def _partitions_now(self) -> list[TP]:
        """The topic-partitions the query reads now (new partitions and topics included)."""
        if self._assign is not None:
            return list(self._assign)
        topics = self._metadata().topics()
        if self._subscribe is not None:
            names = [t for t in self._subscribe if t in topics]
        else:
            assert self._pattern is not None
            names = [t for t in topics if self._pattern.fullmatch(t)]
        return sorted((t, p) for t in names for p in topics[t])

    def _resolve_specific(self, name: str, spec: Mapping[str, Any], tps: list[TP],
                          wm: Mapping[TP, tuple[int, int]], *, ending: bool) -> dict[TP, int]:  # fmt: skip
        given = {(t, int(p)): int(o) for t, ps in spec.items() for p, o in ps.items()}
        missing = [f"{t}-{p}" for t, p in tps if (t, p) not in given]
        if missing and not ending:
            raise HeadraceError(
                f"{name} does not list {', '.join(missing)}; if it contains specific offsets, list every "
                "topic-partition (-1 for latest, -2 for earliest)"
            )
        out: dict[TP, int] = {}
        for tp, off in given.items():
            if tp not in wm:
                raise HeadraceError(
                    f"{name} names {tp[0]}-{tp[1]}, which does not exist on {self._servers}; fix the topic or partition"
                )
            lo, hi = wm[tp]
            out[tp] = hi if off == -1 else lo if off == -2 else off
        return out

    def _resolve_by_time(self, name: str, wanted: dict[TP, int], wm: Mapping[TP, tuple[int, int]]) -> dict[TP, int]:
        found = self._metadata().offsets_for_times(wanted)
        out: dict[TP, int] = {}
        strategy = self.options[STARTING_OFFSETS_BY_TIMESTAMP_STRATEGY]
        for tp, ts in wanted.items():
            off = found.get(tp, -1)
            if off < 0:
                if strategy == "latest" or name.startswith("ending"):
                    off = wm[tp][1]
                else:
                    raise HeadraceError(
                        f"{name}: no record of {tp[0]}-{tp[1]} has a timestamp at or after {ts} (epoch ms); set "
                        "startingOffsetsByTimestampStrategy=latest to start at the end of such partitions"
                    )
            out[tp] = off
        return out

    def initial_offset(self) -> Offset:
        """Where a new query starts, resolved to concrete offsets (so the checkpoint holds numbers).

        Called once, only for a new checkpoint. Precedence as in Spark: startingTimestamp, then
        startingOffsetsByTimestamp, then startingOffsets.
        """
        tps = self._partitions_now()
        meta = self._metadata()
        wm = meta.watermarks(tps)
        o = self.options
        if o[STARTING_TIMESTAMP] is not None:
            ts = _ms(o[STARTING_TIMESTAMP])
            start = self._resolve_by_time("startingTimestamp", {tp: ts for tp in wm}, wm)
        elif o[STARTING_OFFSETS_BY_TIMESTAMP] is not None:
            spec = o[STARTING_OFFSETS_BY_TIMESTAMP]
            wanted = {(t, int(p)): int(ts) for t, ps in spec.items() for p, ts in ps.items()}
            missing = [f"{t}-{p}" for t, p in tps if (t, p) not in wanted]
            if missing:
                raise HeadraceError(f"startingOffsetsByTimestamp does not list {', '.join(missing)}; list every topic-partition")
            start = self._resolve_by_time("startingOffsetsByTimestamp", wanted, wm)
        else:
            so = o[STARTING_OFFSETS]
            if so == "earliest":
                start = {tp: lo for tp, (lo, _) in wm.items()}
            elif so == "latest":
                start = {tp: hi for tp, (_, hi) in wm.items()}
            else:
                start = self._resolve_specific("startingOffsets", so, tps, wm, ending=False)
        return _nested(start)

    def _ending_offsets(self) -> dict[TP, int] | None:
        """The bound of a bounded run (endingOffsets*), resolved once, at the first trigger."""
        if self._ending_resolved:
            return self._ending
        self._ending_resolved = True
        o = self.options
        if o[ENDING_OFFSETS] is None and o[ENDING_OFFSETS_BY_TIMESTAMP] is None and o[ENDING_TIMESTAMP] is None:
            return None
        tps = self._partitions_now()
        wm = self._metadata().watermarks(tps)
        if o[ENDING_TIMESTAMP] is not None:
            ts = _ms(o[ENDING_TIMESTAMP])
            self._ending = self._resolve_by_time("endingTimestamp", {tp: ts for tp in wm}, wm)
        elif o[ENDING_OFFSETS_BY_TIMESTAMP] is not None:
            spec = o[ENDING_OFFSETS_BY_TIMESTAMP]
            wanted = {(t, int(p)): int(ts) for t, ps in spec.items() for p, ts in ps.items()}
            self._ending = self._resolve_by_time("endingOffsetsByTimestamp", wanted, wm)
        elif o[ENDING_OFFSETS] == "latest":
            self._ending = {tp: hi for tp, (_, hi) in wm.items()}
        else:
            self._ending = self._resolve_specific("endingOffsets", o[ENDING_OFFSETS], tps, wm, ending=True)
        return self._ending

    def prepare_for_available_now(self) -> bool:
        """Record the end offsets now; later batches never go past them. Called once."""
        self._prepared_available_now = True
        self._available_now = {tp: hi for tp, (_, hi) in self._metadata().watermarks(set(self._partitions_now())).items()}
        return True

    def _data_loss(self, message: str) -> None:
        DataLossPolicy(self.fail_on_data_loss, fix=_DATA_LOSS_FIX).lost(message)

    def latest_offset(self, start: Offset, limit: ReadLimit) -> Offset:
        """The end of the next batch. Called once per trigger, on the driver.

        Discovers new partitions (and, with a pattern, new topics): they start at offset 0. A
        topic-partition that disappeared, or whose offsets went backwards, is data loss.
        """
        begin = _flat(start)
        tps = self._partitions_now()
        wm = self._metadata().watermarks(set(tps) | set(begin))
        self._last_watermarks = wm
        latest: dict[TP, int] = {}
        for tp, s in begin.items():
            if tp not in wm:
                self._data_loss(f"{tp[0]}-{tp[1]} no longer exists on {self._servers} (topic or partition deleted) "
                                f"at offset {s}")  # fmt: skip
                continue
            latest[tp] = wm[tp][1]
        for tp in tps:
            if tp not in begin and tp in wm:
                latest[tp] = wm[tp][1]
        if self._prepared_available_now and self._available_now is None:
            self._available_now = dict(latest)
        for bound in (self._available_now, self._ending_offsets()):
            if bound is not None:
                latest = {tp: min(hi, bound.get(tp, 0)) for tp, hi in latest.items()}
        # lag per partition, from where the batch starts (new partitions from 0)
        lag = {tp: max(0, hi - begin.get(tp, 0)) for tp, hi in latest.items()}
        total = sum(lag.values())
        if limit.min_rows is not None and total < limit.min_rows:
            waited = time.monotonic() - self._last_batch_at
            if limit.max_trigger_delay is None or waited < limit.max_trigger_delay:
                return start
        end = dict(latest)
        if limit.max_rows is not None and total > limit.max_rows:
            for tp, n in lag.items():
                share = limit.max_rows * n / total
                take = int(share) if share >= 1 else (1 if n else 0)  # Spark: floor, but at least 1 when behind
                end[tp] = begin.get(tp, 0) + take
        for tp, s in begin.items():  # offsets going backwards: nothing to read, skip ahead (data loss)
            if tp in end and end[tp] < s:
                self._data_loss(f"{tp[0]}-{tp[1]}: offsets went back from {s} to {end[tp]} (topic re-created?)")
        result = _nested({tp: o for tp, o in end.items()})
        if result != start:
            self._last_batch_at = time.monotonic()
        return result

    def partitions(self, start: Offset, end: Offset) -> Sequence[Partition]:
        """One read partition per topic-partition range (split by minPartitions /
        maxRecordsPerPartition). Called once per batch on the driver; deterministic."""
        begin, stop = _flat(start), _flat(end)
        ranges = [(tp, begin.get(tp, 0), e) for tp, e in sorted(stop.items()) if e > begin.get(tp, 0)]
        total = sum(e - s for _, s, e in ranges)
        out: list[Partition] = []
        for (t, p), s, e in ranges:
            pieces = 1
            if self.min_partitions and len(ranges) < self.min_partitions and total:
                pieces = max(1, round((e - s) * self.min_partitions / total))
            if self.max_records_per_partition:
                pieces = max(pieces, -(-(e - s) // self.max_records_per_partition))
            pieces = min(pieces, e - s)
            step, extra = divmod(e - s, pieces)
            lo = s
            for k in range(pieces):
                hi = lo + step + (1 if k < extra else 0)
                out.append(KafkaPartition(t, p, lo, hi))
                lo = hi
        return out

    # ------------------------------------------------------------------ progress
    def metrics(self, latest: Offset) -> Mapping[str, Any]:
        """Backlog after the batch: per-partition lag and offsets outstanding (Spark's names plus
        ``offsetsOutstanding`` and ``partitionLag``). Called once per batch; uses the watermarks
        of the last trigger (one lookup per partition in real-time mode)."""
        end = _flat(latest)
        wm = self._last_watermarks
        if not wm or any(tp not in wm for tp in end):
            try:
                wm = self._metadata().watermarks(end)
            except KafkaClientError:
                return {}
        lag = {f"{t}-{p}": max(0, wm[(t, p)][1] - o) for (t, p), o in end.items() if (t, p) in wm}
        self._last_watermarks = {}
        if not lag:
            return {"offsetsOutstanding": 0, "partitionLag": {}}
        values = list(lag.values())
        return {
            "offsetsOutstanding": sum(values),
            "minOffsetsBehindLatest": min(values),
            "maxOffsetsBehindLatest": max(values),
            "avgOffsetsBehindLatest": round(sum(values) / len(values), 1),
            "partitionLag": lag,
        }

    def close(self) -> None:
        """Close every consumer this source opened. Called once when the query stops; idempotent."""
        with self._lock:
            consumers, self._consumers = self._consumers, []
        for c in consumers:
            try:
                c.close()
            except Exception as e:  # pragma: no cover - best effort
                log.debug("closing a consumer failed: %s", e)
        if self._meta is not None:
            meta, self._meta = self._meta, None
            meta.close()
