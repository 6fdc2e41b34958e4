"""The state stores (memory and RocksDB), one test suite run against both backends."""

from __future__ import annotations

import itertools
import os
import random
from pathlib import Path
from typing import Any, cast

import numpy as np
import pyarrow as pa
import pytest

from headrace.errors import CheckpointError, UnsupportedError
from headrace.state import StateStore, open_state_store

BACKENDS = ["memory", "rocksdb"]
KEYS = pa.schema([("user", pa.string()), ("wend", pa.timestamp("us", tz="UTC"))])
VALUES = pa.schema([("n", pa.int64()), ("total", pa.float64()), ("last", pa.string())])


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def store(backend: str, path: Path, **kw: Any) -> StateStore:
    return open_state_store(backend, str(path), KEYS, VALUES, description="test", **kw)


def keys(users: list[str], ends: list[int]) -> pa.Table:
    return pa.table({"user": users, "wend": pa.array(ends, pa.int64()).cast(pa.timestamp("us", tz="UTC"))}, schema=KEYS)


def vals(n: list[int | None], total: list[float | None], last: list[str | None]) -> pa.Table:
    return pa.table({"n": n, "total": total, "last": last}, schema=VALUES)


def as_dict(t: pa.Table) -> dict[tuple[Any, ...], tuple[Any, ...]]:
    t = t.set_column(t.schema.get_field_index("wend"), "wend", t.column("wend").cast(pa.int64()))
    rows = t.to_pylist()
    return {(r["user"], r["wend"]): (r["n"], r["total"], r["last"]) for r in rows}


def test_put_get_remove_scan(backend: str, tmp_path: Path) -> None:
    s = store(backend, tmp_path)
    s.load(-1)
    k = keys(["a", "b", "c"], [10, 20, 30])
    s.put(k, vals([1, 2, None], [1.5, None, 3.0], ["x", None, "z"]), order=[10, 20, 30])
    got, found = s.get(keys(["b", "zz", "a"], [20, 20, 10]))
    assert found.tolist() == [True, False, True]
    assert got.to_pylist() == [
        {"n": 2, "total": None, "last": None},
        {"n": None, "total": None, "last": None},
        {"n": 1, "total": 1.5, "last": "x"},
    ]
    assert len(s) == 3
    assert s.remove(keys(["a", "nope"], [10, 1])) == 1
    assert len(s) == 2
    assert set(as_dict(s.scan())) == {("b", 20), ("c", 30)}
    s.commit(0)
    m = s.metrics()
    assert m["numRowsTotal"] == 2 and m["numRowsUpdated"] == 3 and m["numRowsRemoved"] == 1
    assert m["memoryUsedBytes"] >= 0 and m["commitTimeMs"] >= 0
    s.close()


def test_evict_by_order(backend: str, tmp_path: Path) -> None:
    s = store(backend, tmp_path)
    s.load(-1)
    s.put(keys(["a", "b", "c", "d"], [10, 20, 30, 40]), vals([1, 2, 3, 4], [0.0] * 4, ["", "", "", ""]),
          order=[10, 20, 30, 40])  # fmt: skip
    # a changed order moves the row in the index
    s.put(keys(["a"], [10]), vals([9], [0.0], [""]), order=[35])
    out = s.evict(30)
    assert sorted(out.column("n").to_pylist()) == [2, 3]
    assert sorted(out.column("__order").to_pylist()) == [20, 30]
    assert len(s) == 2
    assert s.evict(30).num_rows == 0
    s.commit(0)
    s.close()
    s2 = store(backend, tmp_path)
    s2.load(0)
    assert sorted(s2.evict(100).column("n").to_pylist()) == [4, 9]
    s2.close()


def test_restore_and_replay_from_files(backend: str, tmp_path: Path) -> None:
    s = store(backend, tmp_path, snapshot_interval=3)
    s.load(-1)
    for v in range(8):
        s.put(keys([f"u{v}", "common"], [v, 0]), vals([v, v], [float(v)] * 2, [str(v)] * 2))
        if v == 5:
            s.remove(keys(["u1"], [1]))
        s.commit(v)
        s.load(v)  # the next batch: no-op
    expected_at = {}
    s.close()
    for v in (7, 4, 2):
        s2 = store(backend, tmp_path, snapshot_interval=3)
        s2.load(v)
        expected_at[v] = as_dict(s2.scan())
        s2.close()
    users7 = {k[0] for k in expected_at[7]}
    assert users7 == {"common", "u0", *[f"u{i}" for i in range(2, 8)]}
    assert expected_at[7][("common", 0)][0] == 7
    # loading 4 discarded versions 5..7 (a replay of batch 5); replaying it differently works
    assert {k[0] for k in expected_at[4]} == {"common", "u0", "u1", "u2", "u3", "u4"} - set()
    assert {k[0] for k in expected_at[2]} == {"common", "u0", "u1", "u2"}
    s3 = store(backend, tmp_path, snapshot_interval=3)
    s3.load(2)
    s3.put(keys(["other"], [0]), vals([1], [1.0], ["o"]))
    s3.commit(3)
    s3.close()
    s4 = store(backend, tmp_path, snapshot_interval=3)
    s4.load(3)
    assert {k[0] for k in as_dict(s4.scan())} == {"common", "u0", "u1", "u2", "other"}
    s4.close()


