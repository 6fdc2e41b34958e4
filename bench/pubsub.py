"""Benchmark: headrace's pubsub source and sink vs plain google-cloud-pubsub, same run, same emulator.

    .venv/bin/python bench/pubsub.py [--messages 20000] [--size 100] [--rounds 3] [--only source|sink]
                                     [--idle-ms 200] [--partitions 1] [--baseline-src DIR]

Source: N messages of --size bytes are published once to a topic with one subscription per run
(all created alike: ack deadline 60 s, no ordering, no filter), so every consumer reads the same
messages; each drains its own subscription, and each one's output is checked afterwards (N
distinct message ids, N x size payload bytes). Every side creates its own client inside its timing.
  - shown once: the client's streaming pull (``SubscriberClient.subscribe``) acking each message;
  - the reference: a plain unary loop, Pull (max 1000 messages; the emulator hands out
    100) then Acknowledge those, until it has N ("told N": it knows when to stop);
  - the same loop not told N, ending once the subscription delivered nothing for --idle-ms (the
    end condition of the headrace run below; a real consumer does not know N);
  - headrace: a pubsub -> foreach_batch query with trigger(available_now=True), from start() to
    the end: pull, stage to the checkpoint as Arrow IPC (fsync), ack, read back; the batch
    function keeps the messageId and payload columns. It must find the end of the backlog
    (fetchIdleTimeout --idle-ms of empty pulls) and it starts a query (checkpoint, subscription
    check). Also shown: its msgs/s up to the progress report of the batch that completed N rows,
    the same work as the loop told N (both stop at the N-th message; the last chunk's
    acknowledgement may still be in flight then, ~1 ms).
Ratios printed: vs the loop told N (the goal's figure), vs the loop that finds the end (like for
like), and headrace-to-the-last-message vs the loop told N (the same work). docs/performance.md
says why the second is the fair one. Each side's CPU time is shown too: this process's
(user+sys) and the emulator JVM's.
--baseline-src DIR also runs another version of the source (DIR = another checkout's
plugins/pubsub/src, e.g. main's) in the same rounds on the same emulator: a before/after that the
load of a shared machine cannot tilt between two separate runs.
Sink: N rows published to a topic:
  - baseline: ``PublisherClient.publish`` per message with the same batch settings, then every future;
  - headrace: rate-micro-batch -> map_batches (value -> bytes) -> pubsub sink, available_now.
Each side runs once as a warm-up (not counted), then ``--rounds`` interleaved rounds (the order
flipped every other round); prints the median msgs/s and the ratios (goal >= 0.8). The machine
may be shared: medians, and the load average is printed.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import tempfile
import threading
import time
import uuid
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pyarrow as pa

from tests.services import PubSubEmulator

PROJECT = "headrace-bench"


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _publish(emu: PubSubEmulator, topic: str, n: int, size: int) -> None:
    from google.cloud import pubsub_v1

    pub = emu.publisher(batch_settings=pubsub_v1.types.BatchSettings(max_messages=1000, max_latency=0.01))
    body = b"x" * size
    futures = [pub.publish(topic, body, i=str(i)) for i in range(n)]
    for f in futures:
        f.result()
    pub.transport.close()


def bench_streaming_pull(emu: PubSubEmulator, sub: str, n: int) -> float:
    from google.cloud import pubsub_v1

    client = emu.subscriber()
    got = 0
    lock = threading.Lock()
    done = threading.Event()

    def callback(message: pubsub_v1.subscriber.message.Message) -> None:
        nonlocal got
        message.ack()
        with lock:
            got += 1
            if got >= n:
                done.set()

    t0 = time.perf_counter()
    future = client.subscribe(sub, callback, flow_control=pubsub_v1.types.FlowControl(max_messages=5000))
    done.wait(600)
    elapsed = time.perf_counter() - t0
    future.cancel()
    future.result()  # waits until the stream and its dispatcher stopped (no ack on a closed channel)
    client.close()
    return n / elapsed


def bench_unary_pull(emu: PubSubEmulator, sub: str, n: int) -> float:
    from google.pubsub_v1 import PullResponse

    t0 = time.perf_counter()
    client = emu.subscriber()  # inside the timing, as the headrace run makes its client
    got = 0
    message_ids: list[str] = []
    payloads: list[bytes] = []
    while got < n:
        resp = PullResponse.pb(client.pull(request={"subscription": sub, "max_messages": 1000}))
        ack_ids = [m.ack_id for m in resp.received_messages]
        message_ids.extend(m.message.message_id for m in resp.received_messages)
        payloads.extend(m.message.data for m in resp.received_messages)
        got += len(ack_ids)
        if ack_ids:
            client.acknowledge(subscription=sub, ack_ids=ack_ids)
    elapsed = time.perf_counter() - t0
    client.close()
    assert len(set(message_ids)) == n == len(payloads), (len(set(message_ids)), n)
    assert sum(map(len, payloads)) == n * _SIZE, "payloads differ from what was published"
    return n / elapsed


def bench_unary_drain(emu: PubSubEmulator, sub: str, n: int, idle: float = 0.2) -> float:
    """The plain loop without being told N: it stops, as available-now does, once the
    subscription delivered nothing for ``idle`` seconds (the headrace run's fetchIdleTimeout)."""
    from google.api_core import exceptions as gexc
    from google.pubsub_v1 import PullResponse

    t0 = time.perf_counter()
    client = emu.subscriber()
    message_ids: list[str] = []
    payload_bytes = 0
    last = time.perf_counter()
    while time.perf_counter() - last < idle:
        try:  # a short deadline: the emulator answers at once when it holds nothing (< 1 s left)
            resp = PullResponse.pb(client.pull(request={"subscription": sub, "max_messages": 1000}, timeout=idle))
        except gexc.DeadlineExceeded:
            continue
        if not resp.received_messages:
            time.sleep(0.02)
            continue
        last = time.perf_counter()
        message_ids.extend(m.message.message_id for m in resp.received_messages)
        payload_bytes += sum(len(m.message.data) for m in resp.received_messages)
        client.acknowledge(subscription=sub, ack_ids=[m.ack_id for m in resp.received_messages])
    elapsed = time.perf_counter() - t0
    client.close()
    assert len(set(message_ids)) == n == len(message_ids), (len(set(message_ids)), n)
    assert payload_bytes == n * _SIZE, "payloads differ from what was published"
    return n / elapsed


def bench_headrace_source(emu: PubSubEmulator, topic_id: str, sub_id: str, n: int, partitions: int,
                          idle: str = "200 ms", fmt: str = "pubsub") -> tuple[float, int, float]:  # fmt: skip
    """msgs/s of the whole run (start() to the end of await_termination()), rows, and msgs/s up
    to the progress report of the batch that completed N rows (every message pulled, staged,
    acknowledged or being acknowledged, and handed to the batch function, whose batch committed)."""
    import pyarrow.compute as pc

    import headrace as hr

    chk = tempfile.mkdtemp(prefix="bench-pubsub-")
    opts = {"projectId": PROJECT, "topicId": topic_id, "subscriptionId": sub_id, "endpoint": emu.host,
            "maxRecordsPerFetch": 10000, "numFetchPartitions": partitions, "fetchIdleTimeout": idle}  # fmt: skip
    ids: list[pa.ChunkedArray] = []
    payload_bytes: list[int] = []
    last_rows: list[float] = []
    seen = [0]

    def batch(table: pa.Table, _batch_id: int) -> None:
        ids.append(table.column("messageId"))
        payload_bytes.append(pc.sum(pc.binary_length(table.column("payload"))).as_py() or 0)

    def progress(p: Any) -> None:
        seen[0] += p.num_input_rows
        if p.num_input_rows and seen[0] >= n and not last_rows:
            last_rows.append(time.perf_counter())

    t0 = time.perf_counter()
    q = hr.read_stream.format(fmt).options(opts).load().write_stream.foreach_batch(batch) \
        .on_progress(progress).option("checkpointLocation", chk).trigger(available_now=True).start()  # fmt: skip
    q.await_termination()
    elapsed = time.perf_counter() - t0
    rows = sum(p["numInputRows"] for p in q.recent_progress)
    distinct = pc.count_distinct(pa.chunked_array([c for a in ids for c in a.chunks], pa.string())).as_py()
    assert distinct == rows, (distinct, rows)
    assert sum(payload_bytes) == rows * _SIZE, "payloads differ from what was published"
    to_last = (last_rows[0] - t0) if last_rows else elapsed
    return rows / elapsed, rows, rows / to_last


def _register_baseline(src_dir: str) -> str:
    """Register the pubsub plugin found in ``src_dir`` (e.g. another checkout's
    ``plugins/pubsub/src``) as the connector ``pubsub_baseline``, so the same process runs both
    versions on the same emulator, interleaved. Its package is copied to a temp folder as
    ``headrace_pubsub_baseline`` (imports rewritten); it uses this checkout's option declarations."""
    import re
    import shutil

    from headrace.plugins import PLUGIN_API_VERSION, ConnectorSpec, hookimpl
    from headrace.plugins.discovery import registry
    from headrace_pubsub._options import SOURCE_OPTIONS

    root = tempfile.mkdtemp(prefix="bench-pubsub-baseline-")
    dest = os.path.join(root, "headrace_pubsub_baseline")
    shutil.copytree(os.path.join(src_dir, "headrace_pubsub"), dest)
    for name in os.listdir(dest):
        if name.endswith(".py"):
            path = os.path.join(dest, name)
            with open(path) as f:
                text = re.sub(r"\bheadrace_pubsub\b", "headrace_pubsub_baseline", f.read())
            with open(path, "w") as f:
                f.write(text)
    sys.path.insert(0, root)

    class _Baseline:
        @hookimpl
        def headrace_connectors(self) -> list[ConnectorSpec]:
            return [ConnectorSpec(name="pubsub_baseline", source="headrace_pubsub_baseline.source:PubSubSource",
                                  source_options=SOURCE_OPTIONS, description=f"pubsub source from {src_dir}",
                                  api_version=PLUGIN_API_VERSION)]  # fmt: skip

    registry().register_module(_Baseline(), distribution=f"bench baseline ({src_dir})")
    __import__("headrace_pubsub_baseline.source")  # import cost outside the timings
    return "pubsub_baseline"


def _emulator_cpu(emu: PubSubEmulator) -> float:
    """CPU seconds (user + sys) the emulator's JVM has used so far."""
    with open(f"/proc/{emu.pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _measured(emu: PubSubEmulator, fn: Any, *args: Any) -> tuple[Any, float, float]:
    """``fn(*args)`` and the CPU seconds it cost this process and the emulator."""
    r0, e0 = resource.getrusage(resource.RUSAGE_SELF), _emulator_cpu(emu)
    out = fn(*args)
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    return out, r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime, _emulator_cpu(emu) - e0


def bench_plain_publish(emu: PubSubEmulator, topic: str, n: int, size: int) -> float:
    from google.cloud import pubsub_v1

    pub = emu.publisher(batch_settings=pubsub_v1.types.BatchSettings(max_messages=100, max_latency=0.01))
    t0 = time.perf_counter()
    futures = [pub.publish(topic, str(i).encode().ljust(size, b" "), value=str(i)) for i in range(n)]
    for f in futures:
        f.result()
    elapsed = time.perf_counter() - t0
    pub.transport.close()
    return n / elapsed


_SIZE = 100


def _to_message(table: pa.Table) -> pa.Table:
    values = table.column("value").to_pylist()
    return pa.table({
        "data": pa.array([str(v).encode().ljust(_SIZE, b" ") for v in values], pa.binary()),
        "attributes": pa.array([[("value", str(v))] for v in values], pa.map_(pa.string(), pa.string())),
    })  # fmt: skip


def bench_headrace_sink(emu: PubSubEmulator, topic_id: str, n: int) -> float:
    import headrace as hr

    chk = tempfile.mkdtemp(prefix="bench-pubsub-sink-")
    t0 = time.perf_counter()
    q = hr.read_stream.format("rate-micro-batch").options(rowsPerBatch=5000, totalRows=n).load() \
        .map_batches(_to_message).write_stream.format("pubsub") \
        .options(projectId=PROJECT, topicId=topic_id, endpoint=emu.host, batchMaxMessages=100, batchMaxLatency="10 ms") \
        .option("checkpointLocation", chk).trigger(available_now=True).start()  # fmt: skip
    q.await_termination()
    return n / (time.perf_counter() - t0)


def bench_source(emu: PubSubEmulator, pub: Any, n: int, size: int, rounds: int, partitions: int, idle_ms: int,
                 baseline: str | None = None) -> None:  # fmt: skip
    sub_client = emu.subscriber()
    topic_id = _name("bench")
    topic = f"projects/{PROJECT}/topics/{topic_id}"
    pub.create_topic(name=topic)
    subs = {k: _name(k) for k in ("stream", "warm-unary", "warm-headrace", "warm-baseline")}
    for r in range(rounds):
        subs[f"unary{r}"], subs[f"drain{r}"], subs[f"headrace{r}"] = _name("unary"), _name("drain"), _name("headrace")
        subs[f"baseline{r}"] = _name("baseline")
    for s in subs.values():  # every subscription alike
        sub_client.create_subscription(name=f"projects/{PROJECT}/subscriptions/{s}", topic=topic, ack_deadline_seconds=60)
    _publish(emu, topic, n, size)
    path = f"projects/{PROJECT}/subscriptions/"
    idle = f"{idle_ms} ms"
    stream = bench_streaming_pull(emu, path + subs["stream"], n)
    # warm-up of both (the emulator's JIT; pyarrow's first pa.array imports pandas, ~0.5 s), not counted
    bench_unary_pull(emu, path + subs["warm-unary"], n)
    bench_headrace_source(emu, topic_id, subs["warm-headrace"], n, partitions, idle)
    fmt_b = _register_baseline(baseline) if baseline else None
    if fmt_b:
        bench_headrace_source(emu, topic_id, subs["warm-baseline"], n, partitions, idle, fmt_b)
    unarys, drains, hrs, hr_last, cpu_u, cpu_h = [], [], [], [], [], []
    bases: list[float] = []
    cpu_b: list[tuple[float, float]] = []
    for r in range(rounds):  # interleaved rounds, the order flipped every other round; medians: the machine is shared
        def unary(r: int = r) -> None:
            rate, py, jvm = _measured(emu, bench_unary_pull, emu, path + subs[f"unary{r}"], n)
            unarys.append(rate)
            cpu_u.append((py, jvm))
            drains.append(bench_unary_drain(emu, path + subs[f"drain{r}"], n, idle_ms / 1000))

        def headrace(r: int = r) -> None:
            (rate, rows, to_last), py, jvm = _measured(emu, bench_headrace_source, emu, topic_id, subs[f"headrace{r}"],
                                                       n, partitions, idle)  # fmt: skip
            assert rows == n, (rows, n)
            hrs.append(rate)
            hr_last.append(to_last)
            cpu_h.append((py, jvm))

        def base(r: int = r) -> None:
            if fmt_b:
                (rate, rows, _), py, jvm = _measured(emu, bench_headrace_source, emu, topic_id, subs[f"baseline{r}"],
                                                     n, partitions, idle, fmt_b)  # fmt: skip
                assert rows == n, (rows, n)
                bases.append(rate)
                cpu_b.append((py, jvm))

        for side in (unary, headrace, base) if r % 2 == 0 else (base, headrace, unary):
            side()
    unary_m, drain_m, hr_m, last_m = (statistics.median(v) for v in (unarys, drains, hrs, hr_last))
    print(f"source ({n} msgs of {size} B, numFetchPartitions={partitions}, fetchIdleTimeout {idle}; medians of "
          f"{rounds} interleaved rounds after one warm-up each; load average {os.getloadavg()[0]:.2f}):")  # fmt: skip
    print(f"  plain streaming pull + ack   {stream:10,.0f} msgs/s  (one round)")
    print(f"  plain unary pull + ack       {unary_m:10,.0f} msgs/s  ({' '.join(f'{v:,.0f}' for v in unarys)}; told N)")
    print(f"  same, until {idle_ms} ms idle      {drain_m:10,.0f} msgs/s  ({' '.join(f'{v:,.0f}' for v in drains)}; not told N)")
    print(f"  headrace pubsub -> batch fn  {hr_m:10,.0f} msgs/s  ({' '.join(f'{v:,.0f}' for v in hrs)}; start() to the "
          "end: staged + acked + read back, then finding the end)")  # fmt: skip
    print(f"  headrace to the last message {last_m:10,.0f} msgs/s  ({' '.join(f'{v:,.0f}' for v in hr_last)}; start() to "
          "the progress report of the batch that completed N)")  # fmt: skip
    if bases:
        base_m = statistics.median(bases)
        print(f"  baseline (--baseline-src)    {base_m:10,.0f} msgs/s  ({' '.join(f'{v:,.0f}' for v in bases)}; the same "
              f"run for the other version: {hr_m / base_m:.2f}x; vs told N {base_m / unary_m:.2f}, vs until idle "
              f"{base_m / drain_m:.2f})")  # fmt: skip
    for label, cpu in (("plain", cpu_u), ("headrace", cpu_h), ("baseline", cpu_b)):
        if not cpu:
            continue
        py, jvm = statistics.median(c[0] for c in cpu), statistics.median(c[1] for c in cpu)
        print(f"  CPU {label:9} this process {py:5.2f} s, emulator {jvm:5.2f} s  "
              f"({1e6 * py / n:5.1f} + {1e6 * jvm / n:5.1f} us/msg)")  # fmt: skip
    print(f"  ratio vs streaming pull           {hr_m / stream:5.2f}")
    print(f"  ratio vs unary loop told N        {hr_m / unary_m:5.2f}   (goal >= 0.8; headrace must also find the end)")
    print(f"  ratio vs that loop until idle     {hr_m / drain_m:5.2f}   (both find the end the same way: the like-for-like figure)")
    print(f"  to the last message vs told N     {last_m / unary_m:5.2f}   (both stop at the N-th message: the same work)")


def bench_sink(emu: PubSubEmulator, pub: Any, n: int, size: int, rounds: int) -> None:
    sink_topics = [_name("sink"), _name("sink")]
    for t in sink_topics:
        pub.create_topic(name=f"projects/{PROJECT}/topics/{t}")
    bench_plain_publish(emu, f"projects/{PROJECT}/topics/{sink_topics[0]}", n // 4, size)  # warm-up
    bench_headrace_sink(emu, sink_topics[1], n // 4)
    plains, hr_sinks = [], []
    for _ in range(rounds):
        plains.append(bench_plain_publish(emu, f"projects/{PROJECT}/topics/{sink_topics[0]}", n, size))
        hr_sinks.append(bench_headrace_sink(emu, sink_topics[1], n))
    plain, hr_sink = statistics.median(plains), statistics.median(hr_sinks)
    print(f"sink ({n} msgs of {size} B, batchMaxMessages=100; medians of {rounds} interleaved rounds):")
    print(f"  plain PublisherClient.publish {plain:9,.0f} msgs/s  ({' '.join(f'{v:,.0f}' for v in plains)})")
    print(f"  headrace rate -> pubsub       {hr_sink:9,.0f} msgs/s  ({' '.join(f'{v:,.0f}' for v in hr_sinks)})")
    print(f"  ratio                         {hr_sink / plain:9.2f}   (goal >= 0.8)")


def main() -> None:
    global _SIZE
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=20000, help="messages per run (full size: 100000)")
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--partitions", type=int, default=1, help="numFetchPartitions of the headrace source")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (medians are printed)")
    ap.add_argument("--only", choices=("source", "sink"), help="run one half of the bench")
    ap.add_argument("--baseline-src", metavar="DIR",
                    help="also run the pubsub plugin found in DIR (another checkout's plugins/pubsub/src) in the "
                         "same rounds, for a before/after in one process")  # fmt: skip
    ap.add_argument("--idle-ms", type=int, default=200,
                    help="fetchIdleTimeout of the headrace run and the idle end of the plain loop that finds the end")  # fmt: skip
    args = ap.parse_args()
    n, _SIZE = args.messages, args.size
    emu = PubSubEmulator(project_id=PROJECT)
    emu.start()
    try:
        import headrace_pubsub.source  # noqa: F401  (import cost outside the timings, as for the baselines)

        pub = emu.publisher()
        if args.only != "sink":
            bench_source(emu, pub, n, args.size, args.rounds, args.partitions, args.idle_ms, args.baseline_src)
        if args.only != "source":
            bench_sink(emu, pub, n, args.size, args.rounds)
    finally:
        emu.stop()


if __name__ == "__main__":
    main()
