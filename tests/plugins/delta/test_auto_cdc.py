"""AUTO CDC into Delta (the delta sink with keys / sequenceBy / applyAsDeletes): SCD type 1
upserts and deletes, SCD type 2 history, idempotent replays through the app transaction."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from headrace.plugins import registry
from headrace.protocols import SinkContext
from headrace.transforms.auto_cdc import last_per_key, prepare

CDC = {"keys": "id", "sequenceBy": "seq", "applyAsDeletes": "_change_type = 'delete'", "exceptColumnList": "_change_type"}


def sink(options: dict[str, Any], tmp_path: Path) -> Any:
    spec = registry().get("delta")
    opts = spec.sink_options.parse(options, connector="delta", role="sink")
    (tmp_path / "state").mkdir(exist_ok=True)
    return spec.load_sink()(opts, SinkContext(query_id="q1", state_path=str(tmp_path / "state")))


def events(rows: list[tuple[int, str | None, int, str]]) -> pa.Table:
    ids, vs, seqs, types = zip(*rows, strict=True)
    return pa.table({"id": pa.array(ids, pa.int64()), "v": pa.array(vs, pa.string()), "seq": pa.array(seqs, pa.int64()),
                     "_change_type": pa.array(types, pa.string())})  # fmt: skip


def apply(s: Any, batch_id: int, table: pa.Table) -> None:
    s.commit(batch_id, [s.write(batch_id, iter(table.to_batches(max_chunksize=2)))])


def rows(path: Path, *cols: str) -> list[tuple[Any, ...]]:
    t = DeltaTable(str(path)).to_pyarrow_table()
    return sorted(tuple(r[c] for c in cols) for r in t.to_pylist())


def test_scd1_upserts_deletes_and_replays(tmp_path: Path) -> None:
    out = tmp_path / "t"
    s = sink({"path": str(out), **CDC}, tmp_path)
    apply(s, 0, events([(1, "a", 1, "insert"), (2, "b", 2, "insert"), (3, "c", 3, "insert")]))
    batch = events([(1, "new", 9, "update_postimage"), (1, "old", 5, "update_postimage"), (1, "X", 10, "update_preimage"),
                    (2, None, 6, "delete"), (4, "d", 7, "insert")])  # fmt: skip
    apply(s, 1, batch)
    assert rows(out, "id", "v", "seq") == [(1, "new", 9), (3, "c", 3), (4, "d", 7)]
    version = DeltaTable(str(out)).version()
    apply(sink({"path": str(out), **CDC}, tmp_path), 1, batch)  # a replay after a restart
    assert DeltaTable(str(out)).version() == version
    apply(s, 2, events([(1, "stale", 4, "update_postimage"), (3, None, 2, "delete")]))  # older than the rows
    assert rows(out, "id", "v", "seq") == [(1, "new", 9), (3, "c", 3), (4, "d", 7)]
    assert "_change_type" not in DeltaTable(str(out)).schema().to_arrow().names


def test_scd2_history(tmp_path: Path) -> None:
    out = tmp_path / "h"
    s = sink({"path": str(out), **CDC, "storedAsScdType": "2", "exceptColumnList": "_change_type,seq"}, tmp_path)
    apply(s, 0, events([(1, "a", 1, "insert"), (2, "b", 2, "insert")]))
    apply(s, 1, events([(1, "a2", 5, "update_postimage"), (1, "a3", 6, "update_postimage"), (2, None, 7, "delete"),
                        (3, "c", 8, "insert")]))  # fmt: skip
    apply(s, 2, events([(1, None, 9, "delete"), (2, "b2", 10, "insert")]))
    assert rows(out, "id", "v", "__START_AT", "__END_AT") == [
        (1, "a", 1, 5), (1, "a2", 5, 6), (1, "a3", 6, 9), (2, "b", 2, 7), (2, "b2", 10, None), (3, "c", 8, None),
    ]  # fmt: skip


def test_options_need_keys() -> None:
    spec = registry().get("delta")
    with pytest.raises(Exception, match=r"needs the target's key columns"):
        spec.sink_options.parse({"path": "/x", "sequenceBy": "seq"}, connector="delta", role="sink")


@pytest.mark.parametrize("except_cols", ["_change_type", "_change_type,seq"], ids=["keeps-seq", "without-seq"])
def test_scd1_tombstones_keep_deleted_keys_deleted(tmp_path: Path, except_cols: str) -> None:
    out = tmp_path / "t"
    opts = {"path": str(out), **CDC, "exceptColumnList": except_cols}
    s = sink(opts, tmp_path)
    apply(s, 0, events([(1, "a", 1, "insert"), (2, "b", 2, "insert"), (3, "c", 3, "insert")]))
    apply(s, 1, events([(1, None, 10, "delete"), (2, None, 11, "delete")]))
    # out of order: older events of the deleted keys in a later batch
    apply(s, 2, events([(1, "late", 5, "insert"), (2, "late", 9, "update_postimage"), (3, "c2", 12, "update_postimage")]))
    assert rows(out, "id", "v") == [(3, "c2")]
    apply(s, 3, events([(1, "back", 20, "insert")]))  # newer than the delete: the key comes back
    apply(s, 4, events([(1, None, 7, "delete"), (2, "older", 11, "insert")]))  # a stale delete; equal to the delete
    assert rows(out, "id", "v") == [(1, "back"), (2, "older"), (3, "c2")]
    # a replay of batch 4 after a crash between the tombstones and the MERGE drops the same events
    (tmp_path / "t2").mkdir()
    s2 = sink({**opts, "path": str(tmp_path / "t2")}, tmp_path / "t2")
    apply(s2, 0, events([(5, "a", 1, "insert")]))
    batch = events([(5, None, 4, "delete"), (6, "x", 2, "insert")])
    s2._tombstones.apply(last_per_key(prepare(batch, s2.cdc), ["id"]), ["id"], 1)  # recorded, then killed
    apply(s2, 1, batch)
    assert rows(tmp_path / "t2", "id", "v") == [(6, "x")]
    apply(s2, 2, events([(5, "late", 3, "insert")]))
    assert rows(tmp_path / "t2", "id", "v") == [(6, "x")]


def test_scd1_tombstone_retention(tmp_path: Path) -> None:
    out = tmp_path / "t"
    s = sink({"path": str(out), **CDC, "tombstoneRetention": "1 hour"}, tmp_path)
    now = 1_800_000_000.0
    s._tombstones.clock = lambda: now - 3000  # id 1's delete
    apply(s, 0, events([(1, "a", 1, "insert"), (2, "b", 2, "insert")]))
    apply(s, 1, events([(1, None, 10, "delete")]))
    s._tombstones.clock = lambda: now - 100  # id 2's delete; id 1's is 48 minutes old
    apply(s, 2, events([(2, None, 11, "delete")]))
    assert sorted(s._tombstones.scan()["id"].to_pylist()) == [1, 2]
    s._tombstones.clock = lambda: now + 1000  # id 1's delete is 67 minutes old
    apply(s, 3, events([(1, "late", 5, "insert"), (2, "late", 5, "insert")]))
    assert rows(out, "id", "v") == []  # both still apply to batch 3 ...
    assert s._tombstones.scan()["id"].to_pylist() == [2]  # ... then id 1's expired
    apply(s, 4, events([(1, "late", 6, "insert"), (2, "late", 6, "insert")]))
    assert rows(out, "id", "v") == [(1, "late")]
    s0 = sink({"path": str(tmp_path / "u"), **CDC, "tombstoneRetention": "0"}, tmp_path)
    assert s0._tombstones is None


def test_a_widened_column_needs_merge_schema_and_widens_the_table(tmp_path: Path) -> None:
    out = tmp_path / "w"

    def batch(v: pa.Array, seq: int) -> pa.Table:
        return pa.table({"id": pa.array([1, 2], pa.int64()), "v": v, "seq": pa.array([seq, seq], pa.int64()),
                         "_change_type": ["insert", "insert"]})  # fmt: skip

    apply(sink({"path": str(out), **CDC}, tmp_path), 0, batch(pa.array([1, 2], pa.int32()), 1))
    wide = batch(pa.array([1, 2**40], pa.int64()), 2)
    with pytest.raises(Exception, match=r"widened column\(s\) v \(int32 -> int64\).*mergeSchema=true"):
        apply(sink({"path": str(out), **CDC}, tmp_path), 1, wide)
    apply(sink({"path": str(out), **CDC, "mergeSchema": "true"}, tmp_path), 1, wide)
    assert pa.schema(DeltaTable(str(out)).schema().to_arrow()).field("v").type == pa.int64()
    assert rows(out, "id", "v") == [(1, 1), (2, 2**40)]
