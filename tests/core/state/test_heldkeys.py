"""The RocksDB store's held keys (:mod:`headrace.state.heldkeys`): a deduplication's new keys
kept in memory up to a cap, against the memory backend and a model, across evictions, caps
exceeded mid-batch, aborts, restarts and SIGKILL."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from headrace.state import StateStore, open_state_store
from headrace.state.heldkeys import HeldKeys
from headrace.state.rocksdb import RocksDBStateStore

pytest.importorskip("rocksdict")

KEYS = pa.schema([("id", pa.int64()), ("ts", pa.timestamp("us", tz="UTC"))])
NONE = pa.schema([])
Key = tuple[int | None, int]


def key_table(ks: list[Key]) -> pa.Table:
    return pa.table({"id": pa.array([k[0] for k in ks], pa.int64()),
                     "ts": pa.array([k[1] for k in ks], pa.int64()).cast(KEYS.field("ts").type)}, schema=KEYS)  # fmt: skip


def no_values(n: int) -> pa.Table:
    return pa.table({"_": pa.nulls(n)}).drop_columns(["_"])


def as_keys(t: pa.Table) -> set[Key]:
    ts = t.column("ts").cast(pa.int64()).to_pylist()
    return set(zip(t.column("id").to_pylist(), ts, strict=True))


def with_orders(t: pa.Table) -> dict[Key, int | None]:
    ts = t.column("ts").cast(pa.int64()).to_pylist()
    return dict(
        zip(zip(t.column("id").to_pylist(), ts, strict=True), t.column("__order").to_pylist(), strict=True)
    )


def test_held_keys_pop_by_order_and_give_back_their_columns() -> None:
    ks = pa.schema([("id", pa.int32()), ("at", pa.timestamp("ms")), ("flag", pa.bool_())])
    held = HeldKeys(ks)
    t = pa.table({"id": pa.array([1, None, 3, 4], pa.int32()), "at": pa.array([10, 20, None, 40], pa.timestamp("ms")),
                  "flag": [True, False, None, True]}, schema=ks)  # fmt: skip
    held.add(held.prepare(t), pa.array([5, None, 2, 9], pa.int64()))
    assert len(held) == 4 and held.earliest() == 2
    assert held.lookup(held.prepare(t.slice(1, 2))).tolist() == [True, True]
    out = held.pop_upto(5)
    assert out.schema.names == ["id", "at", "flag", "__order"] and out.schema.field(
        "at"
    ).type == pa.timestamp("ms")
    assert out.to_pylist() == [
        {**t.slice(2, 1).to_pylist()[0], "__order": 2},
        {**t.slice(0, 1).to_pylist()[0], "__order": 5},
    ]
    assert held.lookup(held.prepare(t)).tolist() == [False, True, False, True]
    rest = held.all_rows().to_pylist()
    assert sorted(map(str, rest)) == sorted(map(str, [{**t.slice(1, 1).to_pylist()[0], "__order": None},
                                                      {**t.slice(3, 1).to_pylist()[0], "__order": 9}]))  # fmt: skip
    # freed slots are reused by the next keys
    more = pa.table({"id": pa.array([7, 8], pa.int32()), "at": pa.array([1, 2], pa.timestamp("ms")),
                     "flag": [False, False]}, schema=ks)  # fmt: skip
    held.add(held.prepare(more), pa.array([1, 1], pa.int64()))
    assert len(held) == 4 and held.pop_upto(1).num_rows == 2


def open_pair(tmp_path: Path, cap: int, interval: int) -> tuple[StateStore, RocksDBStateStore]:
    mem = open_state_store("memory", str(tmp_path / "mem"), KEYS, NONE, snapshot_interval=interval)
    rdb = RocksDBStateStore(
        str(tmp_path / "rdb"), KEYS, NONE, held_keys_bytes=cap, snapshot_interval=interval
    )
    return mem, rdb


# caps: every put writes its keys at once (mid-batch), the keys are written now and then, never
@pytest.mark.parametrize("cap", [1, 120_000, 64 << 20], ids=["cap-every-put", "cap-sometimes", "cap-never"])
def test_held_keys_match_the_memory_backend_across_evictions_aborts_and_restarts(
    tmp_path: Path, cap: int
) -> None:
    rng = random.Random(cap)
    model: dict[Key, int | None] = {}  # key -> order (None: never evicted)
    mem, rdb = open_pair(tmp_path, cap, interval=4)
    for s in (mem, rdb):
        s.load(-1)
    universe: list[Key] = [(None if i % 97 == 0 else i, i // 3) for i in range(6000)]
    v = 0
    held_most = 0  # the most keys held at a commit
    while v < 45:
        before = dict(model)
        aborted = False
        for chunk in range(rng.choice([1, 2, 3])):
            lo = 90 * v
            cand = rng.sample(universe[max(0, lo - 400) : lo + 300], 120)
            k = key_table(cand)
            found = [s.get(k)[1] for s in (mem, rdb)]
            assert found[0].tolist() == found[1].tolist() == [c in model for c in cand], (v, chunk)
            new = [i for i, c in enumerate(cand) if c not in model]
            nk = k.take(pa.array(new, pa.int64()))
            ords = [
                None if cand[i][0] is None and rng.random() < 0.5 else cand[i][1] + rng.choice([0, 5])
                for i in new
            ]
            for s in (mem, rdb):
                s.put(nk, no_values(len(new)), pa.array(ords, pa.int64()), absent=True)
            model.update((cand[i], o) for i, o in zip(new, ords, strict=True))
            if rng.random() < 0.1:  # keys removed (not a deduplication's: the held keys are written first)
                gone = rng.sample(sorted(model, key=str), min(5, len(model)))
                assert mem.remove(key_table(gone)) == rdb.remove(key_table(gone)) == len(gone)
                for g in gone:
                    del model[g]
            if rng.random() < 0.12:  # a failed batch: its changes are forgotten
                aborted = True
                break
        if aborted:
            for s in (mem, rdb):
                s.abort()
                s.load(v - 1)
            model = before
            assert as_keys(rdb.scan()) == as_keys(mem.scan()) == set(model)
            continue
        upto = 30 * v - 60
        evicted = [with_orders(s.evict(upto)) for s in (mem, rdb)]
        want = {c: o for c, o in model.items() if o is not None and o <= upto}
        assert evicted[0] == evicted[1] == want, v
        model = {c: o for c, o in model.items() if c not in want}
        for s in (mem, rdb):
            s.commit(v, wait=v % 2 == 0)
            assert len(s) == len(model)
        held_most = max(held_most, len(rdb._held_keys) if rdb._held_keys is not None else 0)
        if v % 9 == 8:  # a restart (the held keys of the committed version are written at close)
            for s in (mem, rdb):
                s.close()
            mem, rdb = open_pair(tmp_path, cap, interval=4)
        for s in (mem, rdb):
            s.load(v)
        low = rdb.earliest_order()
        live = [o for o in model.values() if o is not None]
        assert (low is None and not live) or (low is not None and low <= min(live, default=2**62))
        v += 1
    assert with_orders(rdb.scan()) == with_orders(mem.scan()) == model
    assert (held_most == 0) == (cap == 1)  # (a cap of 1 byte: every put's keys are written at once)
    for s in (mem, rdb):
        s.close()
    again = RocksDBStateStore(str(tmp_path / "rdb"), KEYS, NONE, held_keys_bytes=cap, snapshot_interval=4)
    again.load(v - 1)
    assert with_orders(again.scan()) == model
    again.close()


def test_held_keys_cost_the_database_nothing_when_evicted_before_the_cap(tmp_path: Path) -> None:
    """Keys put and evicted while held: no database entry is written (a deduplication's steady
    state), the lookups read nothing from it, and the changelog of every batch is written."""
    s = RocksDBStateStore(str(tmp_path), KEYS, NONE)
    s.load(-1)
    mem_entries = lambda: int(s._db.property_int_value("rocksdb.num-entries-active-mem-table"))  # noqa: E731
    start = mem_entries()
    for v in range(6):
        k = key_table([(1000 * v + i, 1000 * v + i) for i in range(1000)])
        assert not s.get(k)[1].any()
        s.put(k, no_values(1000), pa.array(np.arange(1000 * v, 1000 * v + 1000)), absent=True)
        assert s.evict(1000 * v - 501).num_rows == min(v, 2) * 500
        s.commit(v)
        s.load(v)
    assert mem_entries() == start and s._rows == 0 and len(s) == 1500
    assert s.changelog_versions() == list(range(6))
    s.close()  # the held keys of version 5 written, the database clean at 5
    again = RocksDBStateStore(str(tmp_path), KEYS, NONE)
    again.load(5)
    assert again.work.restore_rows == 0 and len(again) == 1500
    assert again.get(key_table([(5999, 5999), (4499, 4499), (4500, 4500)]))[1].tolist() == [True, False, True]
    again.close()


def test_held_keys_option_is_checked(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="held_keys_bytes"):
        RocksDBStateStore(str(tmp_path), KEYS, NONE, held_keys_bytes=-1)
    s = open_state_store("rocksdb", str(tmp_path), KEYS, NONE, options={"rocksdbHeldKeysMB": 0})
    assert isinstance(s, RocksDBStateStore)
    s.load(-1)
    k = key_table([(1, 1)])
    s.get(k)
    s.put(k, no_values(1), pa.array([1], pa.int64()), absent=True)
    assert s._held_keys is None and s._rows == 1  # 0: nothing is held
    s.close()


_KILLED_DEDUP = """
import os, signal, sys
import numpy as np
import pyarrow as pa
from headrace.state.rocksdb import RocksDBStateStore
ks = pa.schema([("id", pa.int64()), ("ts", pa.timestamp("us", tz="UTC"))]); none = pa.schema([])
s = RocksDBStateStore(sys.argv[1], ks, none, held_keys_bytes=int(sys.argv[3]), snapshot_interval=int(sys.argv[2]))
s.load(-1)
def put(lo, n):
    ids = np.arange(lo, lo + n)
    k = pa.table({"id": ids, "ts": pa.array(ids).cast(ks.field("ts").type)}, schema=ks)
    found = s.get(k)[1]
    assert not found.any(), found.sum()
    s.put(k, pa.table({"x": [None] * n}).drop_columns(["x"]), pa.array(ids), absent=True)
