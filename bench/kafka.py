"""Benchmark: headrace's kafka connector vs plain confluent-kafka, same broker, same run.

    .venv/bin/python bench/kafka.py [--rows 200000] [--rt-seconds 5]

Prints (measured, never asserted):
  1. source: rows/s into Arrow, headrace (kafka -> noop, available_now) vs a plain
     assign/consume/convert-to-Arrow loop;
  2. sink: msgs/s, headrace (Arrow rows -> kafka) vs a plain produce loop over the same rows;
  3. real-time kafka -> kafka at 1,000 msgs/s: end-to-end latency p50/p99 of headrace's
     trigger(real_time=...) vs a plain consume -> produce relay loop.
Each line ends with the ratio headrace / plain (goal >= 0.8 for throughput; p99 within 1.5x).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import Consumer, Producer, TopicPartition

import headrace as hr
from tests.services import KafkaMock

PARTITIONS = 4
LOW_LATENCY = {"fetch.wait.max.ms": 10, "fetch.queue.backoff.ms": 10}


def fill(servers: str, topic: str, rows: int) -> None:
    p = Producer({"bootstrap.servers": servers, "linger.ms": 20, "batch.num.messages": 10000})
    for i in range(rows):
        while True:
            try:
                p.produce(topic, b"%d" % i, None, i % PARTITIONS)
                break
            except BufferError:
                p.poll(0.01)
    p.flush(60)


# The source's own librdkafka settings for bounded reads (headrace_kafka._client.consumer_config),
# so that both sides fetch the same way.
SOURCE_FETCH = {"fetch.wait.max.ms": 10, "fetch.queue.backoff.ms": 10}


def plain_consume(servers: str, topic: str, rows: int) -> float:
    """A plain confluent-kafka loop doing the source's work: find the partitions and where they end,
    read them, convert every chunk to the source's 7 Arrow columns. Timed from consumer creation,
    as headrace's figure is timed from query start."""
    t0 = time.perf_counter()
    c = Consumer({"bootstrap.servers": servers, "group.id": uuid.uuid4().hex, "enable.auto.commit": False,
                  "auto.offset.reset": "error", **SOURCE_FETCH})  # fmt: skip
    parts = sorted(c.list_topics(topic, timeout=10).topics[topic].partitions)
    total = sum(c.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)[1] for p in parts)
    c.assign([TopicPartition(topic, p, 0) for p in parts])
    n = 0
    ts_type = pa.timestamp("us", tz="UTC")
    while n < total:
        msgs = [m for m in c.consume(10000, timeout=1.0) if m.error() is None]
        if not msgs:
            continue
        ts = [m.timestamp() for m in msgs]
        ms = pa.array([t[1] for t in ts], pa.int64())
        batch = pa.RecordBatch.from_pydict({
            "key": pa.array([m.key() for m in msgs], pa.binary()),
            "value": pa.array([m.value() for m in msgs], pa.binary()),
            "topic": pa.array([m.topic() for m in msgs], pa.string()),
            "partition": pa.array([m.partition() for m in msgs], pa.int32()),
            "offset": pa.array([m.offset() for m in msgs], pa.int64()),
            "timestamp": pc.if_else(pc.greater_equal(ms, 0), pc.multiply(ms, 1000), None).cast(ts_type),
            "timestampType": pc.max_element_wise(pc.subtract(pa.array([t[0] for t in ts], pa.int32()), 1), 0),
        })  # fmt: skip
        n += batch.num_rows
    dt = time.perf_counter() - t0
    c.close()
    assert n == rows, f"plain read {n} rows, expected {rows}"
    return rows / dt


def headrace_consume(servers: str, topic: str, rows: int) -> float:
    t0 = time.perf_counter()
    q = (hr.read_stream.format("kafka")
         .options({"kafka.bootstrap.servers": servers, "subscribe": topic, "startingOffsets": "earliest"}).load()
         .write_stream.format("noop").trigger(available_now=True).start())  # fmt: skip
    q.await_termination()
    dt = time.perf_counter() - t0
    got = sum(p["numInputRows"] for p in q.recent_progress)
    assert got == rows, f"headrace read {got} rows, expected {rows}"
    return rows / dt


def values_table(rows: int) -> pa.Table:
    return pa.table({"value": pa.array([str(i) for i in range(rows)], pa.string())})


def plain_produce(servers: str, topic: str, rows: int) -> float:
    table = values_table(rows)
    t0 = time.perf_counter()
    # the sink's own settings (idempotent, delivery reports for errors only); connected before the
    # first record (a brand-new idempotent producer otherwise holds its first records ~0.5 s)
    p = Producer({"bootstrap.servers": servers, "enable.idempotence": True, "delivery.report.only.error": True})
    p.list_topics(topic, timeout=10)
    for rb in table.to_batches(max_chunksize=65536):
        for v in rb.column(0).to_pylist():
            while True:
                try:
                    p.produce(topic, v)
                    break
                except BufferError:
                    p.poll(0.05)
        p.poll(0)
    p.flush(60)
    return rows / (time.perf_counter() - t0)


