"""One local Spark session for the conformance module, and the fixed-seed run of the whole
catalogue (every query on both engines, started together so Spark's per-batch latency
overlaps). Skips, saying what to install, when pyspark or Java is missing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conformance.harness import spark_skip_reason

SKIP_REASON = spark_skip_reason()


def pytest_collection_modifyitems(config: Any, items: list[pytest.Item]) -> None:
    if SKIP_REASON is None:
        return
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.skip(reason=SKIP_REASON))


@pytest.fixture(scope="session")
def conformance_spark() -> Iterator[Any]:
    """The conformance harness's Spark session (local[2], UTC, 2 shuffle partitions)."""
    from tests.conformance.harness import spark_session

    session = spark_session()
    try:
        yield session
    finally:
        session.stop()