for v in range(9):
    put(300 * v, 300)
    s.evict(300 * v - 150)
    s.commit(v, wait=v % 2 == 0)
    s.load(v)
s.flush()  # (the engine waits for the changelog before it commits the batch)
put(2700, 300)  # batch 9, never committed
s.evict(2700)
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.parametrize("interval", [3, 1000], ids=["with-checkpoints", "no-flush-ever"])
@pytest.mark.parametrize("cap", [1, 64 << 20], ids=["cap-every-put", "cap-never"])
def test_held_keys_recover_after_sigkill(tmp_path: Path, interval: int, cap: int) -> None:
    """A process killed mid-batch while the store holds committed keys (and keys of the batch
    under way): the store reopens at the last committed version with exactly its keys."""
    p = subprocess.run([sys.executable, "-c", _KILLED_DEDUP, str(tmp_path), str(interval), str(cap)],
                       capture_output=True)  # fmt: skip
    assert p.returncode == -signal.SIGKILL, p.stderr.decode()
    s = RocksDBStateStore(str(tmp_path), KEYS, NONE, held_keys_bytes=cap, snapshot_interval=interval)
    s.load(8)
    want = {(i, i): i for i in range(300 * 8 - 150 + 1, 2700)}
    assert with_orders(s.scan()) == want and len(s) == len(want)
    k = key_table([(i, i) for i in range(2400, 3000)])
    assert s.get(k)[1].tolist() == [i in range(2251, 2700) for i in range(2400, 3000)]
    s.close()
