"""How ``register`` / ``data_source_class`` package a connector for Spark's Python processes."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import threading

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
