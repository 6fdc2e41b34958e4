from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from headrace.checkpoint import Checkpoint, OffsetEntry, atomic_write
from headrace.errors import CheckpointError

SOURCES = [{"connector": "delta", "path": "/data/a"}]


def opened(path: Path, name: str = "q", sources: list[dict[str, str]] = SOURCES) -> Checkpoint:
    cp = Checkpoint(str(path))
    cp.open(name=name, sources=sources, sink={"connector": "files"})
    return cp


def test_metadata_is_created_once_and_the_id_is_stable(tmp_path: Path) -> None:
    cp = opened(tmp_path)
    first = cp.metadata["id"]
    cp.close()
    again = opened(tmp_path)
    assert again.metadata["id"] == first
    again.close()


def test_offsets_and_commits_round_trip(tmp_path: Path) -> None:
    cp = opened(tmp_path)
    cp.write_offsets(OffsetEntry(0, [{"v": 0}], [{"v": 5}], 1))
    assert cp.latest() == (OffsetEntry(0, [{"v": 0}], [{"v": 5}], 1), False)
    cp.write_commit(0)
    entry, committed = cp.latest()
    assert committed and entry is not None and entry.ends == [{"v": 5}]
    cp.close()


@pytest.mark.parametrize(
    ("name", "sources", "fragment"),
    [
        ("other", SOURCES, "belongs to query 'q', not 'other'"),
        ("q", [{"connector": "kafka", "path": None}], "was written by a query reading delta at /data/a; this query reads kafka"),
        ("q", [*SOURCES, {"connector": "delta", "path": "/data/b"}], "cannot be reused with other sources"),
    ],
    ids=["other-query-name", "other-source", "added-source"],
)
def test_a_checkpoint_of_another_query_is_refused(tmp_path: Path, name: str, sources: list, fragment: str) -> None:
    cp = opened(tmp_path)
    cp.write_offsets(OffsetEntry(0, [{"v": 0}], [{"v": 5}], 1))
    cp.write_commit(0)
    cp.close()
    with pytest.raises(CheckpointError, match=fragment):
        opened(tmp_path, name, sources)


def test_a_running_query_holds_the_lock(tmp_path: Path) -> None:
    cp = opened(tmp_path)
    with pytest.raises(CheckpointError, match=f"in use by another running query \\(pid {os.getpid()}\\)"):
        opened(tmp_path)
    cp.close()
    opened(tmp_path).close()


def test_a_corrupt_entry_is_refused_with_its_path(tmp_path: Path) -> None:
    cp = opened(tmp_path)
    (tmp_path / "offsets" / "0").write_text("{not json")
    with pytest.raises(CheckpointError, match=r"offsets/0 is corrupt"):
        cp.latest()
    cp.close()


def test_foreign_metadata_is_refused(tmp_path: Path) -> None:
    (tmp_path / "metadata").write_text(json.dumps({"something": "else"}))
    with pytest.raises(CheckpointError, match="not a headrace checkpoint"):
        opened(tmp_path)


def test_only_the_last_batches_are_retained(tmp_path: Path) -> None:
    cp = Checkpoint(str(tmp_path), retain=5)
    cp.open(name="q", sources=SOURCES, sink={})
    for n in range(12):
        cp.write_offsets(OffsetEntry(n, [{"v": n}], [{"v": n + 1}], 0))
        cp.write_commit(n)
    cp.close()  # waits for the background purge
    assert cp.batch_ids() == [7, 8, 9, 10, 11]
    assert cp.committed_ids() == [7, 8, 9, 10, 11]


