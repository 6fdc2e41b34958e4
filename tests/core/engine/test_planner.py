"""Planning ahead with ``available_now``: the next batches' offsets entries are on disk while a
batch runs, a stop forgets the batches planned ahead, and SIGKILLs while batches are planned
ahead lose and duplicate nothing."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar

import pyarrow as pa
import pytest

import headrace as hr
from headrace.checkpoint import Checkpoint
from headrace.connectors.files import read_files
from headrace.connectors.rate import RateMicroBatchSource
from headrace.engine.planner import LOOK_AHEAD, Planner
from headrace.options import Integer, Option, OptionSchema
from headrace.plugins import ConnectorSpec, hookimpl, registry
from headrace.protocols import Offset, ReadLimit
from headrace.testing import run_pipeline, wait_for

PER_BATCH, BATCHES = 10, 20


def _query(chk: Path, fn: Any, batches: int = BATCHES) -> hr.StreamingQuery:
    return (hr.read_stream.format("rate-micro-batch")
            .options(rowsPerBatch=PER_BATCH, totalRows=PER_BATCH * batches).load()
            .write_stream.foreach_batch(fn).option("checkpointLocation", str(chk))
            .trigger(available_now=True).start())  # fmt: skip


def test_later_batches_are_planned_while_a_batch_runs_and_every_row_arrives_once(tmp_path: Path) -> None:
    chk = tmp_path / "chk"
    seen: list[int] = []
    ahead: dict[int, list[int]] = {}

    def fn(table: pa.Table, batch_id: int) -> None:
        seen.extend(table.column("value").to_pylist())
        ahead[batch_id] = [n for n in Checkpoint(str(chk)).batch_ids() if n > batch_id]

    q = _query(chk, fn)
    q.await_termination(60)
    assert sorted(seen) == list(range(PER_BATCH * BATCHES))
    assert ahead[0] == []  # the run's first batch is planned alone
    # from the second on, the next entries are written (in the background) while a batch runs
    assert sum(1 for v in ahead.values() if v) >= BATCHES // 2
    assert max(max(v, default=0) - k for k, v in ahead.items()) <= LOOK_AHEAD
    cp = Checkpoint(str(chk))
    assert cp.pending() == [] and cp.committed_ids()[-1] == BATCHES - 1
    assert [p["batchId"] for p in q.recent_progress] == list(range(BATCHES))


def test_a_stop_forgets_the_batches_planned_ahead_and_a_restart_continues_exactly(tmp_path: Path) -> None:
    chk = tmp_path / "chk"
    seen = _run_stopped_after_batch_3(_query, chk, "value")
    cp = Checkpoint(str(chk))
    assert cp.batch_ids() == cp.committed_ids() == [0, 1, 2, 3]  # nothing planned ahead is left to replay
    q2 = _query(chk, lambda t, b: seen.extend(t.column("value").to_pylist()))
    q2.await_termination(60)
    assert sorted(seen) == list(range(PER_BATCH * BATCHES))


@pytest.mark.parametrize(
    ("point", "batch"),
    [("after_offsets", 4), ("mid_write", 2), ("before_sink_commit", 2), ("after_commit", 2)],
    ids=["entry-planned-ahead", "mid-write-with-entries-ahead", "before-sink-commit", "after-commit"],
)
def test_a_kill_while_batches_are_planned_ahead_loses_and_duplicates_nothing(tmp_path: Path, point: str, batch: int) -> None:
    total = 200 * 30
    spec = {
        "source": {"format": "rate-micro-batch", "options": {"rowsPerBatch": 200, "totalRows": total, "numPartitions": 2}},
        "sink": {"format": "files", "options": {"path": str(tmp_path / "out")}},
        "checkpoint": str(tmp_path / "chk"),
        "name": "ahead",
        "trigger": {"available_now": True},
    }
    assert run_pipeline(spec, crash=f"{point}:{batch}").killed
    cp = Checkpoint(str(tmp_path / "chk"))
    assert len(cp.pending()) >= 2  # the killed batch and at least one planned ahead of it are replayed
    run_pipeline(spec).check()
    got = Counter(read_files(str(tmp_path / "out")).column("value").to_pylist())
    assert sorted(got) == list(range(total)) and set(got.values()) == {1}


class CommittedStartsSource(RateMicroBatchSource):
    """rate-micro-batch that, like a source freeing ``start`` upstream in ``latest_offset``
    (e.g. a replication slot advanced there), does not declare ``supports_planning_ahead``;
    records each ``latest_offset`` start and the committed batches at that moment."""

    supports_planning_ahead = False
    seen: ClassVar[list[tuple[int, list[int]]]] = []
    checkpoint: ClassVar[str] = ""

    def latest_offset(self, start: Offset, limit: ReadLimit) -> Offset:
        self.seen.append((int(start["rows"]), Checkpoint(self.checkpoint).committed_ids()))
        return super().latest_offset(start, limit)


_mod = ModuleType("committed_starts_plugin")
# every option has a default: the registry is global, and other tests build every connector
_OPTIONS = OptionSchema(
    [
        Option("rowsPerBatch", Integer(min=1), default=PER_BATCH, doc="Rows in each micro-batch."),
        Option("numPartitions", Integer(min=1), default=1, doc="Partitions each batch is split into."),
        Option("startTimestamp", Integer(min=0), default=0, doc="Event time (epoch ms) of the first batch."),
        Option("advanceMillisPerBatch", Integer(min=0), default=1000, doc="Event time added per batch (ms)."),
        Option("totalRows", Integer(min=0), default=PER_BATCH * BATCHES, doc="Stop after this many rows."),
    ]
)
_SPEC = ConnectorSpec(name="committed-starts", source=f"{__name__}:CommittedStartsSource", source_options=_OPTIONS)
_mod.headrace_connectors = hookimpl(lambda: [_SPEC])  # type: ignore[attr-defined]
registry().register_module(_mod, "tests")


def test_a_source_without_supports_planning_ahead_is_asked_only_from_committed_starts(tmp_path: Path) -> None:
    chk = tmp_path / "chk"
    CommittedStartsSource.seen.clear()
    CommittedStartsSource.checkpoint = str(chk)
    q = (hr.read_stream.format("committed-starts").options(rowsPerBatch=PER_BATCH, totalRows=PER_BATCH * BATCHES)
         .load().write_stream.format("noop").option("checkpointLocation", str(chk))
         .trigger(available_now=True).start())  # fmt: skip
    q.await_termination(60)
    assert [p["numInputRows"] for p in q.recent_progress] == [PER_BATCH] * BATCHES
    # every call after the first starts where the last committed batch ended: never ahead of it
    for start, committed in CommittedStartsSource.seen[1:]:
        assert committed and start == (committed[-1] + 1) * PER_BATCH, (start, committed)


def _watermark_query(chk: Path, fn: Any, batches: int = BATCHES) -> hr.StreamingQuery:
    return (hr.read_stream.format("rate-micro-batch")
            .options(rowsPerBatch=PER_BATCH, totalRows=PER_BATCH * batches, startTimestamp=0,
                     advanceMillisPerBatch=1000).load()
            .with_watermark("timestamp", "2 seconds")
            .group_by(hr.window("timestamp", "3 seconds")).agg("count(*) AS n")
            .write_stream.foreach_batch(fn).option("checkpointLocation", str(chk)).output_mode("append")
            .trigger(available_now=True).start())  # fmt: skip


def _run_stopped_after_batch_3(make: Any, chk: Path, column: str) -> list[Any]:
    """Run the query ``make(chk, fn)`` builds, stopping it from batch 3's ``foreach_batch``;
    the values of ``column`` it output."""
    out: list[Any] = []
    holder: dict[str, hr.StreamingQuery] = {}

    def fn(table: pa.Table, batch_id: int) -> None:
        out.extend(table.column(column).to_pylist())
        if batch_id == 3:
            holder["q"].stop()

    holder["q"] = q = make(chk, fn)
    q.await_termination(60)
    return out


def _entries(chk: Path) -> list[tuple[int, Any, Any, dict[str, Any]]]:
    cp = Checkpoint(str(chk))
    out = []
    for n in cp.batch_ids():
        e = cp.read_offsets(n)
        meta = {k: v for k, v in e.metadata.items() if k != "batchTimestampMs"}
        out.append((n, e.starts, e.ends, meta))
    return out


def test_with_a_watermark_the_next_batch_is_planned_once_a_batch_is_read_as_after_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ahead: dict[int, list[int]] = {}
    outputs: dict[str, list[tuple[int, int]]] = {}

    def run(name: str) -> None:
        rows: list[tuple[int, int]] = []
        chk = tmp_path / name

        def fn(table: pa.Table, batch_id: int) -> None:
            rows.extend((batch_id, n) for n in table.column("n").to_pylist())
            # the next entry is on its way while this batch runs
            if name == "early" and 0 < batch_id < BATCHES - 1:
                ahead[batch_id] = wait_for(lambda: [n for n in Checkpoint(str(chk)).batch_ids() if n > batch_id],
                                           timeout=10, what=f"the entry after batch {batch_id}")  # fmt: skip
            elif name == "early":
                ahead[batch_id] = [n for n in Checkpoint(str(chk)).batch_ids() if n > batch_id]

        q = _watermark_query(chk, fn)
        q.await_termination(60)
        assert q.exception() is None
        outputs[name] = rows

    run("early")
    monkeypatch.setattr(Planner, "enable_next_early", lambda self, limits: None)
    run("after")
    assert ahead[0] == []  # the run's first batch is planned alone
    # one batch ahead, written while it runs
    assert all(ahead[k] == [k + 1] for k in range(1, BATCHES - 1)), ahead
    # the same ranges and watermarks as planning each batch after the one before
    assert _entries(tmp_path / "early") == _entries(tmp_path / "after")
    assert outputs["early"] == outputs["after"] and outputs["early"]


def test_with_a_watermark_a_stop_forgets_the_batch_planned_early(tmp_path: Path) -> None:
    chk = tmp_path / "chk"
    counts = _run_stopped_after_batch_3(_watermark_query, chk, "n")
    cp = Checkpoint(str(chk))
    assert cp.batch_ids() == cp.committed_ids() == [0, 1, 2, 3]  # the entry planned early is deleted
    q2 = _watermark_query(chk, lambda t, b: counts.extend(t.column("n").to_pylist()))
    q2.await_termination(60)
    whole: list[int] = []
    q3 = _watermark_query(tmp_path / "whole", lambda t, b: whole.extend(t.column("n").to_pylist()))
    q3.await_termination(60)
    assert counts == whole and whole  # every window the final watermark closed, once, as without the stop
