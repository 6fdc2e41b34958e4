"""A stateful operator's state is bound to what it computes: a restart with a changed
aggregation, window, session gap, key, event-time column, output mode or deduplication is
refused with a ``CheckpointError`` naming what changed (old and new) and how to start over, on
both state backends; changes that keep the state's meaning (an output name, the watermark's
delay of an aggregation, update vs complete without eviction) are accepted."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import headrace as hr
from headrace.errors import CheckpointError
from headrace.testing import memory_stream
from headrace.transforms.aggregate import aggregate_operator
from headrace.transforms.dedup import DropDuplicatesOperator
from headrace.transforms.operator import Operator
from headrace.transforms.window import exact_seconds, session_window, window
from tests.core.transforms.stateful_harness import run_batches

BACKENDS = ["memory", "rocksdb"]
TS = pa.timestamp("us", tz="UTC")
T0 = 1_700_000_000


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def batch(b: int) -> pa.Table:
    """Twelve rows, one second apart, starting at second 12 * b."""
    secs = [12 * b + i for i in range(12)]
    return pa.table({
        "ts": pa.array([(T0 + s) * 1_000_000 for s in secs], pa.int64()).cast(TS),
        "user": [f"u{s % 3}" for s in secs],
        "region": [f"r{s % 2}" for s in secs],
        "value": pa.array([s * 10 for s in secs], pa.int64()),
        "other": pa.array([s for s in secs], pa.int64()),
    })  # fmt: skip


def agg(keys: list[Any], aggs: list[str], wm: str | None = None) -> Callable[[], Operator]:
    return lambda: aggregate_operator(keys, aggs, watermark_column=wm)


def dedup(cols: list[str], *, within: bool = False, wm: str | None = None, delay: str | None = None
          ) -> Callable[[], Operator]:  # fmt: skip
    return lambda: DropDuplicatesOperator(cols, within_watermark=within, watermark_column=wm, watermark_delay=delay)


W5 = window("ts", "5 seconds")
# (id, first query, its output mode and watermark, changed query, its mode and watermark, what the error names)
CHANGES: list[tuple[str, Callable[[], Operator], str, Any, Callable[[], Operator], str, Any, list[str]]] = [
    ("count-to-sum", agg(["user"], ["count(*) AS n"]), "update", None,
     agg(["user"], ["sum(value) AS n"]), "update", None, ["aggregates: [count(*)] before, [sum(value)] now"]),
    ("count-to-max", agg(["user"], ["count(*) AS n"]), "update", None,
     agg(["user"], ["max(value) AS n"]), "update", None, ["aggregates: [count(*)] before, [max(value)] now"]),
    ("sum-input", agg(["user"], ["sum(value) AS s"]), "update", None,
     agg(["user"], ["sum(other) AS s"]), "update", None, ["aggregates: [sum(value)] before, [sum(other)] now"]),
    ("aggregates-reordered", agg(["user"], ["sum(value) AS s", "max(value) AS m"]), "update", None,
     agg(["user"], ["max(value) AS m", "sum(value) AS s"]), "update", None,
     ["aggregates: [sum(value), max(value)] before, [max(value), sum(value)] now"]),
    ("window-duration", agg([W5, "user"], ["count(*) AS n"], "ts"), "append", ("ts", 0),
     agg([window("ts", "10 seconds"), "user"], ["count(*) AS n"], "ts"), "append", ("ts", 0),
     ["window: window(ts, duration 5s, slide 5s, start 0s) before, window(ts, duration 10s, slide 10s, start 0s) "
      "now"]),
    ("window-slide", agg([window("ts", "10 seconds", "5 seconds")], ["count(*) AS n"], "ts"), "update", ("ts", 0),
     agg([window("ts", "10 seconds", "2 seconds")], ["count(*) AS n"], "ts"), "update", ("ts", 0),
     ["slide 5s", "slide 2s"]),
    ("window-start", agg([W5], ["count(*) AS n"], "ts"), "update", ("ts", 0),
     agg([window("ts", "5 seconds", start_time="1.5 seconds")], ["count(*) AS n"], "ts"), "update", ("ts", 0),
     ["start 0s", "start 1.5s"]),
    ("grouping-key", agg(["user"], ["count(*) AS n"]), "update", None,
     agg(["region"], ["count(*) AS n"]), "update", None, ["groupingKeys: [user] before, [region] now"]),
    ("event-time-added", agg([W5], ["count(*) AS n"]), "update", None,
     agg([W5], ["count(*) AS n"], "ts"), "update", ("ts", 0), ["eventTime: none before, ts now"]),
    ("output-mode", agg([W5], ["count(*) AS n"], "ts"), "append", ("ts", 0),
     agg([W5], ["count(*) AS n"], "ts"), "update", ("ts", 0), ["outputMode: append before, update now"]),
    ("session-gap", agg([session_window("ts", "5 seconds"), "user"], ["count(*) AS n"], "ts"), "append", ("ts", 0),
     agg([session_window("ts", "10 seconds"), "user"], ["count(*) AS n"], "ts"), "append", ("ts", 0),
     ["sessionWindow: session_window(ts, gap 5s) before, session_window(ts, gap 10s) now"]),
    ("session-output-mode", agg([session_window("ts", "5 seconds")], ["count(*) AS n"], "ts"), "append", ("ts", 0),
     agg([session_window("ts", "5 seconds")], ["count(*) AS n"], "ts"), "complete", ("ts", 0),
     ["outputMode: append before, complete now"]),
    ("session-aggregate", agg([session_window("ts", "5 seconds")], ["count(*) AS n"]), "complete", None,
     agg([session_window("ts", "5 seconds")], ["sum(value) AS n"]), "complete", None,
     ["aggregates: [count(*)] before, [sum(value)] now"]),
    ("dedup-columns", dedup(["user"]), "append", None, dedup(["region"]), "append", None,
     ["columns: [user] before, [region] now"]),
    ("dedup-to-within-watermark", dedup(["user"], wm="ts"), "append", ("ts", 0),
     dedup(["user"], within=True, wm="ts", delay="5 seconds"), "append", ("ts", 0),
     ["operator: drop_duplicates before, drop_duplicates_within_watermark now", "eventTime: none before, ts now"]),
    ("dedup-event-time", dedup(["user", "ts"]), "append", None, dedup(["user", "ts"], wm="ts"), "append", ("ts", 0),
     ["eventTime: none before, ts now"]),
    ("dedup-delay", dedup(["user"], within=True, wm="ts", delay="5 seconds"), "append", ("ts", 0),
     dedup(["user"], within=True, wm="ts", delay="10 seconds"), "append", ("ts", 0),
     ["watermarkDelay: 5s before, 10s now"]),
    ("aggregate-to-dedup", agg(["user"], ["count(*) AS n"]), "update", None, dedup(["user"]), "append", None,
     ["operator: aggregate before, drop_duplicates now"]),
]  # fmt: skip


@pytest.mark.parametrize(("first", "mode1", "wm1", "changed", "mode2", "wm2", "named"),
                         [c[1:] for c in CHANGES], ids=[c[0] for c in CHANGES])  # fmt: skip
def test_a_changed_stateful_operator_is_refused(
    backend: str, tmp_path: Path, first: Callable[[], Operator], mode1: str, wm1: Any,
    changed: Callable[[], Operator], mode2: str, wm2: Any, named: list[str],
) -> None:  # fmt: skip
    path = str(tmp_path / "state")
    run = run_batches(first, [batch(0), batch(1)], state_path=path, backend=backend, mode=mode1, watermark=wm1)
    meta_before = Path(path, "metadata").read_bytes()
    with pytest.raises(CheckpointError) as e:
        run_batches(changed, [batch(2)], state_path=path, backend=backend, mode=mode2, watermark=wm2, run=run)
    msg = str(e.value)
    assert path in msg and "different query" in msg
    for part in named:
        assert part in msg
    assert "new checkpointLocation" in msg and "checkpoint reset` does not help" in msg
    assert Path(path, "metadata").read_bytes() == meta_before  # nothing recorded for the refused query
    # the query as it was still runs on the same state
    again = run_batches(first, [batch(2)], state_path=path, backend=backend, mode=mode1, watermark=wm1, run=run)
    assert again.next_batch == 3


SAME: list[tuple[str, Callable[[], Operator], str, Any, Callable[[], Operator], str, Any]] = [
    ("output-name", agg(["user"], ["count(*) AS n"]), "update", None, agg(["user"], ["count(1) AS total"]),
     "update", None),
    ("update-to-complete-without-eviction", agg(["user"], ["sum(value) AS s"]), "update", None,
     agg(["user"], ["sum(value) AS s"]), "complete", None),
    ("watermark-delay", agg([W5, "user"], ["count(*) AS n"], "ts"), "append", ("ts", 0),
     agg([W5, "user"], ["count(*) AS n"], "ts"), "append", ("ts", 3000)),
    ("watermark-not-on-a-key", agg(["user"], ["count(*) AS n"]), "update", None,
     agg(["user"], ["count(*) AS n"], "ts"), "update", ("ts", 0)),
    ("dedup-output-mode", dedup(["user"]), "append", None, dedup(["user"]), "update", None),
]  # fmt: skip


@pytest.mark.parametrize(("first", "mode1", "wm1", "second", "mode2", "wm2"), [c[1:] for c in SAME],
                         ids=[c[0] for c in SAME])  # fmt: skip
def test_a_change_that_keeps_the_states_meaning_is_accepted(
    backend: str, tmp_path: Path, first: Callable[[], Operator], mode1: str, wm1: Any,
    second: Callable[[], Operator], mode2: str, wm2: Any,
) -> None:  # fmt: skip
    path = str(tmp_path / "state")
    run = run_batches(first, [batch(0), batch(1)], state_path=path, backend=backend, mode=mode1, watermark=wm1)
    run = run_batches(second, [batch(2)], state_path=path, backend=backend, mode=mode2, watermark=wm2, run=run)
    assert run.next_batch == 3


def test_the_description_is_in_the_metadata(backend: str, tmp_path: Path) -> None:
    path = tmp_path / "state"
    run_batches(agg([window("ts", "5 seconds", "2.5 seconds"), "user"], ["count(*) AS n", "avg(value) AS m"], "ts"),
                [batch(0)], state_path=str(path), backend=backend, mode="append", watermark=("ts", 0))  # fmt: skip
    meta = json.loads((path / "metadata").read_text())
    assert meta["operatorSpec"] == {
        "operator": "aggregate", "groupingKeys": ["user"],
        "window": "window(ts, duration 5s, slide 2.5s, start 0s)", "aggregates": ["count(*)", "avg(value)"],
        "eventTime": "ts", "outputMode": "append",
    }  # fmt: skip


@pytest.mark.parametrize(("us", "text"), [(5_000_000, "5s"), (250_000, "0.25s"), (1, "0.000001s"), (0, "0s"),
                                          (-1_500_000, "-1.5s"), (86_400_000_001, "86400.000001s")],
                         ids=["whole", "fraction", "one-micro", "zero", "negative", "a-day-and-a-micro"])  # fmt: skip
def test_exact_seconds(us: int, text: str) -> None:
    assert exact_seconds(us) == text


# ------------------------------------------------------------------ a changed aggregate, through the engine
SCHEMA = pa.schema([("user", pa.string()), ("value", pa.int64())])


def _run_query(name: str, chk: Path, backend: str, frame_of: Callable[[hr.StreamFrame], hr.StreamFrame],
               rows: list[pa.Table]) -> pa.Table:  # fmt: skip
    stream = memory_stream(name, SCHEMA)
    out = f"{name}-out"
    frame = frame_of(hr.read_stream.format("memory").option("name", name).load())
    q = (frame.write_stream.format("memory").query_name(out).output_mode("update")
         .option("checkpointLocation", str(chk)).option("stateStore", backend)
         .trigger(processing_time="10 milliseconds").start())  # fmt: skip
    try:
        for t in rows:
            stream.add(t)
            q.process_all_available(30)
    finally:
        q.stop()
    if q.exception() is not None:
        raise q.exception()  # type: ignore[misc]
    return hr.memory_table(out)


def test_a_count_query_restarted_as_sum_is_refused_by_the_query(backend: str, tmp_path: Path) -> None:
    name = f"spec-{uuid.uuid4().hex[:6]}"
    rows = [pa.table({"user": ["a", "b", "a"], "value": [1, 2, 3]}, schema=SCHEMA)]
    first = _run_query(name, tmp_path / "chk", backend, lambda s: s.group_by("user").agg("count(*) AS n"), rows)
    assert sorted((r["user"], r["n"]) for r in first.to_pylist()) == [("a", 2), ("b", 1)]
    with pytest.raises(CheckpointError, match=r"aggregates: \[count\(\*\)\] before, \[sum\(value\)\] now"):
        _run_query(name, tmp_path / "chk", backend, lambda s: s.group_by("user").agg("sum(value) AS n"), rows)


@pytest.mark.parametrize(("first", "changed", "step"), [
    (lambda s: s.group_by("user").agg("count(*) AS n"),
     lambda s: s.with_column("v2", "value * 2").group_by("user").agg("count(*) AS n"), 1),
    (lambda s: s.drop_duplicates("user"), lambda s: s.drop_duplicates("user").group_by("user").agg("count(*) AS n"), 1),
], ids=["a-step-added-before-it", "a-stateful-operator-added"])  # fmt: skip
def test_a_stateful_operator_without_state_in_a_query_that_ran_is_refused_at_start(
    backend: str, tmp_path: Path, first: Callable[[hr.StreamFrame], hr.StreamFrame],
    changed: Callable[[hr.StreamFrame], hr.StreamFrame], step: int,
) -> None:  # fmt: skip
    name = f"spec-{uuid.uuid4().hex[:6]}"
    rows = [pa.table({"user": ["a", "b", "a"], "value": [1, 2, 3]}, schema=SCHEMA)]
    _run_query(name, tmp_path / "chk", backend, first, rows)
    with pytest.raises(CheckpointError) as e:
        _run_query(name, tmp_path / "chk", backend, changed, rows)
    msg = str(e.value)
    assert f"state/{step} has no state, but the query already committed batch 0" in msg
    assert f"(step {step} of the query's plan)" in msg and "this checkpoint holds state/0: " in msg
    assert "new checkpointLocation" in msg
    assert not (tmp_path / "chk" / "state" / str(step) / "metadata").exists()  # nothing written for it
    _run_query(name, tmp_path / "chk", backend, first, rows)  # the query as it was still runs
