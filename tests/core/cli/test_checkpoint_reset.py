"""``headrace checkpoint reset`` loses no data, and progress never counts skipped rows as
output (issue 12, item 4)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import headrace as hr
from headrace.cli import main
from headrace.connectors.files import read_files
from headrace.testing import wait_for


def start(chk: str, out: str, **trigger: Any) -> hr.StreamingQuery:
    w = (hr.read_stream.format("rate").option("rowsPerSecond", 2000).load()
         .write_stream.format("files").option("checkpointLocation", chk).option("checkpointFsync", False))  # fmt: skip
    if trigger:
        w = w.trigger(**trigger)
    return w.start(out)


def test_reset_on_a_time_driven_source_replays_the_recorded_ranges(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    chk, out = str(tmp_path / "chk"), str(tmp_path / "out")
    q = start(chk, out, processing_time="50 milliseconds")
    wait_for(lambda: len([p for p in q.recent_progress if p["numInputRows"]]) >= 6, timeout=30, what="6 batches")
    q.stop()
    assert q.exception() is None
    before = sorted(read_files(out).column("value").to_pylist())
    last = q.last_progress
    assert last is not None
    assert main(["checkpoint", "reset", chk, "--to-batch", "2"]) == 0
    assert "replays each with exactly its recorded range" in capsys.readouterr().out

    again = start(chk, out, available_now=True)
    again.await_termination(60)
    values = sorted(read_files(out).column("value").to_pylist())
    assert values == list(range(len(values))), "no row lost, none twice"
    end = again.last_progress["sources"][0]["endOffset"]["rows"]
    assert len(values) == end, f"rows {len(values)}..{end} reported read but not in the output"
    assert values[: len(before)] == before
    replayed = [p for p in again.recent_progress if p["batchId"] <= last["batchId"]]
    assert [p["batchId"] for p in replayed] == list(range(3, last["batchId"] + 1))
    for p in replayed:  # the sink already held these batches: skipped, not output
        assert p["sink"]["numOutputRows"] == 0
        assert p["sink"]["metrics"]["numRowsSkipped"] == p["numInputRows"] > 0
        assert p["sources"][0]["startOffset"] is not None


def test_a_replayed_batch_is_reported_as_skipped(tmp_path: Path) -> None:
    chk, out = str(tmp_path / "chk"), str(tmp_path / "out")

    def run() -> hr.StreamingQuery:
        q = (hr.read_stream.format("rate-micro-batch").options(rowsPerBatch=10, totalRows=30).load()
             .write_stream.format("files").option("checkpointLocation", chk).trigger(available_now=True).start(out))  # fmt: skip
        q.await_termination(30)
        return q

    first = run()
    assert [p["sink"]["numOutputRows"] for p in first.recent_progress] == [10, 10, 10]
    assert main(["checkpoint", "reset", chk, "--to-batch", "0"]) == 0
    second = run()
    assert [(p["batchId"], p["sink"]["numOutputRows"], p["sink"]["metrics"]["numRowsSkipped"])
            for p in second.recent_progress] == [(1, 0, 10), (2, 0, 10)]  # fmt: skip
    assert "10 rows skipped by the sink" in hr.progress.QueryProgress.line(second._progress[-1])
    assert sorted(read_files(out).column("value").to_pylist()) == list(range(30))


def test_reset_past_the_kept_batches_needs_force(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    chk = str(tmp_path / "chk")
    q = (hr.read_stream.format("rate-micro-batch").options(rowsPerBatch=1, totalRows=105).load()
         .write_stream.format("noop").option("checkpointLocation", chk).option("checkpointFsync", False)
         .trigger(available_now=True).start())  # fmt: skip
    q.await_termination(60)
    assert main(["checkpoint", "reset", chk, "--to-batch", "-1"]) == 1
    assert "no longer recorded" in capsys.readouterr().err
    assert main(["checkpoint", "reset", chk, "--to-batch", "-1", "--force"]) == 0
    assert "plans new batches" in capsys.readouterr().out


def test_show_lists_the_batches_a_reset_will_replay(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    chk, out = str(tmp_path / "chk"), str(tmp_path / "out")
    q = (hr.read_stream.format("rate-micro-batch").options(rowsPerBatch=10, totalRows=40).load()
         .write_stream.format("files").option("checkpointLocation", chk).trigger(available_now=True).start(out))  # fmt: skip
    q.await_termination(30)
    assert main(["checkpoint", "reset", chk, "--to-batch", "1"]) == 0
    capsys.readouterr()
    assert main(["checkpoint", "show", chk]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["batchesToReplay"] == [2, 3] and shown["pendingReplay"] and shown["lastCommitted"] == 1
    import os

    os.unlink(os.path.join(chk, "metadata"))
    assert main(["checkpoint", "show", chk]) == 1
    assert "metadata file is missing" in capsys.readouterr().err