def as_value(t: pa.Table) -> pa.Table:
    return pa.table({"value": t.column("value").cast(pa.string())})


def headrace_produce(servers: str, topic: str, rows: int) -> float:
    chk = tempfile.mkdtemp(prefix="bench-kafka-")
    t0 = time.perf_counter()
    q = (hr.read_stream.format("rate-micro-batch").option("rowsPerBatch", rows).option("totalRows", rows).load()
         .map_batches(as_value)
         .write_stream.format("kafka").options({"kafka.bootstrap.servers": servers, "topic": topic})
         .option("checkpointLocation", chk).trigger(available_now=True).start())  # fmt: skip
    q.await_termination()
    return rows / (time.perf_counter() - t0)


# ------------------------------------------------------------------ real-time latency
WARMUP = b"warm-up"


def feed(p: Producer, topic: str, rate: int, seconds: float, stop: threading.Event) -> None:
    start = time.perf_counter()
    i = 0
    while not stop.is_set() and time.perf_counter() - start < seconds:
        due = start + i / rate
        delay = due - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        p.produce(topic, b"%.3f" % (time.time() * 1000), None, i % PARTITIONS)
        p.poll(0)
        i += 1
    p.flush(10)


def e2e_consumer(servers: str, out_topic: str) -> Consumer:
    c = Consumer({"bootstrap.servers": servers, "group.id": uuid.uuid4().hex, **LOW_LATENCY})
    parts = len(c.list_topics(out_topic, timeout=10).topics[out_topic].partitions)
    c.assign([TopicPartition(out_topic, p, 0) for p in range(parts)])
    return c


def measure_e2e(c: Consumer, expect: int, timeout: float) -> list[float]:
    """Latency of each timed record (its value is the epoch ms it was produced at); warm-up
    records are waited for but not counted."""
    lat: list[float] = []
    deadline = time.monotonic() + timeout
    while len(lat) < expect and time.monotonic() < deadline:
        # poll returns as soon as a record is there; consume(n, timeout) would wait for n records
        # or the whole timeout and add up to that much to every latency (on both sides)
        m = c.poll(0.05)
        value = m.value() if m is not None and m.error() is None else None
        if value is not None and value != WARMUP:
            lat.append(time.time() * 1000 - float(value))
    return lat


def wait_warm(c: Consumer, n: int, timeout: float = 60.0) -> None:
    seen, deadline = 0, time.monotonic() + timeout
    while seen < n:
        assert time.monotonic() < deadline, "the relay did not pass the warm-up records on"
        m = c.poll(0.05)
        if m is not None and m.error() is None and m.value() == WARMUP:
            seen += 1


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q / 100 * len(s)) - 1))] if s else float("nan")


def plain_relay(servers: str, src: str, dst: str, stop: threading.Event) -> None:
    c = Consumer({"bootstrap.servers": servers, "group.id": uuid.uuid4().hex, "enable.auto.commit": False, **LOW_LATENCY})
    c.assign([TopicPartition(src, p, 0) for p in range(PARTITIONS)])
    p = Producer({"bootstrap.servers": servers, "linger.ms": 0, "enable.idempotence": True})
    while not stop.is_set():
        # the source's read loop: block until one record is there, then take what is fetched already
        first = c.poll(0.02)
        if first is None:
            continue
        for m in [first, *c.consume(10000, timeout=0)]:
            if m.error() is None:
                p.produce(dst, m.value(), m.key())
        p.poll(0)
    p.flush(10)
    c.close()


def harness(servers: str, src: str, dst: str, rate: int, seconds: float, out: Any) -> None:
    """The measuring side, in a process of its own (so that neither the relay's nor headrace's
    Python work delays its clock readings through the GIL, and it delays neither): warm-up, then
    ``rate`` timestamped records/s into ``src`` while reading ``dst``; sends the latencies."""
    producer = Producer({"bootstrap.servers": servers, "linger.ms": 0})
    c = e2e_consumer(servers, dst)
    try:
        for part in range(PARTITIONS):
            producer.produce(src, WARMUP, None, part)
        producer.flush(10)
        wait_warm(c, PARTITIONS)
        feeder = threading.Thread(target=feed, args=(producer, src, rate, seconds, threading.Event()))
        feeder.start()
        lat = measure_e2e(c, int(rate * seconds * 0.98), seconds + 10)
        feeder.join()
    finally:
        c.close()
    out.send(lat)


