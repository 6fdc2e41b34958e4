"""The crash machinery the kit's kill tests stand on: the trace of crash points a run passed,
and the self-kill timer that always lands inside the first batch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from headrace.testing import CRASH_POINTS, run_pipeline
from headrace.testing._pipeline import STEP_PREFIX


def _spec(tmp_path: Path, batches: int = 3) -> dict[str, Any]:
    return {
        "source": {"format": "rate-micro-batch", "options": {"rowsPerBatch": 10, "totalRows": 10 * batches, "numPartitions": 2}},
        "sink": {"format": "files", "options": {"path": str(tmp_path / "out")}},
        "checkpoint": str(tmp_path / "chk"),
    }


def test_a_traced_run_lists_every_engine_point_of_every_batch(tmp_path: Path) -> None:
    result = run_pipeline(_spec(tmp_path), trace=True).check()
    seen = [(t.point, t.batch) for t in result.trace]
    for batch in range(3):
        for point in CRASH_POINTS:
            assert (point, batch) in seen, f"{point} of batch {batch} missing from {seen}"
    assert ("files_between_data_and_marker", 0) in seen  # the files sink's own point
    assert [t.at for t in result.trace] == sorted(t.at for t in result.trace)


def test_the_kill_timer_fires_at_the_next_batch_at_the_latest(tmp_path: Path) -> None:
    # a delay far longer than a batch: the second pass of before_offsets kills instead
    result = run_pipeline(_spec(tmp_path), kill_at=("before_offsets", 60.0))
    assert result.killed, result.stderr
    assert (result.trace[-1].point, result.trace[-1].batch) == ("before_offsets", 1)
    assert result.elapsed < 30


def test_a_kill_point_kills_there(tmp_path: Path) -> None:
    result = run_pipeline(_spec(tmp_path), crash="before_sink_commit:1", trace=True)
    assert result.killed
    assert (result.trace[-1].point, result.trace[-1].batch) == ("before_sink_commit", 1)
    assert "before_sink_commit of batch 1" in result.last_point()


def test_commit_steps_trace_the_sinks_client_calls_and_kill_after_one(tmp_path: Path) -> None:
    traced = run_pipeline(dict(_spec(tmp_path), commit_steps={"batch": 1, "kill_after": None}), trace=True).check()
    steps = [t for t in traced.trace if t.point.startswith(STEP_PREFIX)]
    assert steps and {t.batch for t in steps} == {1}, traced.trace
    names = [t.point.removeprefix(STEP_PREFIX) for t in steps]
    assert any(n.endswith("replace") for n in names), names  # the files sink moves its files into place
    assert not any(n.startswith(("builtins.", "pyarrow", "headrace.")) for n in names), names
    killed = run_pipeline(dict(_spec(tmp_path / "again"), commit_steps={"batch": 1, "kill_after": 2}), trace=True)
    assert killed.killed, killed.stderr
    assert [t.point for t in killed.trace if t.point.startswith(STEP_PREFIX)] == [steps[0].point, steps[1].point]
    assert "client call" in killed.last_point() and "batch 1" in killed.last_point()
