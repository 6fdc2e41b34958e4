"""Benchmark: JSON messages on Kafka -> typed columns -> a filter -> Delta append, headrace vs
the hand-written loop over the same libraries, same broker, same run. Run from the repo root:
``.venv/bin/python bench/kafka_json_delta.py [--rows 1000000] [--rounds 3]``.

The input: ``--rows`` JSON messages (``{"id": .., "v": .., "s": ".."}``) over 16 partitions of
a topic on librdkafka's mock cluster (tests/services; the same broker for every system).

- ``headrace``: ``kafka`` source (``startingOffsets=earliest``, ``available_now``) ->
  ``map_batches(FromJson("value", "id BIGINT, v BIGINT, s STRING"))`` (the documented way to
  type a broker's JSON, with the bad-record policy ``fail``) -> ``filter("v % 10 <> 3")`` (no
  watermark) -> ``delta`` sink; timed from ``start()`` to the end, checkpoint included.
- ``raw``: confluent-kafka ``consume`` -> ``pyarrow.json.read_json`` of the values joined by
  newlines -> a numpy mask filter -> ``deltalake.write_deltalake`` every 100,000
  messages (about headrace's batch: one Delta commit each); timed from the consumer's
  creation. No checkpoint of offsets (headrace keeps one: exactly once).

Each system runs in its own process (imports before the clock), interleaved round by round
after a warm-up round; the medians, the best and the CPU time of each process are printed
with the load average. Every output table is checked: row count and ``sum(id)`` equal to
the expected ones. Quix Streams and Bytewax are not installed in this environment (they pin
versions of libraries headrace also uses: see bench/peers.py's ``--install-peers``); they are
reported as missing, never estimated. Asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PARTITIONS = 16
CHUNK = 100_000
SCHEMA_DDL = "id BIGINT, v BIGINT, s STRING"
KEEP = "v % 10 <> 3"


def fill(servers: str, topic: str, n: int) -> None:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": servers, "linger.ms": 20, "batch.num.messages": 10000})
    for i in range(n):
        msg = json.dumps({"id": i, "v": (i * 7) % 1000, "s": f"row-{i}"}).encode()
        while True:
            try:
                p.produce(topic, msg, None, i % PARTITIONS)
                break
            except BufferError:
                p.poll(0.01)
    p.flush(120)


def expected(n: int) -> tuple[int, int]:
    import numpy as np

    ids = np.arange(n, dtype=np.int64)
    keep = ((ids * 7) % 1000) % 10 != 3
    return int(keep.sum()), int(ids[keep].sum())


def w_headrace(cfg: dict[str, Any], out: str) -> tuple[float, float]:
    import headrace as hr
    from headrace.transforms.from_json import FromJson

    chk = tempfile.mkdtemp(prefix="bench-kjd-chk-")
    _import_before_the_clock()
    before = set(sys.modules)
    t0, c0 = time.perf_counter(), time.process_time()
    q = (hr.read_stream.format("kafka").option("kafka.bootstrap.servers", cfg["servers"])
         .option("subscribe", cfg["topic"]).option("startingOffsets", "earliest").load()
         .map_batches(FromJson("value", SCHEMA_DDL)).select("id", "v", "s").filter(KEEP)
         .write_stream.format("delta").option("checkpointLocation", chk).trigger(available_now=True).start(out))  # fmt: skip
    q.await_termination()
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    late = sorted(m for m in set(sys.modules) - before if not m.startswith("_"))
    if late:  # the rule is imports before the clock: say which ones were not
        print(f"headrace imported inside its clock: {', '.join(late)}", file=sys.stderr)
    shutil.rmtree(chk, ignore_errors=True)
    return dt, cpu


def _import_before_the_clock() -> None:
    """The modules a headrace run imports, imported before its clock starts, as the raw loop's
    are: the plugins (found through their entry points: the connector registry is built once per
    process), the libraries they import lazily and the SQL layer's (sqlglot, DuckDB)."""
    import importlib

    import headrace as hr
    from headrace.plugins import registry

    hr.read_stream  # noqa: B018  (a lazy attribute: imports the API)
    for m in ("headrace_kafka.source", "headrace_delta.sink", "confluent_kafka", "confluent_kafka.admin", "deltalake",
              "pyarrow.json", "headrace._buffers", "headrace.functions", "headrace.transforms.spark_sql", "headrace.transforms.arrow_eval",
              "sqlglot", "sqlglot.dialects.spark", "sqlglot.dialects.duckdb", "sqlglot.optimizer.annotate_types",
              "duckdb", "headrace_prometheus.metrics", "headrace_prometheus.server"):  # fmt: skip
        try:
            importlib.import_module(m)
        except ImportError:  # an optional plugin (prometheus) not installed
            pass
    for name in ("kafka", "delta"):
        registry().get(name)


