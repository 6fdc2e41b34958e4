"""The change source split by job: its public names importable from headrace_lakebase.cdc_source
as before, partitions picklable, and the offset -> partition mapping and stream-end scan."""

from __future__ import annotations

import pickle
from typing import Any, cast

import headrace_lakebase.cdc_source as cdc_source
from headrace_lakebase.cdc_partitions import SnapshotPartition, StreamPartition, plan_partitions, stream_end


def test_public_names_stay_importable_from_cdc_source() -> None:
    from headrace_lakebase.cdc_source import LakebaseChangeSource
    from headrace_lakebase.cdc_source import SnapshotPartition as S
    from headrace_lakebase.cdc_source import StreamPartition as T

    assert set(cdc_source.__all__) == {"LakebaseChangeSource", "SnapshotPartition", "StreamPartition"}
    assert S is SnapshotPartition and T is StreamPartition
    assert hasattr(LakebaseChangeSource, "_read_snapshot") and hasattr(LakebaseChangeSource, "_plan_snapshot_range")


def test_partitions_pickle() -> None:
    for p in (StreamPartition(5, 9, {"lsn": 7, "xmin": 1}), SnapshotPartition(("1",), ("9",), "1:2:", 3, final=True)):
        assert pickle.loads(pickle.dumps(p)) == p


def test_plan_partitions() -> None:
    start: dict[str, Any] = {
        "phase": "snapshot", "lsn": 10, "after": ["4"], "snap": {"text": "s", "time": 7, "lsn": 20}}
    mid = {**start, "after": ["8"]}
    assert plan_partitions(start, start) == []
    assert plan_partitions(start, mid) == [SnapshotPartition(("4",), ("8",), "s", 7)]
    last = {**mid, "phase": "stream", "lsn": 30, "last": ["12"]}
    assert plan_partitions(mid, last) == [SnapshotPartition(("8",), ("12",), "s", 7, final=True),
                                          StreamPartition(10, 30, mid["snap"])]  # fmt: skip
    empty = {**start, "phase": "stream", "after": None, "last": None}
    assert cast(SnapshotPartition, plan_partitions({**start, "after": None}, empty)[0]).empty


def _begin(final: int) -> bytes:
    return b"B" + final.to_bytes(8, "big") + bytes(12)


def _commit(end: int) -> bytes:
    return b"C" + bytes(1) + (end - 1).to_bytes(8, "big") + end.to_bytes(8, "big") + bytes(8)


def test_stream_end_is_after_the_last_whole_transaction() -> None:
    rows = [(1, _begin(100)), (2, b"I..."), (3, _commit(110)), (4, _begin(200)), (5, b"I...")]
    assert stream_end(rows, 50, None) == 110  # the second transaction is cut: not included
    assert stream_end([*rows, (6, _commit(210))], 50, None) == 210
    assert stream_end([*rows, (6, _commit(210))], 50, 200) == 110  # the available-now mark
    assert stream_end(rows, 150, None) == 150  # committed before the start: skipped