def test_crash_after_commit_replays_from_previous_version(backend: str, tmp_path: Path) -> None:
    """Batch 1 committed its state, then the process died before the checkpoint's commit:
    the replay of batch 1 must start from version 0."""
    s = store(backend, tmp_path)
    s.load(-1)
    s.put(keys(["a"], [0]), vals([1], [1.0], ["v0"]))
    s.commit(0)
    s.load(0)
    s.put(keys(["a"], [0]), vals([2], [2.0], ["v1"]))
    s.commit(1)
    del s  # no close: as after SIGKILL
    s2 = store(backend, tmp_path)
    s2.load(0)
    got, found = s2.get(keys(["a"], [0]))
    assert found.tolist() == [True] and got.column("n").to_pylist() == [1]
    s2.close()


def test_uncommitted_changes_are_not_kept(backend: str, tmp_path: Path) -> None:
    s = store(backend, tmp_path)
    s.load(-1)
    s.put(keys(["a"], [0]), vals([1], [1.0], ["x"]))
    s.commit(0)
    s.load(0)
    s.put(keys(["b"], [0]), vals([1], [1.0], ["y"]))  # crash mid-batch 1
    s.abort()
    s.load(0)
    assert set(as_dict(s.scan())) == {("a", 0)}
    s.close()