def w_raw(cfg: dict[str, Any], out: str) -> tuple[float, float]:
    import pyarrow as pa
    import pyarrow.json as pj
    from confluent_kafka import Consumer, TopicPartition
    from deltalake import write_deltalake

    schema = pa.schema([("id", pa.int64()), ("v", pa.int64()), ("s", pa.string())])
    opts = pj.ParseOptions(explicit_schema=schema)
    t0, c0 = time.perf_counter(), time.process_time()
    c = Consumer({"bootstrap.servers": cfg["servers"], "group.id": uuid.uuid4().hex, "enable.auto.commit": False,
                  "fetch.wait.max.ms": 10, "fetch.queue.backoff.ms": 10})  # fmt: skip
    parts = [TopicPartition(cfg["topic"], p, 0) for p in range(PARTITIONS)]
    ends = {p.partition: c.get_watermark_offsets(p, timeout=10)[1] for p in parts}
    c.assign(parts)
    pos = dict.fromkeys(ends, 0)
    buf: list[bytes] = []
    deadline = time.monotonic() + 600
    while any(pos[p] < ends[p] for p in ends):
        if time.monotonic() > deadline:
            raise TimeoutError(f"raw loop: stuck at {pos} of {ends}")
        for m in c.consume(10000, timeout=1.0):
            if m.error() is None:
                buf.append(m.value())
                pos[m.partition()] = m.offset() + 1
        if len(buf) >= CHUNK or (buf and all(pos[p] >= ends[p] for p in ends)):
            t = pj.read_json(pa.BufferReader(pa.py_buffer(b"\n".join(buf))), parse_options=opts)
            v = t.column("v").to_numpy()
            t = t.filter(pa.array(v % 10 != 3))
            write_deltalake(out, t, mode="append")
            buf = []
    c.close()
    return time.perf_counter() - t0, time.process_time() - c0


WORKERS = {"headrace": w_headrace, "raw": w_raw}


def run_worker(system: str, cfg: dict[str, Any], out: str) -> tuple[float, float]:
    r = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--worker", system, json.dumps(cfg), out],
                       capture_output=True, text=True, timeout=1800, cwd=ROOT)  # fmt: skip
    line = next((ln for ln in reversed(r.stdout.splitlines()) if ln.startswith("{")), None)
    if line is None:
        raise RuntimeError(f"{system} failed: {r.stderr.strip()[-1500:]}")
    for ln in r.stderr.splitlines():
        if "inside its clock" in ln:
            print(f"  ({ln})")
    got = json.loads(line)
    return float(got["seconds"]), float(got["cpu"])


def check(out: str, want: tuple[int, int]) -> None:
    import pyarrow.compute as pc
    from deltalake import DeltaTable

    t = DeltaTable(out).to_pyarrow_table(columns=["id"])
    got = (t.num_rows, int(pc.sum(t["id"]).as_py() or 0))
    assert got == want, f"{out}: {got} rows/sum(id), expected {want}"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        system, cfg, out = args.worker[0], json.loads(args.worker[1]), args.worker[2]
        dt, cpu = WORKERS[system](cfg, out)
        print(json.dumps({"seconds": dt, "cpu": cpu}))
        sys.stdout.flush()
        os._exit(0)  # (delta-rs threads at interpreter teardown)
    from tests.services import KafkaMock

    kafka = KafkaMock()
    kafka.start()
    try:
        topic = kafka.create_topic(f"kjd-{uuid.uuid4().hex[:6]}", PARTITIONS)
        fill(kafka.bootstrap_servers, topic, args.rows)
        cfg = {"servers": kafka.bootstrap_servers, "topic": topic, "n": args.rows}
        want = expected(args.rows)
        times: dict[str, list[tuple[float, float]]] = {s: [] for s in WORKERS}
        with tempfile.TemporaryDirectory() as w:
            for k in range(args.rounds + 1):  # round 0 warms up (page cache, broker)
                for system in WORKERS:
                    out = os.path.join(w, f"{system}-{k}")
                    got = run_worker(system, cfg, out)
                    check(out, want)
                    shutil.rmtree(out, ignore_errors=True)
                    if k:
                        times[system].append(got)
        load = os.getloadavg()
    finally:
        kafka.stop()
    print(f"Kafka JSON -> from_json -> filter -> Delta: {args.rows:,} messages, {PARTITIONS} partitions, "
          f"{want[0]:,} rows out; median / best of {args.rounds}, interleaved, each in its own process; "
          f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} CPUs")  # fmt: skip
    med = {s: statistics.median(t for t, _ in v) for s, v in times.items()}
    best = {s: min(t for t, _ in v) for s, v in times.items()}
    cpu = {s: statistics.median(c for _, c in v) for s, v in times.items()}
    for s in WORKERS:
        print(f"  {s:10s} {args.rows / med[s]:12,.0f} msgs/s median, {args.rows / best[s]:12,.0f} best, "
              f"CPU {cpu[s]:.2f} s")  # fmt: skip
    print(f"  headrace / raw: {med['raw'] / med['headrace']:.2f} (median), {best['raw'] / best['headrace']:.2f} (best), "
          f"{cpu['raw'] / cpu['headrace']:.2f} (CPU); goal >= 1.0")  # fmt: skip
    print("  quix, bytewax: not in this bench yet (no figure); bench/peers_stream.py runs both from their own virtualenvs on other workloads")


if __name__ == "__main__":
    main()
