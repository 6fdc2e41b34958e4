from __future__ import annotations

import json
import os
from pathlib import Path

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
    opened(tmp_path).close()
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
    entry, committed = cp.latest()
    assert entry is not None and entry.batch_id == 1 and committed
    with pytest.raises(CheckpointError, match="in use"):
        Checkpoint(str(tmp_path)).reset_to(0)
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
