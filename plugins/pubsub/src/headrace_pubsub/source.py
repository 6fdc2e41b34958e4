"""``PubSubSource``: Pub/Sub made replayable by staging pulled messages in the checkpoint.

Per trigger, ``latest_offset`` pulls (``numFetchPartitions`` fetch partitions, each up to
``maxRecordsPerFetch`` messages or ``maxFetchPeriod``, with three pull requests in flight, ending
early once the subscription is idle for ``fetchIdleTimeout``; see ``_fetch``), extends the ack
deadlines of what it holds, and stages what it pulled in chunks: whenever ``_STAGE_ROWS`` messages
wait, they are written durably as one segment ``sources/<i>/pubsub/segments/<seq>`` (Arrow IPC)
and only then acknowledged (in the background, ``_acks``) while the pulls go on. A micro-batch's
offset ``{"seq": n}`` names segments ``1..n`` (a batch may span several); ``read`` reads the
staged files, so a replayed batch sees exactly the same rows and an idempotent sink gives
exactly-once output. ``commit(end)`` waits for the acks of the segments up to ``end``, deletes
them, and keeps their message ids for the dedup window.

Crash windows and what happens on restart:

- before a chunk is staged: its messages were not acked; Pub/Sub redelivers them after the ack
  deadline. Segments staged before it in the same fetch are kept (and were acked).
- after staging, before ``offsets/<n>``: the staged segments are found by ``latest_offset`` and
  become the next batch (their messages are acked again, best effort).
- after ``offsets/<n>``: the engine replays the batch over the same segments.
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
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from google.api_core import exceptions as gexc

from headrace.errors import HeadraceError
from headrace.helpers.crash import crash_point
from headrace.options import Options
from headrace.protocols import Offset, Partition, ReadLimit, Source, SourceContext
from headrace_pubsub._acks import Acker
from headrace_pubsub._client import PubSubError, describe_api_error, resolve_endpoint, subscriber_client
from headrace_pubsub._fetch import PULLS_IN_FLIGHT, FetchRun
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
from headrace_pubsub._rpc import SubscriberCalls
from headrace_pubsub._schema import IDS_SCHEMA, SCHEMA, Columns
from headrace_pubsub._staging import SegmentPart, SegmentStore, read_part

__all__ = ["PubSubPartition", "PubSubSource"]

log = logging.getLogger(__name__)

_RPC_TIMEOUT = 60.0
_STAGE_ROWS = 2000  # a chunk is staged (and acknowledged) once this many messages wait: a segment each


def _seconds(value: Any) -> float:
    """Durations are parsed to seconds by the option schema (defaults included)."""
    return float(value)


@dataclass(frozen=True)
class PubSubPartition(SegmentPart, Partition):
    """One staged part file of one segment: what ``read`` reads. Picklable."""


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
        self._drained = False  # available-now: the last fetch found the subscription empty (see latest_offset)
        self._pending_fetch_ids: set[str] = set()
        self._pool: ThreadPoolExecutor | None = None
        self._acker = Acker(self._ack_ids, self._modify_deadline)
        self._closed = False
        self._client: Any = subscriber_client(options, self.endpoint)
        try:
            self.ack_deadline = self._ensure_subscription(options)
            self._calls = SubscriberCalls(self._client, self.subscription_path, _RPC_TIMEOUT)
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
        fetch finds nothing published before it, or right after a fetch that ended because the
        subscription delivered nothing for ``fetchIdleTimeout`` (that wait is not repeated)."""
        self._cutoff_ms = int(time.time() * 1000)
        return True

    def latest_offset(self, start: Offset, limit: ReadLimit) -> Offset:
        """Pull, stage and ack the next micro-batch; return ``{"seq": n}``, its last segment, or
        ``start`` when nothing arrived within ``fetchIdleTimeout``.

        Called once per trigger, on the driver, before ``offsets/<n>`` is written: this is where
        messages are pulled, written durably to the checkpoint chunk by chunk, and each chunk
        acknowledged once it is durable. Segments staged by a run that died before writing
        ``offsets/<n>`` are returned again instead of pulling."""
        s = int(start["seq"])
        pending = [q for q in self._store.staged() if q > s]
        if pending:
            return self._resume_staged(s, pending)
        if self._cutoff_ms is not None and self._drained:
            # available-now: the previous fetch, after the cut-off, ended only once the subscription
            # had delivered nothing for fetchIdleTimeout; a second such wait would find nothing more
            return dict(start)
        run = FetchRun(self, limit, self._puller_pool)
        seq = s
        stats: dict[str, Any] = {"stageDurationMs": 0}
        try:
            while (chunk := run.take(_STAGE_ROWS)) is not None:
                seq += 1
                crash_point("pubsub_after_pull", seq)  # HEADRACE_TEST_CRASH=pubsub_after_pull:<seq>
                t = time.monotonic()
                acks = self._stage(seq, chunk)
                stats["stageDurationMs"] += int((time.monotonic() - t) * 1000)
                crash_point("pubsub_after_stage", seq)
                run.lease.remove(acks)
                self._acker.ack_async(seq, acks, stats)  # durable now: acknowledged while the fetch goes on
        except BaseException:
            run.stop()  # what is not staged is not acked: Pub/Sub redelivers it after the deadline
            with self._seen_lock:
                self._pending_fetch_ids.clear()  # so those redeliveries are taken, not dropped
            raise
        run.stop()
        self._drained = run.drained
        stats.update({
            "numRecordsFetched": run.fetched,
            "numBytesFetched": run.bytes,
            "numDuplicatesDropped": len(run.duplicates),
            "numPulls": run.pulls,
            "numFetchPartitions": self.num_fetch_partitions,
            "numSegmentsStaged": seq - s,
            "fetchDurationMs": run.fetch_ms,
        })  # fmt: skip
        if self._cutoff_ms is not None:
            stats["numPublishedAfterAvailableNow"] = len(run.late)
        # redeliveries are acknowledged only now that every first copy of this fetch is durable
        self._acker.ack_async(seq, run.duplicates, stats)
        self._acker.nack(run.late)
        if seq == s:
            self._acker.wait_upto(seq)
            return dict(start)
        self._stats[seq] = stats
        return {"seq": seq}

    def _stage(self, seq: int, chunk: list[Columns]) -> list[str]:
        """Write one chunk (a part per fetch partition) durably as segment ``seq``; return its
        ack ids. Its message ids join the dedup record once the segment is durable."""
        ids = [m for c in chunk for m in c.ids]
        acks = [a for c in chunk for a in c.ack_ids]
        parts = [c.to_batch() if len(c) else None for c in chunk]
        id_batch = pa.RecordBatch.from_arrays([pa.array(ids, pa.string()), pa.array(acks, pa.string())], schema=IDS_SCHEMA)
        stats = {"numRecordsFetched": len(ids), "numBytesFetched": sum(c.bytes for c in chunk)}
        manifest = self._store.stage(seq, parts, id_batch, stats)
        with self._seen_lock:
            staged_ms = manifest["stagedAtMs"]
            seen, pending = self._seen, self._pending_fetch_ids
            for mid in ids:
                seen[mid] = staged_ms
                pending.discard(mid)
        return acks

    def _puller_pool(self, n: int) -> ThreadPoolExecutor:
        """The pullers' threads, made once: enough for every fetch (``n`` varies with the limit)."""
        if self._pool is None:
            size = max(n, self.num_fetch_partitions * PULLS_IN_FLIGHT)
            self._pool = ThreadPoolExecutor(size, thread_name_prefix="headrace-pubsub-fetch")
        return self._pool

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
        self._acker.wait_upto(upto)  # a segment's rows go only after its acknowledgement was sent
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
        self._acker.close()  # acknowledgements in flight are sent before the client closes
        self._store.close()  # committed segments still being deleted finish in the background
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
        for k in ("_client", "_calls", "_pool", "_acker", "_seen_lock", "_seen", "_pending_fetch_ids"):
            state.pop(k, None)
        state["_closed"] = True
        return state

    def __repr__(self) -> str:
        return f"PubSubSource({self.subscription_path} on {self.topic_path} at {self.endpoint})"

    # ------------------------------------------------------------------ fetching
    def _pull(self, n: int) -> Sequence[Any]:
        """One Pull of up to ``n`` messages that answers at once, with what is there.

        ``return_immediately`` is deprecated by Google, and the emulator answered it ~1.5x slower
        than a waiting pull (bench/pubsub.py). But a waiting pull needs a client deadline to end
        an idle fetch, and a server that answers after that deadline hands its messages to a
        request nobody reads: they come back only after the ack deadline (measured under load:
        100-200 of 50,000 messages missed an available-now run). Safety first."""
        try:
            return self._calls.pull(n)
        except gexc.DeadlineExceeded:
            return []
        except gexc.NotFound as e:
            raise PubSubError(
                f"pubsub: subscription {self.subscription_path} disappeared while the query ran (deleted, or "
                "expired after 31 days without subscribers); messages published meanwhile are lost for it; "
                "fix: restart the query (it recreates the subscription)"
            ) from e

    # ------------------------------------------------------------------ acks
    def _modify_deadline(self, ack_ids: Sequence[str], seconds: int) -> None:
        self._calls.modify_ack_deadline(ack_ids, seconds)

    def _ack_ids(self, ack_ids: list[str]) -> None:
        self._calls.acknowledge(ack_ids)

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
        stats: dict[str, Any] = {"resumedFromStaging": True, "numSegmentsStaged": end - start}
        for q in range(start + 1, end + 1):
            for k, v in ((self._store.manifest(q) or {}).get("stats") or {}).items():
                if isinstance(v, int) and k.startswith("num"):
                    stats[k] = stats.get(k, 0) + v
            if q not in self._reacked:
                self._reacked.add(q)
                acks = self._store.ids(q).column("ackId").to_pylist()
                self._acker.ack([a for a in acks if a], stats)
        self._stats[end] = stats
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