@pytest.mark.parametrize("damage", ["flipped-byte", "truncated", "missing"])
def test_damaged_or_missing_changelog_is_refused(backend: str, tmp_path: Path, damage: str) -> None:
    s = store(backend, tmp_path)
    s.load(-1)
    for v in range(3):
        s.put(keys([f"u{v}"], [v]), vals([v], [0.0], ["x"]))
        s.commit(v)
        s.load(v)
    s.close()
    target = tmp_path / "changelog" / "1"
    if damage == "missing":
        target.unlink()
    else:
        data = bytearray(target.read_bytes())
        if damage == "flipped-byte":
            data[len(data) // 3] ^= 0xFF
        else:
            data = data[: len(data) // 2]
        target.write_bytes(bytes(data))
    if backend == "rocksdb":  # force a rebuild from files: the working database is a cache
        import shutil

        shutil.rmtree(tmp_path / "rocksdb")
    s2 = store(backend, tmp_path)
    with pytest.raises(CheckpointError, match=str(target)):
        s2.load(2)
    s2.close()


def test_damaged_snapshot_is_refused(tmp_path: Path) -> None:
    s = store("memory", tmp_path, snapshot_interval=2)
    s.load(-1)
    for v in range(4):
        s.put(keys([f"u{v}"], [v]), vals([v], [0.0], ["x"]))
        s.commit(v)
        s.settle()  # (a snapshot still being written when the next is due is put off)
        s.load(v)
    s.close()
    snap = tmp_path / "snapshot" / "3"  # two changelogs each: snapshots 1 and 3
    assert snap.exists() and (tmp_path / "snapshot" / "1").exists()
    data = bytearray(snap.read_bytes())
    data[10] ^= 0x01
    snap.write_bytes(bytes(data))
    s2 = store("memory", tmp_path, snapshot_interval=2)
    with pytest.raises(CheckpointError, match=str(snap)):
        s2.load(3)


def test_retention_keeps_what_restores_the_last_versions(backend: str, tmp_path: Path) -> None:
    s = store(backend, tmp_path, snapshot_interval=4, retain=3)
    s.load(-1)
    model: dict[int, set[str]] = {}
    live: set[str] = set()
    for v in range(30):
        live.add(f"u{v}")
        # every live row changes (the memory backend also waits for rows changed >= half the state)
        users = sorted(live)
        ends = [int(u[1:]) for u in users]
        s.put(keys(users, ends), vals([v] * len(users), [0.0] * len(users), ["x"] * len(users)))
        if v % 3 == 0 and v:
            s.remove(keys([f"u{v - 1}"], [v - 1]))
            live.discard(f"u{v - 1}")
        model[v] = set(live)
        s.commit(v)
        s.load(v)
    s.close()
    changelogs = sorted(int(n) for n in os.listdir(tmp_path / "changelog"))
    assert len(changelogs) <= 3 + 2 * 4, changelogs  # bounded, not 30
    for v in (29, 28, 27):
        s2 = store(backend, tmp_path, snapshot_interval=4, retain=3)
        s2.load(v)
        assert {k[0] for k in as_dict(s2.scan())} == model[v]
        s2.close()


def test_random_operations_match_a_model_across_restarts(backend: str, tmp_path: Path) -> None:
    rng = random.Random(7)
    model: dict[str, int] = {}
    s = store(backend, tmp_path, snapshot_interval=3)
    s.load(-1)
    for v in range(20):
        users = rng.sample([f"k{i}" for i in range(40)], 10)
        k = keys(users, [0] * 10)
        old, found = s.get(k)
        for u, f, n in zip(users, found.tolist(), old.column("n").to_pylist(), strict=True):
            assert f == (u in model) and (n == model.get(u))
        newn = [model.get(u, 0) + 1 for u in users]
        s.put(k, vals(newn, [0.0] * 10, ["x"] * 10), order=[v] * 10)  # type: ignore[arg-type]
        model.update(zip(users, newn, strict=True))
        if v % 4 == 3:
            ev = s.evict(v - 2)
            for u in ev.column("user").to_pylist():
                del model[u]
        s.commit(v)
        if v % 5 == 4:
            s.close()
            s = store(backend, tmp_path, snapshot_interval=3)
        s.load(v)
        assert {k[0]: r[0] for k, r in as_dict(s.scan()).items()} == model
    s.close()


@pytest.mark.parametrize("state_keys", [2_000, 50_000], ids=["small-state", "large-state"])
def test_batch_cost_does_not_depend_on_state_size(backend: str, tmp_path: Path, state_keys: int) -> None:
    """Work counters of one batch touching 500 keys are the same with 2k or 50k keys in state."""
    s = store(backend, tmp_path, snapshot_interval=1000)
    s.load(-1)
    step = 10_000
    for v, lo in enumerate(range(0, state_keys, step)):
        n = min(step, state_keys - lo)
        s.put(keys([f"u{i}" for i in range(lo, lo + n)], [0] * n), vals([1] * n, [0.0] * n, ["x"] * n),
              order=[1000 + i for i in range(n)])  # fmt: skip
        s.commit(v)
        s.load(v)
    last = s.version
    assert last is not None
    before = s.work.copy()
    k = keys([f"u{i}" for i in range(0, 1000, 2)], [0] * 500)
    _old, found = s.get(k)
    assert found.all()
    s.put(k, vals([2] * 500, [1.0] * 500, ["y"] * 500), order=[5] * 500)
    assert s.evict(5).num_rows == 500
    s.commit(last + 1)
    delta = s.work.minus(before)
    assert delta == {"rows_looked_up": 500, "rows_written": 500, "rows_removed": 500, "rows_scanned": 500,
                     "changelog_rows": 1000, "restore_rows": 0, "snapshot_rows": 0, "snapshots": 0}  # fmt: skip
    s.close()


def test_other_operator_or_backend_refused(tmp_path: Path) -> None:
    s = store("memory", tmp_path)
    s.close()
    with pytest.raises(CheckpointError, match="different stateful operator"):
        open_state_store("memory", str(tmp_path), KEYS, pa.schema([("n", pa.int64())]), description="other")
    with pytest.raises(CheckpointError, match="stateStore='memory'"):
        open_state_store("rocksdb", str(tmp_path), KEYS, VALUES, description="test")
    with pytest.raises(UnsupportedError, match="memory, rocksdb"):
        open_state_store("redis", str(tmp_path), KEYS, VALUES)


def test_single_int_key_and_no_values(backend: str, tmp_path: Path) -> None:
    ks = pa.schema([("id", pa.int64())])
    s = open_state_store(backend, str(tmp_path), ks, pa.schema([]))
    s.load(-1)
    k = pa.table({"id": np.arange(5)})
    _, found = s.get(k)
    assert not found.any()
    s.put(k, _empty_values(5))
    _, found = s.get(k)
    assert found.all()
    s.commit(0)
    s.close()
    s2 = open_state_store(backend, str(tmp_path), ks, pa.schema([]))
    s2.load(0)
    assert sorted(s2.scan().column("id").to_pylist()) == [0, 1, 2, 3, 4]
    s2.close()


@pytest.mark.parametrize("key_type", [pa.int64(), pa.string()], ids=["int-keys", "string-keys"])
def test_evict_without_values_returns_each_key_once_with_its_latest_order(
    backend: str, key_type: pa.DataType, tmp_path: Path
) -> None:
    ks = pa.schema([("id", key_type)])
    s = open_state_store(backend, str(tmp_path), ks, pa.schema([]))
    s.load(-1)

    def ids(xs: list[int]) -> pa.Table:
        return pa.table({"id": pa.array(xs).cast(key_type)})

    s.put(ids([5, 3, 9, 1, 7]), _empty_values(5), [50, 30, 90, 10, 70])
    s.put(ids([9, 1]), _empty_values(2), [20, 95])  # orders moved: 9 earlier, 1 later
    s.remove(ids([3]))
    s.commit(0)
    s.load(0)
    out = s.evict(60)
    assert out.column_names == ["id", "__order"]
    assert sorted(zip(out.column("id").to_pylist(), out.column("__order").to_pylist(), strict=True)) == sorted(
        zip(ids([9, 5]).column("id").to_pylist(), [20, 50], strict=True)
    )
    assert len(s) == 2
    _, found = s.get(ids([9, 5, 1, 7, 3]))
    assert found.tolist() == [False, False, True, True, False]
    s.commit(1)
    s.close()


def _empty_values(n: int) -> pa.Table:
    return pa.table({"_": pa.nulls(n)}).drop_columns(["_"])


def test_restore_reads_one_snapshot_and_the_changelogs_after_it(backend: str, tmp_path: Path) -> None:
    s = store(backend, tmp_path, snapshot_interval=5)
    s.load(-1)
    for v in range(23):
        s.put(keys([f"u{i}" for i in range(v * 10, v * 10 + 10)], [0] * 10), vals([v] * 10, [0.0] * 10, ["x"] * 10))
        s.commit(v)
        s.load(v)
        s.settle()  # each due snapshot written before the next batch (under load one could be put off)
    s.close()
    if backend == "rocksdb":  # force the rebuild path: the working database is a cache of the files
        import shutil

        shutil.rmtree(tmp_path / "rocksdb")
    snaps = sorted(int(n.split(".")[0]) for n in os.listdir(tmp_path / "snapshot") if not n.endswith(".tmp"))
    newest = snaps[-1]
    # at least 5 changelogs between snapshots (and, memory, rows changed >= half the state)
    assert all(b - a >= 5 for a, b in itertools.pairwise(snaps)) and 22 - newest <= 9, snaps
    s2 = store(backend, tmp_path, snapshot_interval=5)
    s2.load(22)
    assert len(s2) == 230
    # the newest snapshot: its rows (memory backend) and the changelogs after it, nothing older
    snapshot_rows = 10 * (newest + 1) if backend == "memory" else 0
    assert s2.work.restore_rows == snapshot_rows + 10 * (22 - newest)
    s2.close()


def test_rocksdb_stale_working_database_is_rebuilt_from_a_checkpoint(tmp_path: Path) -> None:
    """A working database left at an old version whose changelogs are gone (retention) is
    rebuilt from the newest RocksDB checkpoint and the changelogs after it."""
    import shutil

    s = store("rocksdb", tmp_path, snapshot_interval=2, retain=2)
    s.load(-1)
    for v in range(12):
        s.put(keys([f"u{v}"], [v]), vals([v], [0.0], ["x"]))
        s.commit(v)
        s.load(v)
        if v == 3:
            s.close()
            shutil.copytree(tmp_path / "rocksdb", tmp_path / "old")
            s = store("rocksdb", tmp_path, snapshot_interval=2, retain=2)
            s.load(3)
    s.close()
    assert not (tmp_path / "changelog" / "4").exists()
    shutil.rmtree(tmp_path / "rocksdb")
    shutil.move(tmp_path / "old", tmp_path / "rocksdb")
    s2 = store("rocksdb", tmp_path, snapshot_interval=2, retain=2)
    s2.load(11)
    assert {k[0] for k in as_dict(s2.scan())} == {f"u{v}" for v in range(12)}
    s2.close()


def test_next_batch_does_not_wait_for_a_background_snapshot(tmp_path: Path) -> None:
    import threading

    from headrace.state.memory import MemoryStateStore

    s = store("memory", tmp_path, snapshot_interval=2)
    assert isinstance(s, MemoryStateStore)
    release = threading.Event()
    started = threading.Event()
    write = s._write_snapshot

    def slow(version: int) -> None:
        started.set()
        release.wait(30)
        write(version)

    s._write_snapshot = slow  # type: ignore[method-assign]
    s.load(-1)
    for v in range(6):
        s.put(keys([f"u{v}"], [v]), vals([v], [0.0], ["x"]))
        s.commit(v)
        s.load(v)  # would block here (v >= 1) if the batch waited for the snapshot
    assert started.is_set() and not (tmp_path / "snapshot" / "1").exists()
    release.set()
    s.close()  # waits for it
    assert (tmp_path / "snapshot" / "1").exists()


def test_packed_keys_are_injective_with_nulls() -> None:
    from headrace.state.columns import packed_keys

    t = pa.table({"a": pa.array([1, None, 0, 0, None, 256], pa.int64()),
                  "b": pa.array([True, False, None, False, None, None]),
                  "t": pa.array([0, 0, 0, 0, 0, 1], pa.int64()).cast(pa.timestamp("us"))})  # fmt: skip
    ks = packed_keys(t)
    assert len(set(ks)) == len(ks) == 6
    assert packed_keys(t.slice(2, 1)) == ks[2:3]  # the same key packs the same in any batch


@pytest.mark.parametrize("backend_name", BACKENDS)
def test_fixed_width_values_round_trip(backend_name: str, tmp_path: Path) -> None:
    """Numbers, timestamps and booleans (the RocksDB backend packs them with numpy) with
    nulls, through put, get, evict and a restore."""
    vs = pa.schema([("i", pa.int32()), ("f", pa.float32()), ("d", pa.float64()), ("b", pa.bool_()),
                    ("t", pa.timestamp("ms", tz="UTC")), ("n", pa.int64())])  # fmt: skip
    ks = pa.schema([("k", pa.int64())])
    values = pa.table({"i": pa.array([1, None, -3], pa.int32()), "f": pa.array([1.5, None, -2.25], pa.float32()),
                       "d": [0.1, 2.0, None], "b": [True, None, False],
                       "t": pa.array([1_700_000_000_000, None, 0], pa.int64()).cast(pa.timestamp("ms", tz="UTC")),
                       "n": [None, 2**62, -(2**62)]}, schema=vs)  # fmt: skip
    k = pa.table({"k": [10, 20, 30]}, schema=ks)
    s = open_state_store(backend_name, str(tmp_path), ks, vs)
    s.load(-1)
    s.put(k, values, order=[5, None, 7])
    got, found = s.get(pa.table({"k": [30, 99, 10]}, schema=ks))
    assert found.tolist() == [True, False, True]
    assert got.to_pylist() == [values.slice(2, 1).to_pylist()[0], dict.fromkeys(vs.names), values.slice(0, 1).to_pylist()[0]]
    s.commit(0)
    s.close()
    s2 = open_state_store(backend_name, str(tmp_path), ks, vs)
    s2.load(0)
    ev = s2.evict(6)
    assert ev.column("k").to_pylist() == [10] and ev.select(vs.names).to_pylist() == values.slice(0, 1).to_pylist()
    assert sorted(s2.scan().column("k").to_pylist()) == [20, 30]
    s2.close()


FIXED_KEYS = pa.schema([("w", pa.timestamp("us", tz="UTC")), ("k", pa.int32()), ("b", pa.bool_())])


def _fixed_keys(rows: list[tuple[int | None, int | None, bool | None]]) -> pa.Table:
    w, k, b = zip(*rows, strict=True)
    return pa.table({"w": pa.array(list(w), pa.int64()).cast(FIXED_KEYS.field("w").type),
                     "k": pa.array(list(k), pa.int32()), "b": pa.array(list(b), pa.bool_())}, schema=FIXED_KEYS)  # fmt: skip


def test_fixed_width_keys_with_nulls_round_trip(backend: str, tmp_path: Path) -> None:
    """Keys of timestamps, ints and booleans (the memory backend's numpy index, the RocksDB
    backend's numpy key encoding), with nulls and negative values, through a restore."""
    rows = [(0, 1, True), (None, 1, True), (0, None, True), (0, 1, None), (-(2**62), -5, False), (None, None, None)]
    vs = pa.schema([("n", pa.int64())])
    s = open_state_store(backend, str(tmp_path), FIXED_KEYS, vs)
    s.load(-1)
    s.put(_fixed_keys(rows), pa.table({"n": list(range(6))}, schema=vs), order=[10, 20, None, 40, -50, 60])
    got, found = s.get(_fixed_keys([rows[3], (7, 7, True), rows[1], rows[5]]))
    assert found.tolist() == [True, False, True, True] and got.column("n").to_pylist() == [3, None, 1, 5]
    s.commit(0)
    s.close()
    s2 = open_state_store(backend, str(tmp_path), FIXED_KEYS, vs)
    s2.load(0)
    ev = s2.evict(20)
    assert sorted(ev.column("n").to_pylist()) == [0, 1, 4]
    assert sorted(zip(ev.column("w").cast(pa.int64()).to_pylist(), ev.column("k").to_pylist(),
                      ev.column("b").to_pylist(), ev.column("__order").to_pylist(), strict=True), key=str) == sorted(
        [(0, 1, True, 10), (None, 1, True, 20), (-(2**62), -5, False, -50)], key=str)  # fmt: skip
    left = s2.scan()
    assert sorted(left.column("n").to_pylist()) == [2, 3, 5]
    assert sorted(left.column("__order").to_pylist(), key=str) == sorted([None, 40, 60], key=str)
    s2.close()


@pytest.mark.parametrize("recorded", [None, "pickle"], ids=["no-rocksdbKeys", "rocksdbKeys-pickle"])
def test_rocksdb_state_written_with_pickle_is_refused(tmp_path: Path, recorded: str | None) -> None:
    """A state folder of the earlier pickle encodings (metadata without ``rocksdbRows``, with
    ``rocksdbKeys`` absent or ``pickle``) is refused, naming the metadata file and the fix; its
    database is never opened, let alone unpickled."""
    import json

    vs = pa.schema([("n", pa.int64())])
    s = open_state_store("rocksdb", str(tmp_path), FIXED_KEYS, vs)
    s.load(-1)
    s.commit(0)
    s.close()
    meta = json.loads((tmp_path / "metadata").read_text())
    del meta["rocksdbRows"]
    if recorded is None:
        del meta["rocksdbKeys"]
    else:
        meta["rocksdbKeys"] = recorded
    (tmp_path / "metadata").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match=r"metadata.*pickle.*new checkpointLocation") as e:
        open_state_store("rocksdb", str(tmp_path), FIXED_KEYS, vs)
    assert str(tmp_path / "metadata") in str(e.value)


def test_snapshots_amortise_to_the_rows_changed(backend: str, tmp_path: Path) -> None:
    """Memory: a snapshot (a rewrite of the whole state) once the rows changed since the last
    reach half the state, and at least ``snapshot_interval`` changelogs; RocksDB (a checkpoint
    costs a flush of what changed): every ``snapshot_interval`` changelogs."""
    s = store(backend, tmp_path, snapshot_interval=10, retain=1000)
    s.load(-1)
    users = [f"u{i}" for i in range(1000)]
    s.put(keys(users, [0] * 1000), vals([0] * 1000, [0.0] * 1000, ["x"] * 1000))
    for v in range(70):
        if v:
            k = keys(users[(v * 10) % 1000 : (v * 10) % 1000 + 10], [0] * 10)
            s.put(k, vals([v] * 10, [0.0] * 10, ["x"] * 10))
        s.commit(v)
        s.settle()
        s.load(v)
    s.close()
    snaps = sorted(int(n.split(".")[0]) for n in os.listdir(tmp_path / "snapshot"))
    # memory: 1,090 rows changed by version 9 (>= 500); then 500 more rows take 50 versions
    assert snaps == ([9, 59] if backend == "memory" else [9, 19, 29, 39, 49, 59, 69])
    s2 = store(backend, tmp_path, snapshot_interval=10, retain=1000)
    s2.load(69)
    assert len(s2) == 1000 and as_dict(s2.scan())[("u0", 0)][0] == 0 and as_dict(s2.scan())[("u690", 0)][0] == 69
    if backend == "memory":  # one snapshot and the changelogs after it
        assert s2.work.restore_rows == 1000 + 10 * 10
    s2.close()


_KILLED_WRITER = """
import os, signal, sys
import pyarrow as pa
from headrace.state import open_state_store
ks = pa.schema([("k", pa.int64())]); vs = pa.schema([("n", pa.int64())])
s = open_state_store("rocksdb", sys.argv[1], ks, vs, snapshot_interval=int(sys.argv[2]))
s.load(-1)
for v in range(7):
    s.put(pa.table({"k": [v, 100]}, schema=ks), pa.table({"n": [v, v]}, schema=vs), order=[v, None])
    s.commit(v)
    s.load(v)
s.put(pa.table({"k": [555]}, schema=ks), pa.table({"n": [5]}, schema=vs))  # batch 7, never committed
os.kill(os.getpid(), signal.SIGKILL)
"""


def _reopened_after_kill(tmp_path: Path, script: str, interval: int, version: int) -> tuple[Any, dict[int, int]]:
    """Run ``script`` (it writes a RocksDB store under ``tmp_path`` and SIGKILLs itself), then
    reopen the store at ``version``: the store and its rows as ``{k: n}``."""
    import signal
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-c", script, str(tmp_path), str(interval)], capture_output=True)
    assert p.returncode == -signal.SIGKILL, p.stderr.decode()
    ks = pa.schema([("k", pa.int64())])
    vs = pa.schema([("n", pa.int64())])
    s = open_state_store("rocksdb", str(tmp_path), ks, vs, snapshot_interval=interval)
    s.load(version)
    rows = dict(zip(s.scan().column("k").to_pylist(), s.scan().column("n").to_pylist(), strict=True))
    return s, rows


@pytest.mark.parametrize("interval", [3, 1000], ids=["with-checkpoints", "no-flush-ever"])
def test_rocksdb_without_its_wal_recovers_after_sigkill(tmp_path: Path, interval: int) -> None:
    """RocksDB runs without its write-ahead log: a process killed mid-batch loses the memtable,
    and the store reopens as of the last flush (or nothing) and replays the changelogs."""
    s, rows = _reopened_after_kill(tmp_path, _KILLED_WRITER, interval, 6)
    assert rows == {**{v: v for v in range(7)}, 100: 6} and len(s) == 8
    assert sorted(s.evict(3).column("k").to_pylist()) == [0, 1, 2, 3]
    s.close()


def test_evict_after_orders_change_back_and_forth_and_slots_are_reused(backend: str, tmp_path: Path) -> None:
    """Orders that move and come back, rows removed and their slots reused with the same
    order: eviction returns each live row once, by its current order (the memory backend's
    event-time index keeps stale entries and rebuilds itself once they outnumber live ones)."""
    rng = random.Random(11)
    s = store(backend, tmp_path)
    s.load(-1)
    model: dict[str, int] = {}
    users = [f"k{i}" for i in range(150)]
    for v in range(80):
        batch = rng.sample(users, 100)
        ords = [rng.choice([1, 2, 3, 50 + v]) for _ in batch]
        s.put(keys(batch, [0] * 100), vals([v] * 100, [0.0] * 100, ["x"] * 100), order=ords)
        model.update(zip(batch, ords, strict=True))
        gone = rng.sample(sorted(model), 20)
        assert s.remove(keys(gone, [0] * 20)) == 20
        for u in gone:
            del model[u]
        s.commit(v)
        s.load(v)
    upto = 3 + 40
    ev = s.evict(upto)
    got = sorted(zip(ev.column("user").to_pylist(), ev.column("__order").to_pylist(), strict=True))
    assert got == sorted((u, o) for u, o in model.items() if o <= upto)
    assert {k[0] for k in as_dict(s.scan())} == {u for u, o in model.items() if o > upto}
    s.close()


def test_a_small_numeric_state_is_snapshotted_from_a_copy_and_restores_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import headrace.state.memory as memory

    def no_consolidation(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a small numeric state is snapshotted from a copy, not by consolidating files")

    monkeypatch.setattr(memory, "consolidate", no_consolidation)
    ks = pa.schema([("k", pa.int64()), ("w", pa.timestamp("us", tz="UTC"))])
    vs = pa.schema([("n", pa.int64()), ("t", pa.float64()), ("b", pa.bool_())])
    s = open_state_store("memory", str(tmp_path), ks, vs, snapshot_interval=3)
    s.load(-1)
    rng = __import__("numpy").random.default_rng(3)
    for v in range(14):
        k = sorted({int(x) for x in rng.integers(0, 60, 25)})
        w = [1_000_000 * (v // 4)] * len(k)
        n = [None if x % 7 == 0 else x * v for x in k]
        t = [x / 3 for x in k]
        b = [None if x % 5 == 0 else bool(x % 2) for x in k]
        key_t = pa.table({"k": k, "w": pa.array(w, pa.int64()).cast(pa.timestamp("us", tz="UTC"))}, schema=ks)
        s.get(key_t)
        s.put(key_t, pa.table({"n": pa.array(n, pa.int64()), "t": t, "b": b}, schema=vs), pa.array(w, pa.int64()))
        s.remove(key_t.slice(0, 2))
        if v % 4 == 3:
            s.evict(1_000_000 * (v // 4 - 1))
        s.commit(v, wait=v % 2 == 0)
        s.load(v)
    s.settle()
    live = rows_of(s.scan())
    s.close()
    snaps = [n for n in os.listdir(tmp_path / "snapshot") if n.isdigit()]
    assert snaps, "no snapshot was written"
    s2 = open_state_store("memory", str(tmp_path), ks, vs, snapshot_interval=3)
    s2.load(13)
    assert rows_of(s2.scan()) == live
    assert s2.work.restore_rows < s.work.changelog_rows  # read a snapshot, not every changelog
    s2.close()


def rows_of(t: pa.Table) -> dict[tuple[Any, ...], tuple[Any, ...]]:
    d = t.to_pydict()
    return {(k, w): (n, x, b, o) for k, w, n, x, b, o in zip(d["k"], d["w"], d["n"], d["t"], d["b"], d["__order"], strict=True)}


NUMERIC = pa.schema([("n", pa.int64()), ("total", pa.float64())])


def numeric_store(backend: str, path: Path) -> StateStore:
    return open_state_store(backend, str(path), KEYS, NUMERIC, description="test")


def test_add_in_place_matches_put_and_survives_restore(backend: str, tmp_path: Path) -> None:
    """``add``: where the backend adds in place (memory: every key present, int64/float64
    values without nulls), the rows, the returned sums, the changelog and a restore are those
    of get + add + put; otherwise it does nothing and says so (None)."""
    s = numeric_store(backend, tmp_path)
    s.load(-1)
    k = keys(["a", "b", "c"], [60, 60, 60])
    s.put(k, pa.table({"n": [1, 2, 3], "total": [0.5, 1.5, 2.5]}, schema=NUMERIC), np.array([60, 60, 60]))
    s.commit(0)
    s.load(0)
    got = s.add(k, pa.table({"n": [10, 20, 30], "total": [1.0, 1.0, 1.0]}, schema=NUMERIC), np.array([60, 60, 60]))
    if backend == "rocksdb":
        assert got is None  # the caller gets, merges and puts
        s.close()
        return
    assert got is not None and got.to_pydict() == {"n": [11, 22, 33], "total": [1.5, 2.5, 3.5]}
    # a key without a row takes the values as its row, next to one added to
    mixed = s.add(keys(["z", "a"], [120, 60]), pa.table({"n": [5, 1], "total": [0.25, 1.0]}, schema=NUMERIC),
                  np.array([120, 60]))  # fmt: skip
    assert mixed is not None and mixed.to_pydict() == {"n": [5, 12], "total": [0.25, 2.5]}
    # a null on either side: not done here (the caller gets, merges and puts)
    assert s.add(keys(["a"], [60]), pa.table({"n": [None], "total": [1.0]}, schema=NUMERIC)) is None
    s.commit(1)
    assert s.get(k)[0].to_pydict() == {"n": [12, 22, 33], "total": [2.5, 2.5, 3.5]}
    s.close()
    again = numeric_store(backend, tmp_path)
    again.load(1)
    assert again.get(k)[0].to_pydict() == {"n": [12, 22, 33], "total": [2.5, 2.5, 3.5]}
    assert again.get(keys(["z"], [120]))[0].to_pydict() == {"n": [5], "total": [0.25]}
    assert sorted(r["__order"] for r in again.scan().to_pylist()) == [60, 60, 60, 120]
    assert again.evict(60).num_rows == 3  # the order kept by add
    again.close()


def test_a_due_snapshot_starts_when_the_next_batch_loads_its_version(backend: str, tmp_path: Path) -> None:
    """The snapshot a commit makes due is started by the next batch's ``load`` of that version
    (or ``settle``), so the last batch of a run leaves none for the stop to wait for."""
    s = store(backend, tmp_path, snapshot_interval=2)
    s.load(-1)
    for v in range(2):
        s.load(v - 1)
        s.put(keys([f"u{v}"], [v]), vals([v], [float(v)], [str(v)]))
        s.commit(v)
    assert s._snapshot_versions() == []  # due at version 1, not started by its commit
    s.load(1)  # the next batch
    s.settle()
    assert s._snapshot_versions() == [1]
    s.close()
    again = store(backend, tmp_path, snapshot_interval=2)
    again.load(1)
    assert {k[0] for k in as_dict(again.scan())} == {"u0", "u1"}
    again.close()


def test_the_same_keys_put_batch_after_batch_match_a_model_across_restarts_and_aborts(
    backend: str, tmp_path: Path
) -> None:
    """Batches that put exactly the keys of the batch before (an open window's; the RocksDB
    store holds such rows back from its database until something else needs them), mixed
    with batches of other keys, orders that move, removals, evictions, aborted batches and
    restarts: every read sees the state of the model."""
    rng = random.Random(5)
    model: dict[str, tuple[int, int]] = {}  # user -> (n, order)
    s = store(backend, tmp_path, snapshot_interval=4)
    s.load(-1)
    users = [f"k{i}" for i in range(30)]
    batch = rng.sample(users, 8)
    for v in range(60):
        if rng.random() < 0.3:
            batch = rng.sample(users, 8)  # other keys (else the same again, as a new table)
        k = keys(batch, [0] * 8)
        old, found = s.get(k)
        assert found.tolist() == [u in model for u in batch]
        assert old.column("n").to_pylist() == [model[u][0] if u in model else None for u in batch]
        ords = [model[u][1] if u in model and rng.random() < 0.8 else v + rng.choice([0, 3]) for u in batch]
        newn = [(model[u][0] if u in model else 0) + 1 for u in batch]
        s.put(k, vals(newn, [0.0] * 8, ["x"] * 8), order=ords)  # type: ignore[arg-type]
        if rng.random() < 0.2:  # a failed batch: its changes are forgotten
            s.abort()
            s.load(v - 1)
            assert {k[0]: r[0] for k, r in as_dict(s.scan()).items()} == {u: m[0] for u, m in model.items()}
            s.put(k, vals(newn, [0.0] * 8, ["x"] * 8), order=ords)  # type: ignore[arg-type]
        model.update({u: (n, o) for u, n, o in zip(batch, newn, ords, strict=True)})
        if rng.random() < 0.15:
            gone = rng.sample(sorted(model), min(3, len(model)))
            assert s.remove(keys(gone, [0] * len(gone))) == len(gone)
            for u in gone:
                del model[u]
        if v % 3 == 2:
            ev = s.evict(v - 4)
            assert sorted(ev.column("user").to_pylist()) == sorted(u for u, m in model.items() if m[1] <= v - 4)
            model = {u: m for u, m in model.items() if m[1] > v - 4}
        s.commit(v)
        assert len(s) == len(model)
        if v % 7 == 6:
            s.close()
            s = store(backend, tmp_path, snapshot_interval=4)
        s.load(v)
        assert s.earliest_order() is None or cast(int, s.earliest_order()) <= min((m[1] for m in model.values()), default=2**62)
    got = as_dict(s.scan())
    assert {k[0]: r[0] for k, r in got.items()} == {u: m[0] for u, m in model.items()}
    assert sorted(r["__order"] for r in s.scan().to_pylist()) == sorted(m[1] for m in model.values())
    s.close()


def test_rocksdb_puts_of_the_same_keys_write_the_database_once(tmp_path: Path) -> None:
    """Batch after batch putting the same keys (an open window's), the RocksDB store writes
    their rows to its database once, when other keys come; each batch's changelog is written."""
    s = store("rocksdb", tmp_path)
    s.load(-1)
    db_entries = lambda: int(s._db.property_int_value("rocksdb.num-entries-active-mem-table"))  # type: ignore[attr-defined]  # noqa: E731
    users = [f"u{i}" for i in range(100)]
    for v in range(5):
        k = keys(users, [0] * 100)
        old, found = s.get(k)
        assert found.tolist() == [v > 0] * 100 and old.column("n").to_pylist() == [v - 1 if v else None] * 100
        s.put(k, vals([v] * 100, [0.0] * 100, ["x"] * 100), order=[60] * 100)
        s.commit(v)
        s.load(v)
    before = db_entries()
    assert before < 100  # (the mstate entries only)
    assert s.get(keys(["other"], [0]))[1].tolist() == [False]  # other keys: the held rows are written
    assert db_entries() - before == 2 * 100 + 1  # rows, their index entries, mstate
    assert len(s.changelog_versions()) == 5
    s.close()
    again = store("rocksdb", tmp_path)
    again.load(4)
    assert again.get(keys(users[:2], [0, 0]))[0].column("n").to_pylist() == [4, 4]
    again.close()


_KILLED_HOLDER = """
import os, signal, sys
import pyarrow as pa
from headrace.state import open_state_store
ks = pa.schema([("k", pa.int64())]); vs = pa.schema([("n", pa.int64())])
s = open_state_store("rocksdb", sys.argv[1], ks, vs, snapshot_interval=int(sys.argv[2]))
s.load(-1)
s.put(pa.table({"k": [7]}, schema=ks), pa.table({"n": [70]}, schema=vs), order=[1])
s.commit(0)
s.load(0)
for v in range(1, 8):  # the same keys every batch: held back from the database
    s.put(pa.table({"k": [1, 2, 3]}, schema=ks), pa.table({"n": [v, 10 * v, 100]}, schema=vs), order=[50, 50 + v, None])
    s.commit(v)
    s.load(v)
s.put(pa.table({"k": [1, 2, 3]}, schema=ks), pa.table({"n": [-1, -1, -1]}, schema=vs))  # batch 8, never committed
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.parametrize("interval", [3, 1000], ids=["with-checkpoints", "no-flush-ever"])
def test_rocksdb_rows_held_back_recover_after_sigkill(tmp_path: Path, interval: int) -> None:
    """A process killed while the RocksDB store holds committed rows back from its database
    (and an uncommitted put of them): the store reopens and restores the committed state."""
    s, rows = _reopened_after_kill(tmp_path, _KILLED_HOLDER, interval, 7)
    assert rows == {7: 70, 1: 7, 2: 70, 3: 100} and len(s) == 4
    assert sorted(s.evict(50).column("k").to_pylist()) == [1, 7]
    assert s.earliest_order() == 57
    s.close()