def test_reset_forgets_later_batches(tmp_path: Path) -> None:
    cp = opened(tmp_path)
    for n in range(4):
        cp.write_offsets(OffsetEntry(n, [{"v": n}], [{"v": n + 1}], 0))
        cp.write_commit(n)
    cp.close()
    assert Checkpoint(str(tmp_path)).reset_to(1) == [2, 3]
    cp = opened(tmp_path)
    assert cp.committed_ids() == [0, 1]
    # the rolled-back batches keep their recorded ranges, to be replayed exactly
    assert [(e.batch_id, e.starts, e.ends) for e in cp.pending()] == [(2, [{"v": 2}], [{"v": 3}]), (3, [{"v": 3}], [{"v": 4}])]
    with pytest.raises(CheckpointError, match="in use"):
        Checkpoint(str(tmp_path)).reset_to(0)
    cp.close()


def test_reset_with_force_forgets_the_ranges_too(tmp_path: Path) -> None:
    cp = opened(tmp_path)
    for n in range(4):
        cp.write_offsets(OffsetEntry(n, [{"v": n}], [{"v": n + 1}], 0))
        cp.write_commit(n)
    cp.close()
    assert Checkpoint(str(tmp_path)).reset_to(1, force=True) == [2, 3]
    cp = opened(tmp_path)
    entry, committed = cp.latest()
    assert entry is not None and entry.batch_id == 1 and committed and cp.pending() == []
    cp.close()


def test_reset_past_the_retained_batches_is_refused_without_force(tmp_path: Path) -> None:
    cp = Checkpoint(str(tmp_path), retain=3)
    cp.open(name="q", sources=SOURCES, sink={})
    for n in range(6):
        cp.write_offsets(OffsetEntry(n, [{"v": n}], [{"v": n + 1}], 0))
        cp.write_commit(n)
    cp.close()
    with pytest.raises(CheckpointError, match=r"ranges of batches 0..2 are no longer recorded.*--force"):
        Checkpoint(str(tmp_path)).reset_to(-1)
    assert Checkpoint(str(tmp_path)).committed_ids() == [3, 4, 5], "a refused reset changes nothing"
    assert Checkpoint(str(tmp_path)).reset_to(-1, force=True) == [3, 4, 5]
    assert Checkpoint(str(tmp_path)).batch_ids() == []


def test_a_gap_in_the_batches_to_replay_is_refused(tmp_path: Path) -> None:
    cp = opened(tmp_path)
    for n in range(4):
        cp.write_offsets(OffsetEntry(n, [{"v": n}], [{"v": n + 1}], 0))
    cp.write_commit(0)
    os.unlink(tmp_path / "offsets" / "2")
    with pytest.raises(CheckpointError, match=r"offsets entries of \[2\] are missing"):
        cp.pending()
    cp.close()


def test_atomic_write_leaves_no_partial_file(tmp_path: Path) -> None:
    target = tmp_path / "f"
    atomic_write(str(target), b"one")
    atomic_write(str(target), b"two")
    assert target.read_bytes() == b"two"
    assert os.listdir(tmp_path) == ["f"]


def test_object_store_checkpoints_are_refused_clearly() -> None:
    with pytest.raises(CheckpointError, match="only local paths"):
        Checkpoint("s3://bucket/chk")


# ----------------------------------------------------------------- metadata lost


@pytest.mark.parametrize("folder", ["offsets", "commits"])
def test_a_missing_metadata_next_to_batches_is_refused(tmp_path: Path, folder: str) -> None:
    cp = opened(tmp_path)
    first_id = cp.metadata["id"]
    cp.write_offsets(OffsetEntry(0, [{"v": 0}], [{"v": 5}], 1))
    cp.write_commit(0)
    cp.close()
    os.unlink(tmp_path / "metadata")
    if folder == "commits":
        os.unlink(tmp_path / "offsets" / "0")
    with pytest.raises(CheckpointError, match=r"metadata file .*/metadata is missing.*Fix: restore the metadata file"):
        opened(tmp_path)
    assert not (tmp_path / "metadata").exists(), "no new query id may be made up"
    assert first_id


