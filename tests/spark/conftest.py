"""One local SparkSession (``local[2]``) for the whole test session, with headrace registered.

Skips the Spark tests, saying what to install, only when pyspark or a Java runtime is missing.
Spark's Python workers import the test connectors from ``tests.spark._connectors``, so the
repository root is put on their ``PYTHONPATH``.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
_JAVA17 = Path("/usr/lib/jvm/java-17-openjdk-amd64")


def _java_home() -> str | None:
    """JAVA_HOME if it has a java binary, else the Debian Java 17, else the java on PATH."""
    env = os.environ.get("JAVA_HOME")
    if env and (Path(env) / "bin" / "java").exists():
        return env
    if (_JAVA17 / "bin" / "java").exists():
        return str(_JAVA17)
    java = shutil.which("java")
    return str(Path(java).resolve().parents[1]) if java else None


def _skip_reason() -> str | None:
    try:
        import pyspark  # noqa: F401
        from pyspark.sql.datasource import DataSourceStreamArrowWriter  # noqa: F401
        from pyspark.sql.streaming.datasource import ReadLimit  # noqa: F401
    except ImportError as e:
        return f"pyspark>=4.2 is not installed ({e}); install it with: pip install 'headrace[spark]' 'pyspark>=4.2'"
    if _java_home() is None:
        return "no Java runtime for Spark; install Java 17 (apt-get install openjdk-17-jre-headless) or set JAVA_HOME"
    return None


SKIP_REASON = _skip_reason()


def pytest_collection_modifyitems(config: Any, items: list[pytest.Item]) -> None:
    if SKIP_REASON is None:
        return
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.skip(reason=SKIP_REASON))


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """A local Spark session (2 cores, UTC, quiet) with every headrace connector registered."""
    java = _java_home()
    assert java is not None
    os.environ["JAVA_HOME"] = java
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    paths = [str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    from tests.spark._spark_home import worker_friendly_spark_home

    home = worker_friendly_spark_home()
    if home is not None:
        os.environ["SPARK_HOME"] = home  # workers import pyspark compiled, not from its zip
    from pyspark.sql import SparkSession

    import headrace.spark

    session = (
        SparkSession.builder.master("local[2]")
        .appName("headrace-spark-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "1g")
        .config("spark.sql.streaming.pollingDelay", "10ms")
        .config("spark.python.worker.reuse", "true")
        # a Python worker connecting back to the JVM waits this long (default 15 s): on a loaded
        # 2-core machine a Python data source's runner can take longer to start
        .config("spark.python.authenticate.socketTimeout", "120s")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    headrace.spark.register(session)
    try:
        yield session
    finally:
        session.stop()
