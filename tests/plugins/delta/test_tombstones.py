"""The delta sink's AUTO CDC delete tombstones (headrace_delta._tombstones): kept in a headrace
state store whose version is the batch id, work per batch bounded by the batch, damaged stores
refused, versions without gaps across batches without events."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from headrace.errors import CheckpointError
from headrace.transforms.auto_cdc import DELETE, SEQ
from headrace_delta._tombstones import FOLDER, TombstoneStore

from .test_auto_cdc import CDC, apply, events, rows, sink


def latest(ids: Any, seqs: Any, deletes: Any) -> pa.Table:
    """One event per key, as :func:`last_per_key` hands them to the tombstones."""
    return pa.table({"id": pa.array(ids, pa.int64()), SEQ: pa.array(seqs, pa.int64()),
                     DELETE: pa.array(deletes, pa.bool_())})  # fmt: skip


def batch_work(earlier: int, tmp_path: Path) -> tuple[dict[str, int], int]:
    """The store's work for one batch of 300 events after ``earlier`` tombstones were recorded
    in 10 batches; and the size of that batch's changelog."""
    t = TombstoneStore(str(tmp_path / f"n{earlier}"), 2 * 86400.0)
    per = earlier // 10
    for b in range(10):
        ids = np.arange(b * per, (b + 1) * per)
        t.apply(latest(ids, ids + 1000, np.ones(per, bool)), ["id"], b)
    assert len(t.store) == earlier
    t.store.settle()  # the background snapshot of version 9 out of the measured batch
    before = t.store.work.copy()
    # 100 late upserts of deleted keys (dropped), 100 new deletes, 100 upserts of other keys
    ids = np.concatenate([np.arange(100), np.arange(10**7, 10**7 + 200)])
    out = t.apply(latest(ids, np.full(300, 500), np.arange(300) < 200), ["id"], 10)
    t.store.settle()
    work = t.store.work.minus(before)
    assert out.num_rows == 200 and len(t.store) == earlier + 100
    size = os.path.getsize(os.path.join(t.store.path, "changelog", "10"))
    t.close()
    return work, size


def test_work_per_batch_does_not_grow_with_tombstones(tmp_path: Path) -> None:
    small, small_size = batch_work(100, tmp_path)
    large, large_size = batch_work(100_000, tmp_path)
    assert small == large, (small, large)
    assert small["rows_looked_up"] == 300 and small["rows_written"] == 100 and small["changelog_rows"] == 100
    assert small["restore_rows"] == small["snapshot_rows"] == small["rows_scanned"] == 0
    assert small_size == large_size


def _two_batches(tmp_path: Path) -> Path:
    s = sink({"path": str(tmp_path / "t"), **CDC}, tmp_path)
    apply(s, 0, events([(1, "a", 1, "insert"), (2, "b", 2, "insert"), (3, "c", 3, "insert")]))
    apply(s, 1, events([(1, None, 10, "delete")]))
    apply(s, 2, events([(2, None, 11, "delete")]))
    s.close()
    return tmp_path / "state" / FOLDER / "from-0"


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 3] ^= 0xFF
    path.write_bytes(bytes(data))


DAMAGE = {
    "flipped-byte": (lambda d: _flip(d / "changelog" / "1"), r"changelog/1 is damaged \(checksum mismatch\)"),
    "truncated": (lambda d: (d / "changelog" / "1").write_bytes((d / "changelog" / "1").read_bytes()[:30]),
                  r"changelog/1 is damaged"),
    "missing-changelog": (lambda d: (d / "changelog" / "0").unlink(), r"changelog/0 is missing"),
    "bad-metadata": (lambda d: (d / "metadata").write_text("{not json"), r"metadata .* is corrupt"),
    "two-stores": (lambda d: (d.parent / "from-2").mkdir(), r"holds several stores \(from-0, from-2\)"),
}


@pytest.mark.parametrize("damage", list(DAMAGE), ids=list(DAMAGE))
def test_damaged_store_is_refused(tmp_path: Path, damage: str) -> None:
    store = _two_batches(tmp_path)
    change, message = DAMAGE[damage]
    change(store)
    s = sink({"path": str(tmp_path / "t"), **CDC}, tmp_path)  # a new run
    with pytest.raises(CheckpointError, match=message):
        apply(s, 3, events([(1, "late", 5, "insert"), (2, "late", 5, "insert")]))
    assert rows(tmp_path / "t", "id", "v") == [(3, "c")]  # nothing applied