@pytest.mark.parametrize(
    "doc",
    [
        {"batchId": 0, "timestamp": 1},
        {"batchId": 0, "sources": []},
        {"batchId": 0, "sources": {"start": {}, "end": {}}},
        {"batchId": 0, "sources": [{"start": {"v": 0}, "end": 5}]},
        {"batchId": 0, "sources": [{"start": {"v": 0}, "end": [1, 2]}]},
        {"batchId": 0, "sources": [{"start": "x", "end": {"v": 1}}]},
        {"batchId": 0, "sources": [{"start": {"v": 0}}]},
        {"batchId": 0, "sources": [{"start": {"v": 0}, "end": None}]},
        {"batchId": 0, "sources": ["abc"]},
        {"batchId": "zero", "sources": [{"start": {"v": 0}, "end": {"v": 1}}]},
        {"batchId": None, "sources": [{"start": {"v": 0}, "end": {"v": 1}}]},
        {"batchId": 0, "timestamp": "now", "sources": [{"start": {"v": 0}, "end": {"v": 1}}]},
        {"batchId": 7, "sources": [{"start": {"v": 0}, "end": {"v": 1}}]},
        {"batchId": 0, "sources": [{"start": {"v": 0}, "end": {"v": 1}}, {"start": {"v": 0}, "end": {"v": 1}}]},
    ],
    ids=["no-sources", "empty-sources", "sources-not-a-list", "int-end", "list-end", "string-start", "no-end",
         "null-end-not-real-time", "source-not-an-object", "string-batch-id", "null-batch-id", "string-timestamp",
         "other-batch-id", "more-sources-than-the-query"],
)  # fmt: skip
def test_a_structurally_wrong_offsets_entry_is_a_checkpoint_error(tmp_path: Path, doc: dict[str, Any]) -> None:
    cp = opened(tmp_path)
    (tmp_path / "offsets" / "0").write_text(json.dumps(doc))
    with pytest.raises(CheckpointError, match=r"offsets/0"):
        cp.latest()
    cp.close()


def test_structurally_wrong_metadata_is_a_checkpoint_error(tmp_path: Path) -> None:
    (tmp_path / "metadata").write_text(json.dumps({"id": "x", "sources": "delta"}))
    with pytest.raises(CheckpointError, match="'sources' is not a list"):
        opened(tmp_path)


# ----------------------------------------------------------------- unusable location


def _unwritable(tmp_path: Path) -> str:
    if os.geteuid() == 0:  # root writes anywhere a mode allows; /sys refuses new folders even to root
        return "/sys/headrace-test-checkpoint"
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    return str(ro / "chk")


@pytest.mark.parametrize("kind", ["file", "dev-null", "under-a-file", "unwritable"])
def test_an_unusable_location_is_a_clear_checkpoint_error(tmp_path: Path, kind: str) -> None:
    (tmp_path / "afile").write_text("x")
    location = {
        "file": str(tmp_path / "afile"),
        "dev-null": "/dev/null",
        "under-a-file": str(tmp_path / "afile" / "chk"),
        "unwritable": _unwritable(tmp_path),
    }[kind]
    with pytest.raises(CheckpointError, match=r"cannot be used as a checkpoint folder.*Fix: give a folder") as e:
        opened(Path(location))
    assert not isinstance(e.value, OSError)


def test_an_unusable_location_fails_start_with_a_checkpoint_error(tmp_path: Path) -> None:
    import headrace as hr

    w = hr.read_stream.format("rate-micro-batch").option("rowsPerBatch", 1).load().write_stream.format("noop")
    with pytest.raises(CheckpointError, match="/dev/null"):
        w.option("checkpointLocation", "/dev/null").start()


