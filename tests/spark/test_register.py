"""How ``register`` / ``data_source_class`` package a connector for Spark's Python processes."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import headrace.spark
from headrace.options import OptionSchema
from headrace.plugins import registry

pytestmark = pytest.mark.spark


def test_installed_connector_carries_its_spec() -> None:
    cls = headrace.spark.data_source_class("files")
    assert cls.inline_spec is not None and cls.inline_spec.name == "files"
    assert cls.connector_spec() is cls.inline_spec  # no plugin discovery in Spark's processes


def test_spec_survives_cloudpickle_in_a_fresh_interpreter_without_plugin_discovery() -> None:
    from pyspark import cloudpickle

    blob = cloudpickle.dumps(headrace.spark.data_source_class("files"))
    code = (
        "import pickle, sys\n"
        "import headrace.plugins as p\n"
        "p.Registry._ensure_loaded = lambda self: (_ for _ in ()).throw(AssertionError('plugin discovery ran'))\n"
        "cls = pickle.loads(sys.stdin.buffer.read())\n"
        "spec = cls.connector_spec()\n"
        "assert spec.name == 'files' and spec.load_sink().__name__ == 'FilesSink', spec\n"
    )
    done = subprocess.run([sys.executable, "-c", code], input=blob, capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()


def test_unpicklable_installed_spec_is_looked_up_by_name() -> None:
    schema = OptionSchema()
    schema.lock = threading.Lock()  # type: ignore[attr-defined]  # a live object: cloudpickle refuses it
    spec = dataclasses.replace(registry().get("files"), sink_options=schema)
    cls = headrace.spark.data_source_class(spec)
    assert cls.inline_spec is None and cls.connector == "files"
    assert cls.connector_spec() is registry().get("files")


def test_the_streaming_source_runner_imports_only_the_read_side(tmp_path: Path) -> None:
    """Spark starts a fresh Python process per streaming query to run the source (its streaming
    source runner); unpickling the data source and starting the reader there must not import
    headrace's engine, transforms, the sink side, plugin discovery or pyarrow.compute (each tens of
    milliseconds in every query start)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyspark import cloudpickle
    from pyspark.sql.types import LongType, StructField, StructType

    src = tmp_path / "in"
    src.mkdir()
    pq.write_table(pa.table({"id": pa.array([1, 2, 3], pa.int64())}), src / "a.parquet")
    cls = headrace.spark.data_source_class("cloudFiles", max_tasks=1)
    source = cls({"cloudfiles.format": "parquet", "cloudfiles.schemalocation": str(tmp_path / "schema"),
                  "headracestatepath": str(tmp_path / "state"), "path": str(src)})  # fmt: skip
    blob = cloudpickle.dumps((source, StructType([StructField("id", LongType())])))
    code = (
        "import pickle, sys\n"
        "import pyspark.sql.streaming.python_streaming_source_runner as runner\n"
        "before = set(sys.modules)\n"
        "source, schema = pickle.loads(sys.stdin.buffer.read())\n"
        "reader = runner._streamReader(source, schema)\n"
        "reader.prepareForTriggerAvailableNow()\n"
        "start = reader.initialOffset()\n"
        "end = reader.latestOffset(start, reader.getDefaultReadLimit())\n"
        "assert len(reader.partitions(start, end)) == 1\n"
        "reader.stop()\n"
        "heavy = ('headrace.engine', 'headrace.transforms', 'headrace.api', 'headrace.spark.sink', 'pyarrow.compute',\n"
        "         'pluggy', 'importlib.metadata', 'duckdb')\n"
        "print(sorted(m for m in set(sys.modules) - before if m.startswith(heavy)))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], input=blob, capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.decode().strip() == "[]", done.stdout.decode()
