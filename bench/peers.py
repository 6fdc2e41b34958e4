"""Peers benchmark: the same workloads through headrace, the raw libraries, dlt and Quix Streams.

    .venv/bin/python bench/peers.py [--rows 200000] [--rounds 3] [--full] [--chart docs/peers.png]

Workloads (every output is checked: row count and a checksum):

- ``json_delta``   JSON-lines files -> a new Delta table (append).
- ``pg_upsert``    Arrow rows (a Parquet file) -> PostgreSQL upsert on the primary key; half the
                   keys exist already.
- ``kafka_pg``     JSON messages on a Kafka topic (16 partitions) -> PostgreSQL upsert.
- ``delta_arrow``  a Delta table (20 commits) -> Arrow in memory.

Systems, each run in its own process (imports before the clock starts), interleaved round by
round, medians of ``--rounds`` after a warm-up round:

- ``headrace``: a streaming query, trigger available_now, from ``start()`` to the end.
- ``raw``: the hand-written loop over the same libraries headrace uses (pyarrow, deltalake,
  psycopg binary COPY + ``INSERT ... ON CONFLICT``, confluent-kafka).
- ``parquet`` (``delta_arrow`` only): the table's files, listed from its log, read with
  ``pyarrow.parquet.read_table`` directly: the limit for a table without deletion vectors.
- ``dlt`` and ``quix`` (Quix Streams): run from a separate virtualenv (``--peers-python``, made
  by ``--install-peers`` at ``bench/.peers-venv``: they pin versions of libraries headrace also
  uses). A peer that is not installed is reported as missing, not faked.
- Stream processors (Bytewax, Pathway, PySpark, Quix Streams, PyFlink) on windowed
  aggregation, ETL and dedup: ``bench/peers_stream.py``.
- PySpark: see ``bench/spark.py`` (Parquet -> Parquet, native vs the adapter). Spark's own
  Delta, JDBC and Kafka connectors are JVM packages fetched from Maven at session start; this
  machine cannot reach Maven, so native Spark is reported as missing for these workloads.

Fairness choices (also in docs/performance.md): every system gets the schema (headrace's
cloudFiles schema given, dlt's columns hinted by its Arrow input, the raw loop knows it);
PostgreSQL has only the primary key index and runs with fsync off (tests/services); the Kafka
mock cluster (librdkafka's, in-process) for everyone, consumers read from the earliest offset;
default thread settings of every library; chunks of 100,000 rows where a system lets you choose.
Prints a table of rows/s and ratios to headrace, and writes a PNG chart with ``--chart``.
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

WORKLOADS = ("json_delta", "pg_upsert", "kafka_pg", "delta_arrow")
SYSTEMS = {
    "json_delta": ("headrace", "raw", "dlt"),
    "pg_upsert": ("headrace", "raw", "dlt"),
    "kafka_pg": ("headrace", "raw", "quix"),
    "delta_arrow": ("headrace", "raw", "parquet"),
}
PEERS = {"dlt": "dlt", "quix": "quixstreams"}
CHUNK = 100_000
DDL = "CREATE TABLE {t} (id bigint PRIMARY KEY, v bigint, s text)"
PARTITIONS = 16  # the mock cluster keeps ~100,000 messages per partition: 1M rows need >= 10


# ---------------------------------------------------------------------------- data
def make_rows(n: int, seed: int = 7) -> Any:
    import numpy as np
    import pyarrow as pa

    ids = np.random.default_rng(seed).permutation(n).astype(np.int64)
    return pa.table({"id": ids, "v": ids * 2, "s": pa.array([f"row-{i}" for i in ids.tolist()])})


def prepare(work: Path, n: int, pg: Any, kafka: Any) -> dict[str, Any]:
    import pyarrow.parquet as pq
    from confluent_kafka import Producer
    from deltalake import write_deltalake

    rows = make_rows(n)
    (work / "json").mkdir()
    files = 20
    per = -(-n // files)
    for f in range(files):
        part = rows.slice(f * per, per)
        lines = [json.dumps(r) for r in part.to_pylist()]
        (work / "json" / f"part-{f:03d}.json").write_text("\n".join(lines) + "\n")
    pq.write_table(rows, work / "rows.parquet")
    delta = str(work / "delta-in")
    for f in range(20):
        write_deltalake(delta, rows.slice(f * per, per), mode="append")
    topic = kafka.create_topic(f"peers-{uuid.uuid4().hex[:6]}", PARTITIONS)
    p = Producer({"bootstrap.servers": kafka.bootstrap_servers, "linger.ms": 20, "batch.num.messages": 10000})
    for i, r in enumerate(rows.to_pylist()):
        while True:
            try:
                p.produce(topic, json.dumps(r).encode(), str(r["id"]).encode(), i % PARTITIONS)
                break
            except BufferError:
                p.poll(0.01)
    p.flush(60)
    return {"n": n, "json": str(work / "json"), "parquet": str(work / "rows.parquet"), "delta": delta,
            "topic": topic, "servers": kafka.bootstrap_servers, "dsn": pg.dsn,
            "schema": {"id": "int64", "v": "int64", "s": "string"}}  # fmt: skip


def reset_table(dsn: str, table: str, prefill_below: int | None) -> None:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {table}")
        conn.execute(DDL.format(t=table))
        if prefill_below:
            conn.execute(f"INSERT INTO {table} SELECT g, 0, 'old' FROM generate_series(0, {prefill_below - 1}) g")
        conn.execute(f"VACUUM ANALYZE {table}")


def check_table(dsn: str, table: str, n: int) -> None:
    import psycopg

    with psycopg.connect(dsn) as conn:
        count, total = conn.execute(f"SELECT count(*), sum(v) FROM {table}").fetchone()  # type: ignore[misc]
    assert (count, total) == (n, n * (n - 1)), f"{table}: {count} rows, sum(v) {total}"


def check_delta(path: str, n: int) -> None:
    import pyarrow.compute as pc
    from deltalake import DeltaTable

    t = DeltaTable(path).to_pyarrow_table(columns=["id"])
    got = (t.num_rows, pc.sum(t["id"]).as_py())
    assert got == (n, n * (n - 1) // 2), f"{path}: {got}"


# ---------------------------------------------------------------------------- workers
def _arrow_schema() -> Any:
    import pyarrow as pa

    return pa.schema([("id", pa.int64()), ("v", pa.int64()), ("s", pa.string())])


def _import_before_the_clock(workload: str) -> None:
    """The modules a headrace run of ``workload`` imports, imported before its clock starts, as
    the raw loop's are: the API, the plugins (found through their entry points: the process-wide
    connector registry, built once per process) and the libraries they import lazily."""
    import importlib
    import importlib.util

    import headrace as hr
    from headrace.plugins import registry

    hr.read_stream  # noqa: B018  (a lazy attribute: imports the API)
    modules = {
        "json_delta": ["headrace_cloudfiles.source", "headrace_delta.sink", "deltalake", "pyarrow.json"],
        "pg_upsert": ["headrace_lakebase", "psycopg"],
        "kafka_pg": ["headrace_kafka.source", "headrace_lakebase", "psycopg", "confluent_kafka", "pyarrow.json"],
        "delta_arrow": ["headrace_delta.source", "deltalake", "pyarrow.parquet", "pyarrow.dataset",
                        "headrace.connectors.foreach"],
    }[workload]
    # the listener plugins' modules, which a query's start imports (the prometheus listener's)
    modules += ["headrace_prometheus.metrics", "headrace_prometheus.server"]
    for m in modules:
        if importlib.util.find_spec(m.partition(".")[0]) is not None:
            importlib.import_module(m)
    connectors = {"json_delta": ("cloudFiles", "delta"), "pg_upsert": ("memory", "lakebase"),
                  "kafka_pg": ("kafka", "lakebase"), "delta_arrow": ("delta",)}[workload]  # fmt: skip
    for name in connectors:
        registry().get(name)


def w_headrace(workload: str, cfg: dict[str, Any], out: str) -> float:
    import pyarrow as pa
    import pyarrow.parquet as pq

    import headrace as hr
    from headrace.testing import memory_stream

    _import_before_the_clock(workload)
    chk = tempfile.mkdtemp(prefix="peers-chk-")
    if workload == "json_delta":
        t0 = time.perf_counter()
        q = (hr.read_stream.format("cloudFiles").schema(_arrow_schema()).option("cloudFiles.format", "json")
             .load(cfg["json"]).write_stream.format("delta").option("checkpointLocation", chk)
             .trigger(available_now=True).start(out))  # fmt: skip
    elif workload == "pg_upsert":
        table = pq.read_table(cfg["parquet"])
        name = f"peers-{uuid.uuid4().hex[:8]}"
        stream = memory_stream(name)
        for b in table.to_batches(max_chunksize=65536):
            stream.add(b)
        t0 = time.perf_counter()
        q = (hr.read_stream.format("memory").option("name", name).load()
             .write_stream.format("lakebase").option("url", cfg["dsn"]).option("dbtable", out)
             .option("upsertkey", "id").option("checkpointLocation", chk).trigger(available_now=True).start())  # fmt: skip
    elif workload == "kafka_pg":
        import pyarrow.json as pj

        schema = _arrow_schema()

        def parse(t: pa.Table) -> pa.Table:
            values = t.column("value").combine_chunks()
            buf = pa.py_buffer(b"\n".join(values.to_pylist()))  # one JSON document per line
            return pj.read_json(pa.BufferReader(buf), parse_options=pj.ParseOptions(explicit_schema=schema))

        t0 = time.perf_counter()
        q = (hr.read_stream.format("kafka").option("kafka.bootstrap.servers", cfg["servers"])
             .option("subscribe", cfg["topic"]).option("startingOffsets", "earliest").load().map_batches(parse)
             .write_stream.format("lakebase").option("url", cfg["dsn"]).option("dbtable", out)
             .option("upsertkey", "id").option("checkpointLocation", chk).trigger(available_now=True).start())  # fmt: skip
    elif workload == "delta_arrow":
        got: list[pa.RecordBatch] = []
        t0 = time.perf_counter()
        q = (hr.read_stream.format("delta").load(cfg["delta"]).write_stream
             .foreach_batch(lambda df, _bid: got.extend(df.to_batches()))
             .option("checkpointLocation", chk).trigger(available_now=True).start())  # fmt: skip
    else:
        raise ValueError(workload)
    q.await_termination()
    dt = time.perf_counter() - t0
    if workload == "delta_arrow":
        t = pa.Table.from_batches(got)
        assert t.num_rows == cfg["n"] and pa.compute.sum(t["id"]).as_py() == cfg["n"] * (cfg["n"] - 1) // 2
    shutil.rmtree(chk, ignore_errors=True)
    return dt


def _copy_upsert(conn: Any, table: Any, target: str) -> None:
    with conn.transaction(), conn.cursor() as cur:
        with cur.copy("COPY stage (id, v, s) FROM STDIN (FORMAT BINARY)") as cp:
            cp.set_types(["int8", "int8", "text"])
            for row in zip(*(c.to_pylist() for c in table.columns), strict=True):
                cp.write_row(row)
        cur.execute(f"INSERT INTO {target} (id, v, s) SELECT id, v, s FROM stage "
                    "ON CONFLICT (id) DO UPDATE SET v = EXCLUDED.v, s = EXCLUDED.s")  # fmt: skip


def w_raw(workload: str, cfg: dict[str, Any], out: str) -> float:
    import psycopg
    import pyarrow as pa
    import pyarrow.json as pj
    import pyarrow.parquet as pq
    from deltalake import DeltaTable, write_deltalake

    if workload == "json_delta":
        schema = _arrow_schema()
        files = sorted(Path(cfg["json"]).iterdir())
        t0 = time.perf_counter()
        opts = pj.ParseOptions(explicit_schema=schema)
        for k in range(0, len(files), 5):  # five files per commit
            write_deltalake(out, pa.concat_tables([pj.read_json(f, parse_options=opts) for f in files[k : k + 5]]),
                            mode="append")  # fmt: skip
        return time.perf_counter() - t0
    if workload == "pg_upsert":
        table = pq.read_table(cfg["parquet"])
        t0 = time.perf_counter()
        with psycopg.connect(cfg["dsn"], autocommit=True) as conn:
            conn.execute(f"CREATE TEMP TABLE stage ON COMMIT DELETE ROWS AS SELECT id, v, s FROM {out} WITH NO DATA")
            for start in range(0, table.num_rows, CHUNK):
                _copy_upsert(conn, table.slice(start, CHUNK), out)
        return time.perf_counter() - t0
    if workload == "kafka_pg":
        from _common import kafka_value_chunks
        from confluent_kafka import Consumer, TopicPartition

        t0 = time.perf_counter()
        c = Consumer({"bootstrap.servers": cfg["servers"], "group.id": uuid.uuid4().hex, "enable.auto.commit": False,
                      "fetch.wait.max.ms": 10, "fetch.queue.backoff.ms": 10})  # fmt: skip
        parts = [TopicPartition(cfg["topic"], p, 0) for p in range(PARTITIONS)]
        ends = {p.partition: c.get_watermark_offsets(p, timeout=10)[1] for p in parts}
        c.assign(parts)
        schema = _arrow_schema()
        with psycopg.connect(cfg["dsn"], autocommit=True) as conn:
            conn.execute(f"CREATE TEMP TABLE stage ON COMMIT DELETE ROWS AS SELECT id, v, s FROM {out} WITH NO DATA")
            for buf in kafka_value_chunks(c, ends, CHUNK, timeout_s=300, what="raw kafka loop"):
                t = pj.read_json(pa.BufferReader(pa.py_buffer(b"\n".join(buf))),
                                 parse_options=pj.ParseOptions(explicit_schema=schema))  # fmt: skip
                _copy_upsert(conn, t, out)
        c.close()
        return time.perf_counter() - t0
    if workload == "delta_arrow":
        import pyarrow.dataset  # noqa: F401  (to_pyarrow_table imports it: before the clock, as headrace's modules)

        t0 = time.perf_counter()
        t = DeltaTable(cfg["delta"]).to_pyarrow_table()
        dt = time.perf_counter() - t0
        assert t.num_rows == cfg["n"]
        return dt
    raise ValueError(workload)


def w_parquet(workload: str, cfg: dict[str, Any], out: str) -> float:
    """The files of the table's latest version (from its log) read with ``pyarrow.parquet``
    directly: the limit for a table without deletion vectors or column mapping."""
    assert workload == "delta_arrow"
    import pyarrow.dataset  # noqa: F401  (pq.read_table of several files uses it)
    import pyarrow.parquet as pq
    from deltalake import DeltaTable

    t0 = time.perf_counter()
    t = pq.read_table(DeltaTable(cfg["delta"]).file_uris())
    dt = time.perf_counter() - t0
    assert t.num_rows == cfg["n"]
    return dt


def w_dlt(workload: str, cfg: dict[str, Any], out: str) -> float:
    import dlt
    import pyarrow.json as pj
    import pyarrow.parquet as pq

    os.environ["RUNTIME__LOG_LEVEL"] = "WARNING"
    pipes = tempfile.mkdtemp(prefix="peers-dlt-")
    if workload == "json_delta":
        schema = _arrow_schema()
        files = sorted(Path(cfg["json"]).iterdir())
        dest_dir, table_name = out + "-dlt", "peers_rows"

        @dlt.resource(name=table_name, table_format="delta", write_disposition="append")
        def rows():  # type: ignore[no-untyped-def]
            for f in files:
                yield pj.read_json(f, parse_options=pj.ParseOptions(explicit_schema=schema))

        t0 = time.perf_counter()
        p = dlt.pipeline(f"peers_{uuid.uuid4().hex[:6]}", pipelines_dir=pipes,
                         destination=dlt.destinations.filesystem(dest_dir), dataset_name="ds")  # fmt: skip
        p.run(rows(), loader_file_format="parquet")
        dt = time.perf_counter() - t0
        # dlt writes <dest>/<dataset>/<table>; point the check there
        shutil.move(os.path.join(dest_dir, "ds", table_name), out)
        shutil.rmtree(dest_dir, ignore_errors=True)
        return dt
    if workload == "pg_upsert":
        table = pq.read_table(cfg["parquet"])
        schema_name, tname = "public", out

        @dlt.resource(name=tname, write_disposition="merge", primary_key="id")
        def rows():  # type: ignore[no-untyped-def]
            for start in range(0, table.num_rows, CHUNK):
                yield table.slice(start, CHUNK)

        t0 = time.perf_counter()
        p = dlt.pipeline(f"peers_{uuid.uuid4().hex[:6]}", pipelines_dir=pipes,
                         destination=dlt.destinations.postgres(cfg["dsn"]), dataset_name=schema_name)  # fmt: skip
        p.run(rows())
        return time.perf_counter() - t0
    raise ValueError(workload)


def w_quix(workload: str, cfg: dict[str, Any], out: str) -> float:
    assert workload == "kafka_pg"
    import psycopg
    from quixstreams import Application
    from quixstreams.sinks.base import BatchingSink, SinkBatch

    class PgUpsert(BatchingSink):  # Quix's documented way to write a custom sink
        def __init__(self) -> None:
            super().__init__()
            self.conn = psycopg.connect(cfg["dsn"], autocommit=True)
            self.conn.execute(f"CREATE TEMP TABLE stage ON COMMIT DELETE ROWS AS SELECT id, v, s FROM {out} WITH NO DATA")
            self.rows = 0

        def write(self, batch: SinkBatch) -> None:
            with self.conn.transaction(), self.conn.cursor() as cur:
                with cur.copy("COPY stage (id, v, s) FROM STDIN (FORMAT BINARY)") as cp:
                    cp.set_types(["int8", "int8", "text"])
                    for item in batch:
                        r = item.value
                        cp.write_row((r["id"], r["v"], r["s"]))
                        self.rows += 1
                cur.execute(f"INSERT INTO {out} (id, v, s) SELECT DISTINCT ON (id) id, v, s FROM stage "
                            "ON CONFLICT (id) DO UPDATE SET v = EXCLUDED.v, s = EXCLUDED.s")  # fmt: skip

    n = cfg["n"]
    sink = PgUpsert()
    t0 = time.perf_counter()
    app = Application(broker_address=cfg["servers"], consumer_group=f"peers-{uuid.uuid4().hex[:6]}",
                      auto_offset_reset="earliest", commit_every=CHUNK, state_dir=tempfile.mkdtemp(),
                      auto_create_topics=False,  # the mock cluster has no Admin API for topic creation
                      consumer_extra_config={"fetch.wait.max.ms": 10, "fetch.queue.backoff.ms": 10,
                                             "session.timeout.ms": 6000, "heartbeat.interval.ms": 500})  # fmt: skip
    sdf = app.dataframe(app.topic(cfg["topic"], value_deserializer="json"))
    sdf.sink(sink)
    app.run(count=n, timeout=120)
    return time.perf_counter() - t0


WORKERS = {"headrace": w_headrace, "raw": w_raw, "parquet": w_parquet, "dlt": w_dlt, "quix": w_quix}


# ---------------------------------------------------------------------------- driver
def peers_python(arg: str | None, install: bool) -> str | None:
    path = arg or str(ROOT / "bench" / ".peers-venv" / "bin" / "python")
    if not os.path.exists(path) and install and arg is None:
        venv = ROOT / "bench" / ".peers-venv"
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "dlt[postgres]", "deltalake", "quixstreams",
                        "psycopg[binary]", "pyarrow", "numpy"], check=False)  # fmt: skip
    return path if os.path.exists(path) else None


def has_module(python: str, module: str) -> bool:
    return subprocess.run([python, "-c", f"import {module}"], capture_output=True).returncode == 0


def run_worker(python: str, workload: str, system: str, cfg: dict[str, Any], out: str) -> float:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p))
    r = subprocess.run([python, str(Path(__file__).resolve()), "--worker", workload, system, json.dumps(cfg), out],
                       capture_output=True, text=True, env=env, timeout=900)  # fmt: skip
    line = next((ln for ln in reversed(r.stdout.splitlines()) if ln.startswith("{")), None)
    if line is None:
        raise RuntimeError(f"{system}/{workload} failed: {r.stderr.strip()[-1500:]}")
    if r.returncode != 0:  # measured and printed, then died at exit (seen: delta-rs threads at teardown)
        print(f"note: {system}/{workload} exited with {r.returncode} after its result: {r.stderr.strip()[-200:]}",
              file=sys.stderr)  # fmt: skip
    return float(json.loads(line)["seconds"])


def one_run(python: str, workload: str, system: str, cfg: dict[str, Any], work: Path, k: str) -> float:
    n = cfg["n"]
    if workload == "json_delta":
        out = str(work / f"delta-{system}-{k}")
        t = run_worker(python, workload, system, cfg, out)
        check_delta(out, n)
        shutil.rmtree(out, ignore_errors=True)
        return t
    if workload in ("pg_upsert", "kafka_pg"):
        table = f"peers_{system}_{k}"
        reset_table(cfg["dsn"], table, n // 2 if workload == "pg_upsert" else None)
        t = run_worker(python, workload, system, cfg, table)
        check_table(cfg["dsn"], table, n)
        return t
    return run_worker(python, workload, system, cfg, "")


def chart(results: dict[str, dict[str, float]], path: str, n: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    systems = ["headrace", "raw", "parquet", "dlt", "quix"]
    colors = {"headrace": "#1f77b4", "raw": "#7f7f7f", "parquet": "#bcbd22", "dlt": "#ff7f0e", "quix": "#2ca02c"}
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.17
    for i, s in enumerate(systems):
        xs = [w for w in range(len(WORKLOADS)) if s in results.get(WORKLOADS[w], {})]
        ys = [results[WORKLOADS[w]][s] / 1000 for w in xs]
        if xs:
            ax.bar([x + (i - 2) * width for x in xs], ys, width, label=s, color=colors[s])
    labels = {"json_delta": "JSON files -> Delta", "pg_upsert": "PostgreSQL upsert", "kafka_pg": "Kafka -> PostgreSQL",
              "delta_arrow": "Delta -> Arrow"}  # fmt: skip
    ax.set_xticks(range(len(WORKLOADS)), [labels[w] for w in WORKLOADS])
    ax.set_ylabel("thousand rows/s (higher is better)")
    ax.set_yscale("log")
    ax.set_title(f"headrace and peers, {n:,} rows, medians of interleaved runs (2 shared cores)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--full", action="store_true", help="1,000,000 rows")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--peers-python", help="the interpreter with dlt / quixstreams (default bench/.peers-venv)")
    ap.add_argument("--install-peers", action="store_true", help="create bench/.peers-venv with dlt and quixstreams")
    ap.add_argument("--chart", help="write a PNG chart here (needs matplotlib)")
    ap.add_argument("--json", help="also write the rates (rows/s) here, as JSON")
    ap.add_argument("--chart-from", help="only draw --chart from a --json file of an earlier run")
    args = ap.parse_args()
    if args.chart_from:
        doc = json.loads(Path(args.chart_from).read_text())
        chart(doc["rates"], args.chart or "peers.png", int(doc["rows"]))
        return
    n = 1_000_000 if args.full else args.rows
    from tests.services import KafkaMock, Postgres

    peer_py = peers_python(args.peers_python, args.install_peers)
    pythons = {"headrace": sys.executable, "raw": sys.executable, "parquet": sys.executable}
    missing: dict[str, str] = {}
    for system, module in PEERS.items():
        if peer_py is not None and has_module(peer_py, module):
            pythons[system] = peer_py
        else:
            missing[system] = f"{module} not installed (run with --install-peers, or --peers-python PATH)"
    work = Path(tempfile.mkdtemp(prefix="peers-"))
    kafka = KafkaMock()
    kafka.start()
    try:
        with Postgres() as pg:
            cfg = prepare(work, n, pg, kafka)
            times: dict[str, dict[str, list[float]]] = {}
            failed: dict[str, str] = {}
            for workload in args.workloads.split(","):
                systems = [s for s in SYSTEMS[workload] if s in pythons]
                for r in range(args.rounds + 1):
                    for s in systems:
                        key = f"{s}/{workload}"
                        if key in failed:
                            continue
                        try:
                            t = one_run(pythons[s], workload, s, cfg, work, f"{r}")
                        except Exception as e:  # reported, not hidden
                            failed[key] = str(e).splitlines()[-1][:300]
                            continue
                        if r:
                            times.setdefault(workload, {}).setdefault(s, []).append(t)
    finally:
        kafka.stop()
        shutil.rmtree(work, ignore_errors=True)
    rates = {w: {s: n / statistics.median(v) for s, v in d.items()} for w, d in times.items()}
    print(f"peers: {n:,} rows per workload; medians of {args.rounds} interleaved rounds after a warm-up; "
          "each run in its own process; every output checked")  # fmt: skip
    print(f"{'workload':12s} {'system':9s} {'rows/s':>12s} {'headrace / system':>18s}")
    for w, d in rates.items():
        for s, rate in sorted(d.items(), key=lambda kv: -kv[1]):
            ratio = d["headrace"] / rate if "headrace" in d else float("nan")
            print(f"{w:12s} {s:9s} {rate:12,.0f} {ratio:18.2f}")
    for s, why in missing.items():
        print(f"missing: {s}: {why}")
    print("missing: pyspark native: Delta/JDBC/Kafka connectors are JVM packages from Maven (not reachable here); "
          "see bench/spark.py for Spark native vs the adapter on Parquet")  # fmt: skip
    for k, why in failed.items():
        print(f"failed: {k}: {why}")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": n, "rates": rates}, indent=1) + "\n")
    if args.chart and rates:
        chart(rates, args.chart, n)
        print(f"chart: {args.chart}")


def worker_main(argv: list[str]) -> None:
    workload, system, cfg, out = argv
    seconds = WORKERS[system](workload, json.loads(cfg), out)
    print(json.dumps({"seconds": seconds}))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker_main(sys.argv[2:])
    else:
        main()