def test_batches_without_events_keep_versions_contiguous(tmp_path: Path) -> None:
    s = sink({"path": str(tmp_path / "t"), **CDC}, tmp_path)
    apply(s, 0, events([(1, "a", 1, "insert"), (2, "b", 2, "insert")]))
    apply(s, 1, events([(1, None, 10, "delete")]))
    apply(s, 2, events([(2, "x", 9, "update_preimage")]))  # no events once prepared
    s.close()
    s = sink({"path": str(tmp_path / "t"), **CDC}, tmp_path)  # a new run, whose first batch has no events
    apply(s, 3, events([(2, "x", 9, "update_preimage")]))
    apply(s, 4, events([(1, "late", 5, "insert")]))
    assert rows(tmp_path / "t", "id", "v") == [(2, "b")]
    assert sorted(os.listdir(tmp_path / "state" / FOLDER / "from-0" / "changelog")) == ["0", "1", "2", "3", "4"]


def test_replay_of_a_merged_first_batch_keeps_its_tombstones(tmp_path: Path) -> None:
    """Killed after batch 0's MERGE, before the engine recorded it: the replay is skipped (its
    transaction is in the table) and must not start the store over."""
    s = sink({"path": str(tmp_path / "t"), **CDC}, tmp_path)
    first = events([(1, "a", 1, "insert"), (9, None, 10, "delete")])
    apply(s, 0, first)
    s = sink({"path": str(tmp_path / "t"), **CDC}, tmp_path)  # the restart
    apply(s, 0, first)
    assert s.metrics()["skipped"]
    apply(s, 1, events([(9, "late", 5, "insert")]))
    assert rows(tmp_path / "t", "id", "v") == [(1, "a")]


def test_batches_skipped_by_a_user_txn_version_keep_versions_contiguous(tmp_path: Path) -> None:
    """txnAppId/txnVersion fixed by the user: the batches after the first of a run are skipped
    whole, and still advance the store."""
    opts = {"path": str(tmp_path / "t"), **CDC, "txnAppId": "app"}
    s = sink({**opts, "txnVersion": "1"}, tmp_path)
    apply(s, 0, events([(1, "a", 1, "insert"), (2, None, 10, "delete")]))
    apply(s, 1, events([(3, "c", 1, "insert")]))  # skipped: txn app/1 is in the table
    s = sink({**opts, "txnVersion": "1"}, tmp_path)  # a new run: the store is not open yet
    apply(s, 2, events([(4, "d", 1, "insert")]))  # skipped
    s = sink({**opts, "txnVersion": "2"}, tmp_path)
    apply(s, 3, events([(2, "late", 5, "insert"), (5, "e", 1, "insert")]))
    assert rows(tmp_path / "t", "id", "v") == [(1, "a"), (5, "e")]


def test_gap_in_versions_is_refused(tmp_path: Path) -> None:
    """tombstoneRetention turned off for a batch, then on again: the tombstones of that batch
    are missing, so the store cannot give the state before the next one."""
    _two_batches(tmp_path)
    off = sink({"path": str(tmp_path / "t"), **CDC, "tombstoneRetention": "0"}, tmp_path)
    apply(off, 3, events([(3, None, 12, "delete")]))
    s = sink({"path": str(tmp_path / "t"), **CDC}, tmp_path)
    with pytest.raises(CheckpointError, match=r"tombstones as of batch 3 cannot be restored.*tombstoneRetention was 0"):
        apply(s, 4, events([(3, "late", 5, "insert")]))


def test_rollback_before_the_first_tombstones_starts_over(tmp_path: Path) -> None:
    """A checkpoint rolled back to before the store's first batch: none of its tombstones apply."""
    t = TombstoneStore(str(tmp_path), 3600.0)
    t.apply(latest([1], [10], [True]), ["id"], 5)  # tombstones turned on at batch 5
    t.apply(latest([2], [10], [True]), ["id"], 6)
    t.close()
    t = TombstoneStore(str(tmp_path), 3600.0)
    out = t.apply(latest([1, 2], [5, 5], [False, False]), ["id"], 3)  # `checkpoint reset --to-batch 2`
    assert out["id"].to_pylist() == [1, 2]
    assert os.listdir(tmp_path / FOLDER) == ["from-3"] and len(t.store) == 0
    assert t.apply(latest([1, 2], [4, 4], [True, False]), ["id"], 4)["id"].to_pylist() == [1, 2]
    assert t.scan()["id"].to_pylist() == [1]
    t.close()


def test_without_checkpoint_kept_in_a_temporary_folder(tmp_path: Path) -> None:
    t = TombstoneStore(None, 3600.0)
    t.apply(latest([1], [10], [True]), ["id"], 0)
    assert t.apply(latest([1, 2], [5, 5], [False, True]), ["id"], 1)["id"].to_pylist() == [2]
    folder = t.store.path
    assert not t.durable and os.path.isdir(folder)
    t.close()
    assert not os.path.exists(folder)
