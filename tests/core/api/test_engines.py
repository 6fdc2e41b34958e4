"""The engine seam: ``start(path, engine=obj)`` hands the definition to a ``QueryEngine``,
given directly or made by the plugin engine whose ``EngineSpec`` accepts ``obj``'s type; the
api never imports an engine (Spark's included)."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

import headrace as hr
from headrace.api.engines import QueryEngine, query_engine
from headrace.api.writer import DataStreamWriter
from headrace.errors import HeadraceError, PluginError
from headrace.plugins import EngineSpec, Registry, discovery, hookimpl, registry


class RecordingEngine:
    """A query engine that records what it was asked to start."""

    def __init__(self, session: Any = None) -> None:
        self.session = session
        self.started: list[tuple[DataStreamWriter, str | None]] = []

    def start_query(self, writer: DataStreamWriter, path: str | None) -> Any:
        self.started.append((writer, path))
        return ("started", writer._format, path)


class Session:
    """What a user of the plugin's engine passes as ``engine=``."""


class SessionSubclass(Session):
    pass


def make_engine(session: Any) -> RecordingEngine:
    return RecordingEngine(session)


class EnginePlugin:
    @hookimpl
    def headrace_engines(self) -> list[EngineSpec]:
        return [EngineSpec(name="recording", accepts=(f"{__name__}.Session",), factory=f"{__name__}:make_engine",
                           description="a tests Session")]  # fmt: skip


def _writer() -> DataStreamWriter:
    return (
        hr.read_stream.format("rate-micro-batch").option("rowsPerBatch", 1).load().write_stream.format("noop")
    )


def test_a_query_engine_given_directly_starts_the_query() -> None:
    engine = RecordingEngine()
    assert isinstance(engine, QueryEngine)
    w = _writer()
    assert w.start("/out", engine=engine) == ("started", "noop", "/out")
    assert engine.started == [(w, "/out")]


@pytest.mark.parametrize("session_class", [Session, SessionSubclass], ids=["its-class", "a-subclass"])
def test_a_plugin_engine_takes_the_objects_it_accepts(
    monkeypatch: pytest.MonkeyPatch, session_class: type
) -> None:
    writer = _writer()
    reg = Registry(load_entry_points=False)
    reg.register_module(EnginePlugin(), "tests-engine")
    monkeypatch.setattr(discovery, "_registry", reg)
    session = session_class()
    engine = query_engine(session)
    assert isinstance(engine, RecordingEngine) and engine.session is session
    assert reg.engines()[0].distribution == "tests-engine"
    assert writer.start(engine=session) == ("started", "noop", None)


def test_an_object_no_engine_accepts_is_refused_naming_what_engine_takes() -> None:
    with pytest.raises(HeadraceError, match=r"start\(engine=str\): engine is a SparkSession or "
                                            r"headrace\.spark\.engine\.SparkEngine, or an object with start_query"):  # fmt: skip
        _writer().start(engine="spark")


def test_the_core_registers_spark_without_importing_it() -> None:
    spark = next(e for e in registry().engines() if e.name == "spark")
    assert spark.accepts == ("pyspark.sql.session.SparkSession", "pyspark.sql.connect.session.SparkSession")
    assert spark.factory == "headrace.spark.engine:as_engine" and spark.distribution == "headrace"
    assert not spark.takes("a string")
    code = ("import sys; from headrace.plugins import registry; assert registry().engines(); "
            "print(sorted(m for m in sys.modules if m.startswith(('pyspark', 'headrace.spark'))))")  # fmt: skip
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "[]"


def test_a_broken_engine_factory_is_a_plugin_error() -> None:
    spec = EngineSpec(name="broken", accepts=("x.Y",), factory=f"{__name__}:no_such_function")
    with pytest.raises(
        PluginError, match=r"query engine 'broken': tests\.core\.api\.test_engines has no 'no_such_function'"
    ):
        spec.load_factory()
    missing = EngineSpec(name="far", accepts=("x.Y",), factory="far_engine:make", requires=("far_engine_lib",),
                         install_hint="pip install far-engine")  # fmt: skip
    with pytest.raises(
        PluginError, match="needs far_engine_lib, which is not installed; fix: pip install far-engine"
    ):
        missing.load_factory()
