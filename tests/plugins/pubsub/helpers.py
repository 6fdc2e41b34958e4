"""Shared helpers of the pubsub plugin tests: unique names, topics, publishing, reading back.

Everything talks to the session's real Pub/Sub emulator through explicit clients (no global
PUBSUB_EMULATOR_HOST in the test process).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import pyarrow as pa

__all__ = ["Topic", "drain", "ints_of", "to_payload", "unique", "wait_for"]


def unique(prefix: str) -> str:
    """A fresh Pub/Sub-valid id (letters first, 3+ chars)."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


class Topic:
    """A fresh topic on the emulator, with helpers to publish and to pull back."""

    def __init__(self, emulator: Any, *, project: str | None = None, ordering: bool = False) -> None:
        from google.cloud import pubsub_v1

        self.emulator = emulator
        self.project = project or emulator.project_id
        self.id = unique("topic")
        self.path = f"projects/{self.project}/topics/{self.id}"
        self.publisher = emulator.publisher(
            batch_settings=pubsub_v1.types.BatchSettings(max_messages=500, max_latency=0.005),
            publisher_options=pubsub_v1.types.PublisherOptions(enable_message_ordering=ordering),
        )
        self.publisher.create_topic(name=self.path)
        self._next = 0

    def publish(self, payloads: Iterable[bytes], *, ordering_key: str = "", **attrs: str) -> list[str]:
        """Publish and wait; returns the message ids."""
        futures = [self.publisher.publish(self.path, p, ordering_key=ordering_key, **attrs) for p in payloads]
        return [f.result(timeout=30) for f in futures]

    def publish_ints(self, n: int) -> list[int]:
        """Publish ``n`` new distinct integers (as ASCII payloads); returns them."""
        values = list(range(self._next, self._next + n))
        self._next += n
        self.publish(str(v).encode() for v in values)
        return values

    def subscription(self, *, ack_deadline: int = 10, ordering: bool = False) -> str:
        """Create a fresh subscription on this topic; returns its id."""
        sub_id = unique("sub")
        client = self.emulator.subscriber()
        client.create_subscription(request={
            "name": f"projects/{self.project}/subscriptions/{sub_id}", "topic": self.path,
            "ack_deadline_seconds": ack_deadline, "enable_message_ordering": ordering,
        })  # fmt: skip
        client.close()
        return sub_id

    def source_options(self, subscription_id: str | None = None, **extra: Any) -> dict[str, Any]:
        return {
            "projectId": self.project, "topicId": self.id, "subscriptionId": subscription_id or unique("sub"),
            "endpoint": self.emulator.host, "fetchIdleTimeout": "200 milliseconds", **extra,
        }  # fmt: skip

    def sink_options(self, **extra: Any) -> dict[str, Any]:
        return {"projectId": self.project, "topicId": self.id, "endpoint": self.emulator.host, **extra}


def drain(emulator: Any, project: str, subscription_id: str, *, idle: float = 1.0, timeout: float = 30.0) -> list[Any]:
    """Pull and ack everything from a subscription until nothing arrives for ``idle`` seconds."""
    from google.pubsub_v1 import PullResponse

    client = emulator.subscriber()
    path = f"projects/{project}/subscriptions/{subscription_id}"
    out: list[Any] = []
    deadline = time.monotonic() + timeout
    last = time.monotonic()
    try:
        while time.monotonic() < deadline and time.monotonic() - last < idle:
            resp = client.pull(request={"subscription": path, "max_messages": 1000, "return_immediately": True})
            got = list(PullResponse.pb(resp).received_messages)
            if not got:
                time.sleep(0.05)
                continue
            last = time.monotonic()
            out.extend(got)
            client.acknowledge(subscription=path, ack_ids=[m.ack_id for m in got])
    finally:
        client.close()
    return out


def wait_for(predicate: Callable[[], Any], *, timeout: float = 30.0, interval: float = 0.05, what: str = "") -> Any:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        got = predicate()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what or predicate}")
        time.sleep(interval)


def ints_of(payloads: Sequence[bytes | None]) -> list[int]:
    return [int(p) for p in payloads if p is not None]


def to_payload(table: pa.Table) -> pa.Table:
    """rate-micro-batch rows (timestamp, value) -> a Pub/Sub message per row: data = str(value),
    attribute ``value``, orderingKey = value % 4 (used by the sink contract and crash tests)."""
    values = table.column("value").to_pylist()
    data = pa.array([str(v).encode() for v in values], pa.binary())
    attrs = pa.array([[("value", str(v))] for v in values], pa.map_(pa.string(), pa.string()))
    return pa.table({"data": data, "attributes": attrs})
