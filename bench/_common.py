"""What several benches share: the CPU seconds of a process tree, a local PySpark session for
the benches that compare with Spark Structured Streaming, and running a bench's worker in a
process of its own (another interpreter: a peer's virtualenv). Imported by the bench scripts
(run as ``python bench/<name>.py``, so this folder is on ``sys.path``) and, as
``bench._common``, by scripts/conformance.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

__all__ = ["run_worker_process", "spark_session", "tree_cpu"]

ROOT = Path(__file__).resolve().parent.parent

_TICK = os.sysconf("SC_CLK_TCK")


def tree_cpu() -> float:
    """CPU seconds (user + system, reaped children included) of this process and every
    descendant: the JVM, PySpark's daemon and its Python workers. Less sensitive than wall time
    to other work on a shared machine. Without ``/proc``: this process and its ended children."""
    if not os.path.isdir("/proc"):
        return sum(os.times()[:4])
    stats: dict[int, tuple[int, int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            stats[int(d)] = (int(fields[1]), sum(int(x) for x in fields[11:15]))
    kids: dict[int, list[int]] = {}
    for pid, (ppid, _) in stats.items():
        kids.setdefault(ppid, []).append(pid)
    total, todo = 0, [os.getpid()]
    while todo:
        p = todo.pop()
        total += stats.get(p, (0, 0))[1]
        todo.extend(kids.get(p, []))
    return total / _TICK


def kafka_value_chunks(consumer: Any, ends: dict[int, int], chunk: int, *, timeout_s: float,
                       what: str) -> Iterator[list[bytes]]:  # fmt: skip
    """The raw loops' Kafka read: every message value before ``ends`` (partition -> end
    offset) of a consumer assigned those partitions from offset 0, ``chunk`` values at a time
    (the last chunk smaller). Raises ``TimeoutError`` naming ``what`` after ``timeout_s``."""
    pos = dict.fromkeys(ends, 0)
    buf: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    while any(pos[p] < ends[p] for p in ends):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: stuck at {pos} of {ends}")
        for m in consumer.consume(10000, timeout=1.0):
            value, part, off = m.value(), m.partition(), m.offset()
            if m.error() is None and value is not None and part is not None and off is not None:
                buf.append(value)
                pos[part] = off + 1
        if len(buf) >= chunk or (buf and all(pos[p] >= ends[p] for p in ends)):
            yield buf
            buf = []


def spark_session(app: str, driver_memory: str = "2g", *, rocksdb_state: bool = True) -> Any:
    """A ``local[2]`` PySpark session in UTC, 2 shuffle partitions and no UI, with RocksDB state
    (or Spark's default store: ``rocksdb_state=False``); None when Java or pyspark is missing."""
    java = os.environ.get("JAVA_HOME") or "/usr/lib/jvm/java-17-openjdk-amd64"
    if not Path(java, "bin", "java").exists():
        return None
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        return None
    os.environ["JAVA_HOME"] = java
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["TZ"] = "UTC"
    builder = (SparkSession.builder.master("local[2]").appName(app)
               .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "2").config("spark.sql.session.timeZone", "UTC")
               .config("spark.driver.memory", driver_memory))  # fmt: skip
    if rocksdb_state:
        builder = builder.config("spark.sql.streaming.stateStore.providerClass",
                                 "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider")  # fmt: skip
    s = builder.getOrCreate()
    s.sparkContext.setLogLevel("ERROR")
    return s


def run_worker_process(python: str, script: str, args: Sequence[str], *, what: str, peer: bool = False,
                       extra_env: dict[str, str] | None = None, timeout: float = 3600) -> tuple[dict[str, Any], str]:  # fmt: skip
    """Run ``python script --worker *args`` from the repo root and wait for it: the JSON objects
    its stdout prints one a line (merged) and its stderr. ``peer``: a peer's own virtualenv, so
    this checkout's PYTHONPATH is not passed on. Raises RuntimeError with the end of stderr when
    the worker printed no ``seconds`` (it failed)."""
    env = dict(os.environ, **(extra_env or {}))
    if peer:
        env.pop("PYTHONPATH", None)
    r = subprocess.run([python, script, "--worker", *args], capture_output=True, text=True, env=env,
                       timeout=timeout, cwd=ROOT)  # fmt: skip
    got: dict[str, Any] = {}
    for ln in r.stdout.splitlines():
        if ln.startswith("{"):
            got.update(json.loads(ln))
    if "seconds" not in got:
        raise RuntimeError(f"{what} failed: {r.stderr.strip()[-800:]}")
    return got, r.stderr
