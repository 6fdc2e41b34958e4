"""``PubSubSource``: Pub/Sub made replayable by staging pulled messages in the checkpoint.

Per trigger, ``latest_offset`` pulls (``numFetchPartitions`` pullers, each up to
``maxRecordsPerFetch`` messages or ``maxFetchPeriod``, ending early once the subscription is idle
for ``fetchIdleTimeout``), extends the ack deadlines of what it holds while it pulls, writes the
messages durably to ``sources/<i>/pubsub/segments/<seq>`` (Arrow IPC) and only then acknowledges
them. The offset ``{"seq": n}`` names segments ``1..n``; ``read`` reads the staged files, so a
replayed batch sees exactly the same rows and an idempotent sink gives exactly-once output.
``commit(end)`` deletes the segments up to ``end``, keeping their message ids for the dedup window.

Crash windows and what happens on restart:

- before staging completes: nothing was acked; Pub/Sub redelivers after the ack deadline.
- after staging, before ``offsets/<n>``: the staged segment is found by ``latest_offset`` and
  becomes the next batch (its messages are acked again, best effort).
- after ``offsets/<n>``: the engine replays the batch over the same segment.
- a message redelivered anyway (ack lost or expired) is dropped by its message id, if it was
  staged within ``dedupWindow``.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from google.api_core import exceptions as gexc
from google.pubsub_v1 import PullResponse

from headrace.engine.crash import crash_point
from headrace.errors import HeadraceError
from headrace.helpers.admission import AdmissionBudget
from headrace.options import Options
from headrace.protocols import Offset, Partition, ReadLimit, Source, SourceContext
from headrace_pubsub._client import PubSubError, describe_api_error, resolve_endpoint, subscriber_client
from headrace_pubsub._options import (  # typed option handles
    ACK_DEADLINE_SECONDS,
    DEDUP_WINDOW,
    DELETE_SUBSCRIPTION_ON_STREAM_STOP,
    ENABLE_MESSAGE_ORDERING,
    FETCH_IDLE_TIMEOUT,
    MAX_BYTES_PER_TRIGGER,
    MAX_FETCH_PERIOD,
    MAX_RECORDS_PER_FETCH,
    NUM_FETCH_PARTITIONS,
    PROJECT_ID,
    SUBSCRIPTION_ID,
    TOPIC_ID,
)
from headrace_pubsub._schema import SCHEMA, messages_to_batch
from headrace_pubsub._staging import SegmentPart, SegmentStore, read_part

__all__ = ["PubSubPartition", "PubSubSource"]

log = logging.getLogger(__name__)

_MAX_PULL = 1000  # messages per Pull request (server maximum)
_ACK_CHUNK = 1000  # ack ids per Acknowledge / ModifyAckDeadline request (request size limit 512 KiB)
_IDLE_POLL = 0.02  # seconds between pulls while the subscription has nothing to deliver
_RPC_TIMEOUT = 60.0
_ACK_THREADS = 4  # Acknowledge requests in flight at once


def _seconds(value: Any) -> float:
    """Durations are parsed to seconds by the option schema (defaults included)."""
    return float(value)


@dataclass(frozen=True)
class PubSubPartition(SegmentPart, Partition):
    """One staged part file of one segment: what ``read`` reads. Picklable."""


class _Lease:
    """Extends the ack deadline of held messages while a fetch and its staging run.

    A thread wakes every third of the subscription's ack deadline and pushes the deadline of
    every held ack id out by that deadline again, so nothing expires however slow the fetch.
    """

    def __init__(self, source: PubSubSource) -> None:
        self._source = source
        self._ids: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.extensions = 0
        self.interval = max(0.1, source.ack_deadline / 3)
        self._thread = threading.Thread(target=self._run, name="headrace-pubsub-lease", daemon=True)
        self._thread.start()

    def add(self, ack_ids: Sequence[str]) -> None:
        with self._lock:
            self._ids.extend(ack_ids)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            with self._lock:
                ids = list(self._ids)
            if not ids:
                continue
            for i in range(0, len(ids), _ACK_CHUNK):
                if self._stop.is_set():
                    return
                try:
                    self._source._modify_deadline(ids[i : i + _ACK_CHUNK], self._source.ack_deadline)
                    self.extensions += 1
                except gexc.GoogleAPICallError as e:  # the ack decides; dedup covers an expiry
                    log.warning("pubsub: extending ack deadlines failed: %s", e)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


@dataclass
class _Fetched:
    """What one fetch partition pulled."""

    messages: list[Any] = field(default_factory=list)
    duplicates: list[str] = field(default_factory=list)  # ack ids of redelivered messages
    late: list[str] = field(default_factory=list)  # ack ids published after the available-now cutoff
    pulls: int = 0
    bytes: int = 0


class PubSubSource(Source):
    """Reads a Pub/Sub subscription (created on ``topicId`` when missing).

    ``replayable`` because every micro-batch is staged in the checkpoint before its messages are
    acknowledged: the batch can be read again from there, never from Pub/Sub. Paired with an
    idempotent sink this is exactly-once.
    """

    needs_state_path = True  # pulled messages are staged there until their batch commits

    replayable = True

    def __init__(self, options: Options, context: SourceContext) -> None:
        """Called once per query run, on the driver: validates the subscription (creating it when
        missing) and recovers staged segments. Reads no messages."""
        super().__init__(options, context)
        self.project_id: str = options[PROJECT_ID]
        self.topic_id: str = options[TOPIC_ID]
        self.subscription_id: str = options[SUBSCRIPTION_ID]
        self.topic_path = f"projects/{self.project_id}/topics/{self.topic_id}"
        self.subscription_path = f"projects/{self.project_id}/subscriptions/{self.subscription_id}"
        self.max_records: int = options[MAX_RECORDS_PER_FETCH]
        self.max_fetch_period = _seconds(options[MAX_FETCH_PERIOD])
        self.fetch_idle = _seconds(options[FETCH_IDLE_TIMEOUT])
        self.num_fetch_partitions: int = options[NUM_FETCH_PARTITIONS]
        self.max_bytes: int | None = options[MAX_BYTES_PER_TRIGGER]
        self.dedup_window = _seconds(options[DEDUP_WINDOW])
        self.delete_on_stop: bool = options[DELETE_SUBSCRIPTION_ON_STREAM_STOP]
        self.endpoint = resolve_endpoint(options)
        self._temp_state: str | None = None
        state = context.state_path
        if state is None:  # outside a query (describe, offset tests): staging is not durable
            state = self._temp_state = tempfile.mkdtemp(prefix="headrace-pubsub-")
        self._store = SegmentStore(os.path.join(state, "pubsub"), durable=context.state_path is not None)
        self._store.recover()
        self._seen: dict[str, int] = self._store.load_seen(self.dedup_window)
        self._seen_lock = threading.Lock()
        self._reacked: set[int] = set()
        self._stats: dict[int, dict[str, Any]] = {}
        self._cutoff_ms: int | None = None
        self._pending_fetch_ids: set[str] = set()
        self._pool: ThreadPoolExecutor | None = None
        self._ack_pool: ThreadPoolExecutor | None = None
        self._closed = False
        warnings.filterwarnings("ignore", message="The return_immediately flag is deprecated", category=DeprecationWarning)
        self._client: Any = subscriber_client(options, self.endpoint)
        try:
            self.ack_deadline = self._ensure_subscription(options)
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ set-up
    def _ensure_subscription(self, options: Options) -> int:
        try:
            sub = self._client.get_subscription(subscription=self.subscription_path, timeout=_RPC_TIMEOUT)
        except gexc.NotFound:
            sub = self._create_subscription(options)
        except gexc.GoogleAPICallError as e:
            raise PubSubError(f"pubsub: {describe_api_error(e, self.subscription_path, self.endpoint)}") from e
        if sub.topic != self.topic_path:
            raise PubSubError(
                f"pubsub: subscription {self.subscription_path} reads topic {sub.topic!r}, not topicId "
                f"{self.topic_id!r} ({self.topic_path}); fix: use a subscriptionId of your own for this "
                "topic, or set topicId to the subscription's topic"
            )
        return int(sub.ack_deadline_seconds or 10)

    def _create_subscription(self, options: Options) -> Any:
        request = {
            "name": self.subscription_path,
            "topic": self.topic_path,
            "ack_deadline_seconds": options[ACK_DEADLINE_SECONDS],
            "enable_message_ordering": bool(options[ENABLE_MESSAGE_ORDERING]),
        }
        try:
            sub = self._client.create_subscription(request=request, timeout=_RPC_TIMEOUT)
            log.info("pubsub: created subscription %s on %s", self.subscription_path, self.topic_path)
            return sub
        except gexc.AlreadyExists:  # another process created it meanwhile
            return self._client.get_subscription(subscription=self.subscription_path, timeout=_RPC_TIMEOUT)
        except gexc.NotFound as e:
            raise PubSubError(
                f"pubsub: cannot create subscription {self.subscription_path}: topic {self.topic_path} does not "
                f"exist at {self.endpoint}; fix: create the topic (gcloud pubsub topics create {self.topic_id}) "
                "or correct topicId/projectId"
            ) from e
        except gexc.GoogleAPICallError as e:
            raise PubSubError(
                f"pubsub: cannot create subscription: {describe_api_error(e, self.subscription_path, self.endpoint)}"
            ) from e

    # ------------------------------------------------------------------ protocol
    @property
    def schema(self) -> pa.Schema:
        """messageId, payload, attributes, publishTimestampInMillis, orderingKey, deliveryAttempt.
        Called once after construction; never changes."""
        return SCHEMA

    def initial_offset(self) -> Offset:
        """``{"seq": 0}``: no segment yet. Called once, for a new checkpoint only."""
        return {"seq": 0}

    def prepare_for_available_now(self) -> bool:
        """Called once for ``trigger(available_now=True)``: messages published after this moment
        (by their publish time) are handed back (nacked) for a later run; the query stops once a
        fetch finds nothing published before it."""
        self._cutoff_ms = int(time.time() * 1000)
        return True

    def latest_offset(self, start: Offset, limit: ReadLimit) -> Offset:
        """Pull, stage and ack the next micro-batch; return ``{"seq": n}`` naming its segment, or
        ``start`` when nothing arrived within ``fetchIdleTimeout``.

        Called once per trigger, on the driver, before ``offsets/<n>`` is written: this is where
        messages are pulled, written durably to the checkpoint, and only then acknowledged. A
        segment staged by a run that died before writing ``offsets/<n>`` is returned again
        instead of pulling."""
        s = int(start["seq"])
        pending = [q for q in self._store.staged() if q > s]
        if pending:
            return self._resume_staged(s, pending)
        fetched, stats = self._fetch(limit)
        messages = [m for f in fetched for m in f.messages]
        duplicates = [a for f in fetched for a in f.duplicates]
        late = [a for f in fetched for a in f.late]
        lease = stats.pop("_lease")
        try:
            if not messages:
                lease.stop()
                self._settle(duplicates, late, stats)
                return dict(start)
            seq = s + 1
            crash_point("pubsub_after_pull", seq)  # HEADRACE_TEST_CRASH=pubsub_after_pull:<seq>
            t = time.monotonic()
            batches = [messages_to_batch(f.messages) if f.messages else None for f in fetched]
            ids = [m.message.message_id for m in messages]
            acks = [m.ack_id for m in messages]
            manifest = self._store.stage(seq, batches, ids, acks, stats)
            stats["stageDurationMs"] = int((time.monotonic() - t) * 1000)
        except BaseException:
            lease.stop()  # nothing acked: Pub/Sub redelivers after the deadline
            raise
        lease.stop()
        crash_point("pubsub_after_stage", seq)
        with self._seen_lock:
            for mid in ids:
                self._seen[mid] = manifest["stagedAtMs"]
            self._pending_fetch_ids.clear()
        self._settle(acks + duplicates, late, stats)
        self._stats[seq] = stats
        return {"seq": seq}

    def partitions(self, start: Offset, end: Offset) -> Sequence[Partition]:
        """One partition per staged part file of segments ``start+1 .. end``; ``[]`` when
        ``start == end``. Called once per batch (again on replay), on the driver."""
        out: list[Partition] = []
        for seq in range(int(start["seq"]) + 1, int(end["seq"]) + 1):
            out.extend(PubSubPartition(p.path, p.seq, p.part, p.rows) for p in self._store.parts(seq))
        return out

    def read(self, partition: Partition) -> Iterator[pa.RecordBatch]:
        """The staged rows of one part file. Called once per partition per batch, in any thread or
        on a pickled copy; deterministic (the files never change once staged)."""
        if not isinstance(partition, SegmentPart):
            raise HeadraceError(f"pubsub: cannot read partition {partition!r}; it was not made by this source")
        yield from read_part(partition)

    def commit(self, end: Offset) -> None:
        """The batch ending at ``end`` is committed: delete its staged rows (and any before),
        keep their message ids for the dedup window. Called once per batch, on the driver."""
        upto = int(end["seq"])
        self._store.commit_upto(upto)
        self._store.prune_dedup(self.dedup_window)
        self._prune_seen()
        for seq in [q for q in self._stats if q < upto]:
            del self._stats[seq]

    def metrics(self, latest: Offset) -> Mapping[str, Any]:
        """Fetch statistics of the batch that ended at ``latest`` (numRecordsFetched, numPulls,
        numDuplicatesDropped, fetchDurationMs, ...). Pub/Sub's API has no backlog count (that is in
        Cloud Monitoring), so no numRecordsOutstanding. Called once per batch."""
        stats = dict(self._stats.get(int(latest["seq"]), {}))
        stats["numStagedSegments"] = len(self._store.staged())
        stats["dedupWindowSize"] = len(self._seen)
        return stats

    def close(self) -> None:
        """Stop the pullers, delete the subscription when ``deleteSubscriptionOnStreamStop``, close
        the client. Called once when the query stops; idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        if self._ack_pool is not None:
            self._ack_pool.shutdown(wait=True, cancel_futures=True)
            self._ack_pool = None
        client = getattr(self, "_client", None)
        if client is not None:
            if self.delete_on_stop:
                try:
                    client.delete_subscription(subscription=self.subscription_path, timeout=_RPC_TIMEOUT)
                    log.info("pubsub: deleted subscription %s (deleteSubscriptionOnStreamStop)", self.subscription_path)
                except gexc.NotFound:
                    pass
                except gexc.GoogleAPICallError as e:
                    log.warning("pubsub: could not delete %s: %s", self.subscription_path,
                                describe_api_error(e, self.subscription_path, self.endpoint))  # fmt: skip
            client.close()
        if self._temp_state is not None:
            shutil.rmtree(self._temp_state, ignore_errors=True)

    def __getstate__(self) -> dict[str, Any]:
        """A pickled copy reads staged files only: no client, threads or locks."""
        state = dict(self.__dict__)
        for k in ("_client", "_pool", "_ack_pool", "_seen_lock", "_seen", "_pending_fetch_ids"):
            state.pop(k, None)
        state["_closed"] = True
        return state

    def __repr__(self) -> str:
        return f"PubSubSource({self.subscription_path} on {self.topic_path} at {self.endpoint})"

    # ------------------------------------------------------------------ fetching
    def _fetch(self, limit: ReadLimit) -> tuple[list[_Fetched], dict[str, Any]]:
        max_bytes = min(b for b in (limit.max_bytes, self.max_bytes) if b) if (limit.max_bytes or self.max_bytes) else None
        budget = AdmissionBudget(ReadLimit(max_rows=limit.max_rows, max_bytes=max_bytes))
        t0 = time.monotonic()
        deadline = t0 + self.max_fetch_period
        lease = _Lease(self)
        self._pending_fetch_ids = set()
        try:
            if self.num_fetch_partitions == 1:
                fetched = [self._fetch_partition(budget, deadline, lease)]
            else:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(self.num_fetch_partitions, thread_name_prefix="headrace-pubsub-fetch")
                futures = [self._pool.submit(self._fetch_partition, budget, deadline, lease)
                           for _ in range(self.num_fetch_partitions)]  # fmt: skip
                fetched = [f.result() for f in futures]
        except BaseException:
            lease.stop()
            raise
        stats: dict[str, Any] = {
            "numRecordsFetched": sum(len(f.messages) for f in fetched),
            "numBytesFetched": sum(f.bytes for f in fetched),
            "numDuplicatesDropped": sum(len(f.duplicates) for f in fetched),
            "numPulls": sum(f.pulls for f in fetched),
            "numFetchPartitions": self.num_fetch_partitions,
            "fetchDurationMs": int((time.monotonic() - t0) * 1000),
            "_lease": lease,
        }
        if self._cutoff_ms is not None:
            stats["numPublishedAfterAvailableNow"] = sum(len(f.late) for f in fetched)
        return fetched, stats

    def _pull(self, n: int) -> Sequence[Any]:
        try:
            resp = self._client.pull(
                request={"subscription": self.subscription_path, "max_messages": n, "return_immediately": True},
                timeout=_RPC_TIMEOUT,
            )
        except gexc.DeadlineExceeded:
            return []
        except gexc.NotFound as e:
            raise PubSubError(
                f"pubsub: subscription {self.subscription_path} disappeared while the query ran (deleted, or "
                "expired after 31 days without subscribers); messages published meanwhile are lost for it; "
                "fix: restart the query (it recreates the subscription)"
            ) from e
        return PullResponse.pb(resp).received_messages

    def _fetch_partition(self, budget: AdmissionBudget, deadline: float, lease: _Lease) -> _Fetched:
        out = _Fetched()
        idle_until = time.monotonic() + self.fetch_idle
        cutoff = self._cutoff_ms
        while len(out.messages) < self.max_records and not budget.closed:
            now = time.monotonic()
            if now >= deadline:
                break
            want = budget.reserve(budget.estimate(min(_MAX_PULL, self.max_records - len(out.messages))))
            if want <= 0:
                break
            received = self._pull(want)
            out.pulls += 1
            budget.give_back(want - len(received))
            if not received:
                now = time.monotonic()
                if now >= idle_until:
                    break
                time.sleep(min(_IDLE_POLL, idle_until - now, max(0.0, deadline - now)))
                continue
            idle_until = time.monotonic() + self.fetch_idle
            new_ids: list[str] = []
            size = 0
            with self._seen_lock:
                for r in received:
                    m = r.message
                    if cutoff is not None and m.publish_time.seconds * 1000 + m.publish_time.nanos // 1_000_000 > cutoff:
                        out.late.append(r.ack_id)
                        budget.close()
                        continue
                    mid = m.message_id
                    if mid in self._seen or mid in self._pending_fetch_ids:
                        out.duplicates.append(r.ack_id)
                        continue
                    self._pending_fetch_ids.add(mid)
                    out.messages.append(r)
                    new_ids.append(r.ack_id)
                    size += len(m.data)
            lease.add(new_ids)
            out.bytes += size
            if not budget.add_bytes(size, len(new_ids)):
                break
        return out

    # ------------------------------------------------------------------ acks
    def _modify_deadline(self, ack_ids: Sequence[str], seconds: int) -> None:
        self._client.modify_ack_deadline(
            subscription=self.subscription_path, ack_ids=list(ack_ids), ack_deadline_seconds=seconds, timeout=_RPC_TIMEOUT
        )

    def _ack_chunk(self, ack_ids: list[str]) -> bool:
        try:
            self._client.acknowledge(subscription=self.subscription_path, ack_ids=ack_ids, timeout=_RPC_TIMEOUT)
            return True
        except gexc.GoogleAPICallError as e:  # staged already: a redelivery is dropped by message id
            log.warning("pubsub: acknowledging %d staged messages failed (%s); Pub/Sub may redeliver them, "
                        "they will be dropped as duplicates within dedupWindow", len(ack_ids), e)  # fmt: skip
            return False

    def _settle(self, ack: Sequence[str], nack: Sequence[str], stats: dict[str, Any]) -> None:
        """Acknowledge staged (and duplicate) messages; hand back those after the cutoff."""
        t = time.monotonic()
        chunks = [list(ack[i : i + _ACK_CHUNK]) for i in range(0, len(ack), _ACK_CHUNK)]
        if len(chunks) > 1:  # the requests at once (the client is thread-safe): ~one round trip, not N
            if self._ack_pool is None:
                self._ack_pool = ThreadPoolExecutor(_ACK_THREADS, thread_name_prefix="headrace-pubsub-ack")
            results = list(self._ack_pool.map(self._ack_chunk, chunks))
        else:
            results = [self._ack_chunk(c) for c in chunks]
        failures = results.count(False)
        for i in range(0, len(nack), _ACK_CHUNK):
            try:
                self._modify_deadline(nack[i : i + _ACK_CHUNK], 0)
            except gexc.GoogleAPICallError as e:
                log.warning("pubsub: handing back messages failed (%s); they are redelivered after the deadline", e)
        stats["ackDurationMs"] = int((time.monotonic() - t) * 1000)
        if failures:
            stats["numAckFailures"] = failures

    def _resume_staged(self, start: int, pending: list[int]) -> Offset:
        """Segments staged after ``start`` by a run that died before writing their offsets."""
        if pending[0] != start + 1:
            raise HeadraceError(
                f"pubsub: the checkpoint's last offset is segment {start} but staged segments {pending} follow "
                f"with a gap in {self._store.segments_dir}; the checkpoint was rolled back by hand. Fix: restore "
                "it, or use a new checkpointLocation (staged messages in those segments are then lost)"
            )
        end = start
        for q in pending:
            if q != end + 1:
                break
            end = q
        for q in range(start + 1, end + 1):
            if q not in self._reacked:
                self._reacked.add(q)
                manifest = self._store.manifest(q) or {}
                self._stats[q] = dict(manifest.get("stats", {}), resumedFromStaging=True)
                acks = self._store.ids(q).column("ackId").to_pylist()
                self._settle([a for a in acks if a], [], {})
        log.info("pubsub: resuming staged segments %d..%d left by an earlier run", start + 1, end)
        return {"seq": end}

    def _prune_seen(self) -> None:
        horizon = int(time.time() * 1000 - self.dedup_window * 1000)
        with self._seen_lock:
            while self._seen:
                first = next(iter(self._seen))
                if self._seen[first] >= horizon:
                    break
                del self._seen[first]
