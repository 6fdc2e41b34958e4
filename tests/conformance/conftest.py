"""One local Spark session for the conformance modules, and the two tiers.

The CI tier (the default) runs a fixed set of cases that covers every operator family once:
Spark costs seconds per streaming query on 2 cores, and the whole catalogue three ways takes
tens of minutes. ``HEADRACE_CONFORMANCE=deep`` runs every case of every module (and
``scripts/conformance.py --seeds N`` many seeds). Skips, saying what to install, when pyspark
or Java is missing."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conformance.harness import spark_skip_reason

SKIP_REASON = spark_skip_reason()


DEEP = os.environ.get("HEADRACE_CONFORMANCE", "").lower() == "deep"

# the catalogue cases CI runs three ways (headrace, the headrace definition translated onto
# Spark, the query written in PySpark): one or two per operator family (projection and filter,
# map_batches/mapInArrow, stream-static joins by keys and by condition, union, tumbling, sliding
# and session windows, grouping by key, every aggregate function, dedup with and without event
# time, dedup within the watermark); test_conformance.py compares headrace with PySpark,
# test_spark_engine.py the translation with PySpark, over the same seed
THREE_WAY_TIER = frozenset(
    {
        "select-where-append",
        "map-batches-append",
        "join-inner-keys-append",
        "join-left-condition-append",
        "union-tumbling-append",
        "tumbling-append",
        "sliding-update",
        "session-append",
        "group-by-key-update",
        "every-aggregate-update",
        "dedup-id-append",
        "dedup-event-time-append",
        "dedup-within-watermark-append",
    }
)

# module -> the case ids its CI tier runs (a module not named here runs whole)
CI_TIER: dict[str, frozenset[str]] = {
    "test_conformance.py": THREE_WAY_TIER | {
        "join-left-anti-keys-append",
        "ss-join-left-append",  # stream-stream joins: an outer join (late, matched and unmatched rows)
        "ss-join-left-side-conditions-append",  # a preserved side's own conjunct (a known difference)
        "filter-below-watermark-append",  # filters Spark evaluates below the watermark
    },
    # and the translations of the two-input operators and of chained stateful operators
    "test_spark_engine.py": THREE_WAY_TIER | {
        "ss-join-left-append",
        "union-two-watermarks-append",
        "chained-window-window-append",
    },
    "test_two_watermarks.py": frozenset({"tumbling-keyed-append", "session-complete", "dedup-within-watermark-append",
                                         "union-max-policy-append"}),
    # transform_with_state: value, list and map state three ways, and event-time timers (the
    # initial state and TTL: tests/spark/test_engine.py, and the deep tier here)
    "test_transform_with_state.py": frozenset({"all-state", "event-time-timers"}),
}  # fmt: skip


def _case_id(item: pytest.Item) -> str | None:
    callspec = getattr(item, "callspec", None)
    return None if callspec is None else str(callspec.id)


def pytest_collection_modifyitems(config: Any, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    if SKIP_REASON is not None:
        for item in items:
            if here in Path(str(item.fspath)).parents:
                item.add_marker(pytest.mark.skip(reason=SKIP_REASON))
        return
    if DEEP:
        return
    keep: list[pytest.Item] = []
    drop: list[pytest.Item] = []
    for item in items:
        tier = CI_TIER.get(Path(str(item.fspath)).name) if here in Path(str(item.fspath)).parents else None
        (drop if tier is not None and _case_id(item) not in tier else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def selected_cases(request: pytest.FixtureRequest) -> set[str]:
    """The case ids of the requesting module's tests that this session runs (after ``-k`` and
    the tier), for a module fixture that runs its cases together."""
    module = request.node.path if hasattr(request.node, "path") else Path(str(request.node.fspath))
    return {
        cid for item in request.session.items if Path(str(item.fspath)) == module and (cid := _case_id(item))
    }


@pytest.fixture(scope="module")
def conformance_spark() -> Iterator[Any]:
    """The conformance harness's Spark session (local[2], UTC, 1 shuffle partition), one per
    module: a module's Python workers and state stores do not outlive it, and a module that
    sets session configuration leaves none behind."""
    from tests.conformance.harness import spark_session

    session = spark_session()
    try:
        yield session
    finally:
        session.stop()