def test_cli_reports_an_unusable_location_in_one_line(tmp_path: Path) -> None:
    pipeline = tmp_path / "p.toml"
    pipeline.write_text(
        'checkpoint = "/dev/null"\n[source]\nformat = "rate-micro-batch"\noptions = { rowsPerBatch = 1, totalRows = 1 }\n'
        '[sink]\nformat = "noop"\n'
    )
    out = subprocess.run([sys.executable, "-m", "headrace.cli", "run", str(pipeline)], capture_output=True, text=True)
    assert out.returncode != 0
    assert "Traceback" not in out.stderr and "cannot be used as a checkpoint folder" in out.stderr


# ----------------------------------------------------------------- first start failed


@pytest.mark.parametrize("change", ["name", "sources", "both"])
def test_a_corrected_definition_takes_over_a_checkpoint_without_commits(
    tmp_path: Path, change: str, caplog: pytest.LogCaptureFixture
) -> None:
    cp = opened(tmp_path, "typo", [{"connector": "delta", "path": "/wrong/path"}])
    old_id = cp.metadata["id"]
    cp.write_offsets(OffsetEntry(0, [{"v": 0}], [{"v": 5}], 1))  # failed in batch 0, never committed
    os.makedirs(cp.source_state_path(0) + "/junk")
    cp.close()
    name = "fixed" if change in ("name", "both") else "typo"
    sources = SOURCES if change in ("sources", "both") else [{"connector": "delta", "path": "/wrong/path"}]
    with caplog.at_level(logging.WARNING, logger="headrace.checkpoint"):
        cp = opened(tmp_path, name, sources)
    assert "never committed a batch" in caplog.text and "takes it over" in caplog.text
    assert cp.metadata["id"] != old_id and cp.metadata["name"] == name and cp.metadata["sources"] == sources
    assert cp.latest() == (None, False), "the old definition's uncommitted batch is not replayed"
    assert not os.path.exists(tmp_path / "sources" / "0" / "junk")
    cp.close()


def test_once_a_batch_committed_the_definition_is_fixed(tmp_path: Path) -> None:
    cp = opened(tmp_path, "q")
    cp.write_offsets(OffsetEntry(0, [{"v": 0}], [{"v": 5}], 1))
    cp.write_commit(0)
    cp.close()
    with pytest.raises(CheckpointError, match="belongs to query 'q'"):
        opened(tmp_path, "other")


def test_a_query_that_failed_before_its_first_batch_can_be_corrected(tmp_path: Path) -> None:
    import headrace as hr

    chk = str(tmp_path / "chk")
    (tmp_path / "in-the-way").write_text("a file where the output folder should be")
    first = (hr.read_stream.format("rate-micro-batch").options(rowsPerBatch=5, totalRows=10).load()
             .write_stream.format("files").query_name("typo").option("checkpointLocation", chk)
             .trigger(available_now=True).start(str(tmp_path / "in-the-way" / "out")))  # fmt: skip
    with pytest.raises(hr.StreamingQueryException):
        first.await_termination(30)
    fixed = (hr.read_stream.format("rate-micro-batch").options(rowsPerBatch=5, totalRows=10).load()
             .write_stream.format("files").query_name("fixed").option("checkpointLocation", chk)
             .trigger(available_now=True).start(str(tmp_path / "out")))  # fmt: skip
    fixed.await_termination(30)
    assert sum(p["numInputRows"] for p in fixed.recent_progress) == 10


@pytest.mark.parametrize("most", [None, 3], ids=["whole-writes", "short-writes"])
def test_atomic_write_of_buffers_writes_them_in_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     most: int | None) -> None:  # fmt: skip
    """Buffers (an Arrow buffer, bytes) are written one after the other without being joined,
    every byte even when the system writes fewer than asked."""
    import pyarrow as pa

    if most is not None:
        real = os.writev

        def short(fd: int, views: list[memoryview]) -> int:
            return real(fd, [views[0][:most]])

        monkeypatch.setattr(os, "writev", short)
    target = tmp_path / "f"
    atomic_write(str(target), [pa.py_buffer(b"headrace "), b"state", memoryview(b" file")])
    assert target.read_bytes() == b"headrace state file"
