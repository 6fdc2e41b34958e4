"""``headrace checkpoint reset`` loses no data, and progress never counts skipped rows as
output."""

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
    assert again.last_progress is not None
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
    assert main(["checkpoint", "show", "--json", chk]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["batchesToReplay"] == [2, 3] and shown["pendingReplay"] and shown["lastCommitted"] == 1
    import os

    os.unlink(os.path.join(chk, "metadata"))
    assert main(["checkpoint", "show", chk]) == 1
    assert "metadata file is missing" in capsys.readouterr().err


def _three_batches(chk: Path) -> None:
    q = (hr.read_stream.format("rate-micro-batch").options(rowsPerBatch=10, totalRows=30).load()
         .write_stream.format("noop").option("checkpointLocation", str(chk)).option("checkpointFsync", False)
         .trigger(available_now=True).start())  # fmt: skip
    q.await_termination(30)


def _damage(chk: Path, how: str) -> str:
    """Damage the checkpoint; returns the path the error must name."""
    import os
    import shutil

    if how == "offsets-missing":
        shutil.rmtree(chk / "offsets")
        return str(chk / "offsets")
    if how == "commits-missing":
        shutil.rmtree(chk / "commits")
        return str(chk / "commits")
    if how == "offsets-a-file":
        shutil.rmtree(chk / "offsets")
        (chk / "offsets").write_text("x")
        return str(chk / "offsets")
    if how == "commit-a-folder":
        os.unlink(chk / "commits" / "2")
        (chk / "commits" / "2").mkdir()
        return str(chk / "commits" / "2")
    if how == "offset-a-folder":
        os.unlink(chk / "offsets" / "2")
        (chk / "offsets" / "2").mkdir()
        return str(chk / "offsets" / "2")
    assert how == "metadata-a-folder"
    os.unlink(chk / "metadata")
    (chk / "metadata").mkdir()
    return str(chk / "metadata")


@pytest.mark.parametrize("how", ["offsets-missing", "commits-missing", "offsets-a-file", "commit-a-folder",
                                 "offset-a-folder", "metadata-a-folder"])  # fmt: skip
@pytest.mark.parametrize("extra", [[], ["--force"]], ids=["replay", "force"])
def test_reset_of_a_damaged_checkpoint_is_one_clear_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], how: str,
                                                         extra: list[str]) -> None:  # fmt: skip
    chk = tmp_path / "chk"
    _three_batches(chk)
    named = _damage(chk, how)
    assert main(["checkpoint", "reset", str(chk), "--to-batch", "-1", *extra]) == 1
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith("headrace: error: checkpoint "), err
    assert "damaged" in err and named in err and "restore the checkpoint from a backup" in err, err
    assert "Error:" not in err and "Errno" not in err, err  # no bare FileNotFoundError / IsADirectoryError


@pytest.mark.parametrize(
    ("args", "fragment"),
    [(["reset", "--to-batch", "-5"], "--to-batch -5 is not a batch"),
     (["reset", "--to-batch", "-2", "--force"], "--to-batch -2 is not a batch"),
     (["show", "--progress", "-1"], "--progress -1 is not a number of records")],
    ids=["to-batch-negative", "to-batch-negative-force", "progress-negative"],
)
def test_out_of_range_numbers_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str],
                                          fragment: str) -> None:  # fmt: skip
    chk = tmp_path / "chk"
    _three_batches(chk)
    before = sorted(p.name for p in (chk / "commits").iterdir())
    assert main(["checkpoint", args[0], str(chk), *args[1:]]) == 1
    err = capsys.readouterr().err
    assert fragment in err and len(err.splitlines()) == 1, err
    assert sorted(p.name for p in (chk / "commits").iterdir()) == before  # nothing rolled back


@pytest.mark.parametrize("target", ["missing", "file"])
def test_reset_of_what_is_not_a_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str], target: str) -> None:
    path = tmp_path / target
    if target == "file":
        path.write_text("x")
    assert main(["checkpoint", "reset", str(path), "--to-batch", "0"]) == 1
    err = capsys.readouterr().err
    assert ("does not exist" if target == "missing" else "is a file, not a checkpoint folder") in err, err
