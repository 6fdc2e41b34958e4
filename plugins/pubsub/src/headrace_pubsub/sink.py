"""``PubSubSink``: publish each row as a Pub/Sub message. At-least-once.

Columns: ``data`` or ``payload`` (binary or string, required), ``attributes`` (map of strings,
optional), ``orderingKey`` (string, optional). ``write`` publishes every row through the client's
batching publisher and waits for every publish future; one failed publish fails the micro-batch,
so the batch is replayed after a restart. Pub/Sub has no transactions or idempotent publish, so a
batch replayed after a crash is published again: consumers see duplicates (each with a new
messageId), never a loss.
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from google.api_core import exceptions as gexc
from google.cloud.pubsub_v1 import types as ps_types

from headrace.errors import HeadraceError
from headrace.options import Options
from headrace.protocols import CommitMessage, Sink, SinkContext
from headrace_pubsub._client import PubSubError, describe_api_error, publisher_client, resolve_endpoint
from headrace_pubsub._options import (  # typed option handles
    BATCH_MAX_BYTES,
    BATCH_MAX_LATENCY,
    BATCH_MAX_MESSAGES,
    ENABLE_MESSAGE_ORDERING,
    MAX_OUTSTANDING_BYTES,
    MAX_OUTSTANDING_MESSAGES,
    PROJECT_ID,
    PUBLISH_TIMEOUT,
    TOPIC_ID,
)

__all__ = ["PubSubSink", "Published"]

log = logging.getLogger(__name__)

_DATA_COLUMNS = ("data", "payload")


@dataclass(frozen=True)
class Published(CommitMessage):
    """What one ``write`` published: message count and bytes. Picklable."""

    messages: int
    bytes: int


def _seconds(value: Any) -> float:
    """Durations are parsed to seconds by the option schema (defaults included)."""
    return float(value)


def _as_bytes(col: pa.ChunkedArray | pa.Array, name: str) -> list[bytes | None]:
    t = col.type
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return col.to_pylist()
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return [None if v is None else v.encode() for v in col.to_pylist()]
    raise HeadraceError(
        f"pubsub sink: column {name!r} has type {t}; it must be binary or string. Fix: cast it in "
        "map_batches (e.g. pyarrow.compute.cast(col, pyarrow.binary())) or serialise it (JSON, Avro)"
    )


def _attributes(col: pa.ChunkedArray | pa.Array) -> list[dict[str, str]]:
    t = col.type
    if pa.types.is_map(t):
        return [dict(v) if v else {} for v in col.to_pylist()]
    if pa.types.is_struct(t):
        return [{k: str(x) for k, x in v.items() if x is not None} if v else {} for v in col.to_pylist()]
    raise HeadraceError(
        f"pubsub sink: column 'attributes' has type {t}; it must be map<string, string> (or a struct of "
        "strings). Fix: build it with pyarrow.array([...], pyarrow.map_(pyarrow.string(), pyarrow.string()))"
    )


class PubSubSink(Sink):
    """Publishes rows to ``topicId``. At-least-once: ``idempotent_commit`` is False."""

    idempotent_commit = False

    def __init__(self, options: Options, context: SinkContext) -> None:
        """Called once per query run on the driver: checks that the topic exists. The publisher is
        created on the first ``write`` (when the columns tell whether ordering keys are used)."""
        super().__init__(options, context)
        self.project_id: str = options[PROJECT_ID]
        self.topic_id: str = options[TOPIC_ID]
        self.topic_path = f"projects/{self.project_id}/topics/{self.topic_id}"
        self.endpoint = resolve_endpoint(options)
        self.publish_timeout = _seconds(options[PUBLISH_TIMEOUT])
        self._ordering_option: bool | None = options[ENABLE_MESSAGE_ORDERING]
        self._publisher: Any = None
        self._ordering = False
        self._published = 0
        self._bytes = 0
        self._last_publish_ms = 0
        self._closed = False
        probe = publisher_client(options, self.endpoint)
        try:
            probe.get_topic(topic=self.topic_path, timeout=60.0)
        except gexc.GoogleAPICallError as e:
            raise PubSubError(f"pubsub sink: {describe_api_error(e, 'topic ' + self.topic_path, self.endpoint)}") from e
        finally:
            probe.transport.close()

    def _make_publisher(self, ordering: bool) -> Any:
        o = self.options
        batch = ps_types.BatchSettings(
            max_messages=o[BATCH_MAX_MESSAGES], max_bytes=o[BATCH_MAX_BYTES], max_latency=_seconds(o[BATCH_MAX_LATENCY])
        )
        flow = ps_types.PublishFlowControl(
            message_limit=o[MAX_OUTSTANDING_MESSAGES],
            byte_limit=o[MAX_OUTSTANDING_BYTES],
            limit_exceeded_behavior=ps_types.LimitExceededBehavior.BLOCK,
        )
        return publisher_client(
            o,
            self.endpoint,
            batch_settings=batch,
            publisher_options=ps_types.PublisherOptions(enable_message_ordering=ordering, flow_control=flow),
        )

    def write(self, batch_id: int, data: Iterator[pa.RecordBatch]) -> CommitMessage:
        """Publish every row and wait until Pub/Sub confirmed each one (or fail the batch).

        Called once per micro-batch (once per task under Spark), in the query's thread. Returns a
        picklable :class:`Published`."""
        t0 = time.monotonic()
        futures: list[Any] = []
        keys_used: set[str] = set()
        n_bytes = 0
        for batch in data:
            if batch.num_rows == 0:
                continue
            names = batch.schema.names
            data_cols = [c for c in _DATA_COLUMNS if c in names]
            if len(data_cols) != 1:
                raise HeadraceError(
                    f"pubsub sink: the rows need exactly one of the columns 'data' or 'payload' (binary or string); "
                    f"got columns {names}. Fix: rename or select the message body column in map_batches"
                )
            payloads = _as_bytes(batch.column(data_cols[0]), data_cols[0])
            attrs = _attributes(batch.column("attributes")) if "attributes" in names else None
            keys = batch.column("orderingKey").to_pylist() if "orderingKey" in names else None
            if self._publisher is None:
                self._ordering = self._ordering_option if self._ordering_option is not None else keys is not None
                self._publisher = self._make_publisher(self._ordering)
            if keys is not None and not self._ordering and any(keys):
                raise HeadraceError(
                    "pubsub sink: rows have orderingKey values but enableMessageOrdering is false; fix: set "
                    "enableMessageOrdering to true (or drop the orderingKey column)"
                )
            publish = self._publisher.publish
            topic = self.topic_path
            for i, payload in enumerate(payloads):
                body = payload if payload is not None else b""
                a = attrs[i] if attrs is not None else {}
                if not body and not a:
                    raise HeadraceError(
                        f"pubsub sink: row {i} of batch {batch_id} has an empty {data_cols[0]!r} and no attributes; "
                        "Pub/Sub rejects such a message. Fix: filter those rows out in map_batches"
                    )
                key = (keys[i] or "") if keys is not None else ""
                if key:
                    keys_used.add(key)
                n_bytes += len(body)
                futures.append(publish(topic, body, ordering_key=key, **a))
        self._wait(batch_id, futures, keys_used)
        self._published += len(futures)
        self._bytes += n_bytes
        self._last_publish_ms = int((time.monotonic() - t0) * 1000)
        return Published(len(futures), n_bytes)

    def _wait(self, batch_id: int, futures: list[Any], keys_used: set[str]) -> None:
        done, not_done = concurrent.futures.wait(futures, timeout=self.publish_timeout)
        failed = [f for f in done if f.exception() is not None]
        if not failed and not not_done:
            return
        for key in keys_used:  # a failed ordered publish pauses its key until resumed
            try:
                self._publisher.resume_publish(self.topic_path, key)
            except Exception:  # best effort before the batch fails
                pass
        if not_done:
            raise PubSubError(
                f"pubsub sink: {len(not_done)} of {len(futures)} messages of batch {batch_id} were not confirmed "
                f"within publishTimeout ({self.publish_timeout:g} s) by {self.endpoint}; the batch fails and is "
                "published again on restart. Fix: check the network or raise publishTimeout"
            )
        err = failed[0].exception()
        what = describe_api_error(err, "topic " + self.topic_path, self.endpoint) if isinstance(err, gexc.GoogleAPICallError) \
            else f"{type(err).__name__}: {err}"  # fmt: skip
        raise PubSubError(
            f"pubsub sink: {len(failed)} of {len(futures)} messages of batch {batch_id} failed to publish: {what}. "
            "The batch fails and is published again on restart (at-least-once)"
        ) from err

    def commit(self, batch_id: int, messages: Sequence[CommitMessage | None]) -> None:
        """Nothing left to do: ``write`` returned only after every publish was confirmed. Called once
        per batch (again on replay, when the rows were published again)."""
        n = sum(m.messages for m in messages if isinstance(m, Published))
        log.debug("pubsub sink: batch %d published %d messages to %s", batch_id, n, self.topic_path)

    def abort(self, batch_id: int, messages: Sequence[CommitMessage | None]) -> None:
        """Published messages cannot be taken back (Pub/Sub has no transactions): a no-op."""

    def metrics(self) -> Mapping[str, Any]:
        """Totals for the progress report. Called once per batch."""
        return {"numMessagesPublished": self._published, "numBytesPublished": self._bytes,
                "publishDurationMs": self._last_publish_ms}  # fmt: skip

    def close(self) -> None:
        """Flush and stop the publisher. Called once when the query stops; idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._publisher is not None:
            try:
                self._publisher.stop()
            except RuntimeError:
                pass
            self._publisher.transport.close()

    def __repr__(self) -> str:
        return f"PubSubSink({self.topic_path} at {self.endpoint})"
