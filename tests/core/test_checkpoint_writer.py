"""The checkpoint's background writer: offsets entries appear in batch order however their
fsyncs finish, commit markers are hard links made at once and durable later (markers written
whole: visible once renamed, durable once their folder is fsynced), a failed entry stops the
later ones, and a killed writer's temporary files are cleaned on open."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest

import headrace.checkpoint.writer as writer_mod
from headrace.checkpoint import Checkpoint, OffsetEntry
from headrace.checkpoint.atomic_files import DirSync, write_temp
from headrace.checkpoint.writer import LogWriter
from headrace.errors import CheckpointError
from headrace.testing import wait_for


def _log(tmp_path: Path, durable: bool = True) -> LogWriter:
    for folder in ("offsets", "commits"):
        (tmp_path / folder).mkdir(exist_ok=True)
    return LogWriter(str(tmp_path), durable=durable, retain=100)


def test_entries_appear_in_batch_order_when_an_earlier_fsync_is_slow(tmp_path: Path, monkeypatch: Any) -> None:
    release = threading.Event()

    def slow_first(path: str, data: bytes, *, durable: bool = True) -> str:
        if path.endswith(os.sep + "0"):
            assert release.wait(10)
        return write_temp(path, data, durable=durable)

    monkeypatch.setattr(writer_mod, "write_temp", slow_first)
    w = _log(tmp_path)
    first = w.offsets(0, b'{"batchId":0}')
    second = w.offsets(1, b'{"batchId":1}')
    # the second entry's file is written meanwhile, but it is renamed only after the first
    wait_for(lambda: any(n.startswith("1.") for n in os.listdir(tmp_path / "offsets")), what="entry 1's temp file")
    assert not (tmp_path / "offsets" / "1").exists() and not second.done()
    release.set()
    first.result(10)
    second.result(10)
    assert sorted(os.listdir(tmp_path / "offsets")) == ["0", "1"]
    w.close()


def test_a_failed_entry_keeps_the_later_ones_out_of_the_log(tmp_path: Path, monkeypatch: Any) -> None:
    def failing_first(path: str, data: bytes, *, durable: bool = True) -> str:
        if path.endswith(os.sep + "0"):
            raise OSError(28, "No space left on device")
        return write_temp(path, data, durable=durable)

    monkeypatch.setattr(writer_mod, "write_temp", failing_first)
    w = _log(tmp_path)
    first, second = w.offsets(0, b"{}"), w.offsets(1, b"{}")
    with pytest.raises(OSError, match="No space"):
        first.result(10)
    with pytest.raises(CheckpointError, match="earlier entry failed"):
        second.result(10)
    w.close()
    assert os.listdir(tmp_path / "offsets") == []  # no gap, no temporary file


def test_a_commit_marker_is_a_link_to_its_entry_visible_at_once_and_durable_after_a_flush(tmp_path: Path) -> None:
    cp = Checkpoint(str(tmp_path))
    cp.open(name="q", sources=[{"connector": "rate"}], sink={"connector": "noop"})
    cp.write_offsets_async(OffsetEntry(0, [{"v": 0}], [{"v": 5}], 1)).result(10)
    durable = cp.publish_commit(0)
    marker, entry = tmp_path / "commits" / "0", tmp_path / "offsets" / "0"
    assert marker.exists() and os.path.samefile(marker, entry)  # visible before any fsync
    doc = json.loads(marker.read_bytes())
    assert doc["version"] == 1 and doc["batchId"] == 0
    cp.flush_commits()
    durable.result(10)
    assert cp.committed_ids() == [0] and cp.pending() == []
    cp.close()


def test_markers_are_made_durable_by_the_next_entry_and_old_batches_purged(tmp_path: Path) -> None:
    cp = Checkpoint(str(tmp_path), retain=2)
    cp.open(name="q", sources=[{"connector": "rate"}], sink={"connector": "noop"})
    markers = []
    for n in range(5):
        cp.write_offsets_async(OffsetEntry(n, [{"v": n}], [{"v": n + 1}], 1)).result(10)
        markers.append(cp.publish_commit(n))
    cp.write_offsets_async(OffsetEntry(5, [{"v": 5}], [{"v": 6}], 1)).result(10)
    for m in markers:  # the job that wrote entry 5 fsynced the commits folder: no flush needed
        m.result(10)
    cp.close()
    assert sorted(int(n) for n in os.listdir(tmp_path / "commits")) == [3, 4]
    assert sorted(int(n) for n in os.listdir(tmp_path / "offsets")) == [3, 4, 5]


def test_group_fsync_of_a_folder_serves_concurrent_callers(tmp_path: Path) -> None:
    sync = DirSync(str(tmp_path))
    threads = [threading.Thread(target=sync.sync) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert not any(t.is_alive() for t in threads)
    assert sync._synced == 8


def test_temporary_files_of_a_killed_writer_are_removed_on_open(tmp_path: Path) -> None:
    cp = Checkpoint(str(tmp_path))
    cp.open(name="q", sources=[{"connector": "rate"}], sink={"connector": "noop"})
    cp.close()
    stale = tmp_path / "offsets" / "3.4242.deadbeef.tmp"
    stale.write_bytes(b'{"half')
    keep = tmp_path / "offsets" / "notes.txt"
    keep.write_text("not ours")
    cp = Checkpoint(str(tmp_path))
    cp.open(name="q", sources=[{"connector": "rate"}], sink={"connector": "noop"})
    cp.close()
    assert not stale.exists() and keep.exists()


def test_a_marker_written_whole_is_visible_before_its_folder_is_fsynced(tmp_path: Path, monkeypatch: Any) -> None:
    cp = Checkpoint(str(tmp_path))
    cp.open(name="q", sources=[{"connector": "rate"}], sink={"connector": "noop"})
    release = threading.Event()
    real_sync = DirSync.sync

    def slow_sync(self: DirSync) -> None:
        if self.folder.endswith("commits"):
            assert release.wait(10)
        real_sync(self)

    monkeypatch.setattr(DirSync, "sync", slow_sync)
    visible, durable = cp.write_commit_async(0, {"eventTimeMaxMs": {"0": 7}})
    visible.result(10)  # renamed into place with its content fsynced; the folder's fsync still waits
    doc = json.loads((tmp_path / "commits" / "0").read_bytes())
    assert doc["batchId"] == 0 and doc["eventTimeMaxMs"] == {"0": 7}
    assert not durable.done()
    release.set()
    durable.result(10)
    cp.close()


@pytest.mark.parametrize("fails", ["state-write", "folder-fsync"])
def test_a_failure_fails_what_it_reaches_of_a_marker_written_whole(tmp_path: Path, monkeypatch: Any, fails: str) -> None:
    cp = Checkpoint(str(tmp_path))
    cp.open(name="q", sources=[{"connector": "rate"}], sink={"connector": "noop"})
    state: Any  # stands in for the batch's state write
    if fails == "state-write":

        class Failed:
            def result(self, timeout: float | None = None) -> None:
                raise OSError("No space left on device")

        state = Failed()
    else:
        real_sync = DirSync.sync

        def failing_sync(self: DirSync) -> None:
            if self.folder.endswith("commits"):
                raise OSError("No space left on device")
            real_sync(self)

        monkeypatch.setattr(DirSync, "sync", failing_sync)

        class Done:
            def result(self, timeout: float | None = None) -> None:
                return None

        state = Done()
    visible, durable = cp.write_commit_async(0, {"eventTimeMaxMs": {}}, after=[state])
    with pytest.raises(OSError, match="No space"):
        durable.result(10)
    if fails == "state-write":  # the state is not durable: no marker
        with pytest.raises(OSError, match="No space"):
            visible.result(10)
        assert os.listdir(tmp_path / "commits") == []
    else:  # visible, not durable: its sources are never told (the engine waits for durable first)
        visible.result(10)
        assert os.listdir(tmp_path / "commits") == ["0"]
    cp.close()