def run_latency(kafka: KafkaMock, mode: str, rate: int, seconds: float) -> list[float]:
    """End-to-end latency of ``rate`` records/s for ``seconds`` through a plain relay or headrace
    (in this process; the feeder and the measuring consumer run in a child process).

    Both sides are warmed up the same way first (one record per partition must come out the
    other end: connections, producer ids and fetch sessions are set up), so only the steady
    state is measured."""
    src = kafka.create_topic(f"rt-in-{mode}-{uuid.uuid4().hex[:6]}", PARTITIONS)
    dst = kafka.create_topic(f"rt-out-{mode}-{uuid.uuid4().hex[:6]}", 1)
    servers = kafka.bootstrap_servers
    stop = threading.Event()
    q: Any = None
    if mode == "plain":
        relay = threading.Thread(target=plain_relay, args=(servers, src, dst, stop))
        relay.start()
    else:
        q = (hr.read_stream.format("kafka")
             .options({"kafka.bootstrap.servers": servers, "subscribe": src, "startingOffsets": "earliest"}).load()
             .map_batches(lambda t: t.select(["key", "value"]))
             .write_stream.format("kafka").options({"kafka.bootstrap.servers": servers, "topic": dst, "kafka.linger.ms": 0})
             .option("checkpointLocation", tempfile.mkdtemp(prefix="bench-rt-")).trigger(real_time="1 minute").start())  # fmt: skip
    ctx = multiprocessing.get_context("spawn")
    recv, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=harness, args=(servers, src, dst, rate, seconds, send), daemon=True)
    try:
        child.start()
        if not recv.poll(seconds + 90):
            raise RuntimeError("the latency harness sent nothing")
        lat: list[float] = recv.recv()
        child.join(10)
    finally:
        stop.set()
        if child.is_alive():
            child.kill()
        if q is not None:
            q.stop()
        else:
            relay.join()
    return lat


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--rt-seconds", type=float, default=5.0)
    ap.add_argument("--rt-rounds", type=int, default=3, help="0: skip the real-time latency part")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved throughput rounds (medians)")
    args = ap.parse_args()
    kafka = KafkaMock()
    kafka.start()
    try:
        servers = kafka.bootstrap_servers
        topic = kafka.create_topic("bench-src", PARTITIONS)
        fill(servers, topic, args.rows)
        plain_consume(servers, topic, args.rows)  # warm-up
        headrace_consume(servers, topic, args.rows)
        plains, ourss = [], []
        for _ in range(args.rounds):  # interleaved rounds, medians: the machine is shared
            plains.append(plain_consume(servers, topic, args.rows))
            ourss.append(headrace_consume(servers, topic, args.rows))
        plain, ours = statistics.median(plains), statistics.median(ourss)
        print(f"source  rows/s into Arrow: headrace {ours:,.0f}  plain confluent-kafka {plain:,.0f}  ratio {ours / plain:.2f}"
              f"  (medians of {args.rounds} interleaved rounds)")

        n = args.rows // 2
        plain_produce(servers, kafka.create_topic("bench-p-warm", PARTITIONS), n // 4)  # warm-up, not counted
        headrace_produce(servers, kafka.create_topic("bench-h-warm", PARTITIONS), n // 4)
        plains, ourss = [], []
        for k in range(args.rounds):
            plains.append(plain_produce(servers, kafka.create_topic(f"bench-p-{k}", PARTITIONS), n))
            ourss.append(headrace_produce(servers, kafka.create_topic(f"bench-h-{k}", PARTITIONS), n))
        plain, ours = statistics.median(plains), statistics.median(ourss)
        print(f"sink    msgs/s:            headrace {ours:,.0f}  plain produce        {plain:,.0f}  ratio {ours / plain:.2f}"
              f"  (medians of {args.rounds} interleaved rounds)")
        if args.rt_rounds == 0:
            return

        plain_p50, plain_p99, ours_p50, ours_p99 = [], [], [], []
        for _ in range(args.rt_rounds):  # interleaved rounds, median of each side: the machine is shared
            lat = run_latency(kafka, "plain", 1000, args.rt_seconds)
            plain_p50.append(pct(lat, 50))
            plain_p99.append(pct(lat, 99))
            lat = run_latency(kafka, "headrace", 1000, args.rt_seconds)
            ours_p50.append(pct(lat, 50))
            ours_p99.append(pct(lat, 99))
        p50p, p99p, p50h, p99h = (statistics.median(v) for v in (plain_p50, plain_p99, ours_p50, ours_p99))
        print(f"real-time kafka->kafka @1000 msgs/s e2e ms (median of {args.rt_rounds} rounds of {args.rt_seconds:g} s): "
              f"headrace p50 {p50h:.1f} p99 {p99h:.1f}  plain relay p50 {p50p:.1f} p99 {p99p:.1f}  "
              f"p99 ratio {p99h / p99p:.2f} (goal <= 1.5)")
        print(f"  per round p99: headrace {' '.join(f'{v:.0f}' for v in ours_p99)}  "
              f"plain {' '.join(f'{v:.0f}' for v in plain_p99)}")
    finally:
        kafka.stop()


if __name__ == "__main__":
    main()
