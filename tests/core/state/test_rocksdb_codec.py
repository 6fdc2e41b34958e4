"""The RocksDB state store's encodings: data only (nothing read back can run code), typed keys
and rows of every column type the operators keep, canonical keys, and damaged or foreign
entries refused with ``CheckpointError`` naming the database."""

from __future__ import annotations

import decimal
import json
import pickle
from pathlib import Path
from typing import Any, cast

import pyarrow as pa
import pytest

from headrace.errors import CheckpointError, UnsupportedError
from headrace.state import open_state_store
from headrace.state.rocksdb_codec import TypedKeys, TypedRows

pytest.importorskip("rocksdict")

UTC_US = pa.timestamp("us", tz="UTC")
KEYS = pa.schema([("user", pa.string()), ("price", pa.decimal128(12, 2)), ("tag", pa.binary()), ("x", pa.float64()),
                  ("wend", UTC_US)])  # fmt: skip
VALUES = pa.schema([
    ("n", pa.int64()),
    ("last", pa.large_string()),
    ("sessions", pa.list_(pa.struct([("start", UTC_US), ("end", UTC_US), ("raw", pa.binary()),
                                     ("amount", pa.decimal128(10, 3))]))),
    ("attrs", pa.map_(pa.string(), pa.int32())),
    ("day", pa.date32()),
])  # fmt: skip


def _keys(rows: list[tuple[Any, ...]]) -> pa.Table:
    cols = list(zip(*rows, strict=True))
    arrays = [pa.array(list(c), f.type if f.name != "wend" else pa.int64()) for c, f in zip(cols, KEYS, strict=True)]
    arrays[-1] = arrays[-1].cast(UTC_US)
    return pa.Table.from_arrays(arrays, schema=KEYS)


def _values(n: int, seed: int) -> pa.Table:
    sessions = [[{"start": seed * 10 + i, "end": seed * 10 + i + 5, "raw": bytes([i, 0, 255]),
                  "amount": decimal.Decimal(f"{seed}.{i:03d}")}] if i % 3 else None for i in range(n)]  # fmt: skip
    return pa.table({
        "n": [seed + i if i % 4 else None for i in range(n)],
        "last": pa.array([f"é{seed}-{i}" if i % 5 else None for i in range(n)], pa.large_string()),
        "sessions": pa.array(sessions, VALUES.field("sessions").type),
        "attrs": pa.array([[("a", seed), ("b", i)] if i % 2 else [] for i in range(n)], VALUES.field("attrs").type),
        "day": pa.array([19000 + i for i in range(n)], pa.int32()).cast(pa.date32()),
    }, schema=VALUES)  # fmt: skip


KEY_ROWS = [("ann", decimal.Decimal("1.50"), b"\x00\x01", 0.5, 10), ("", None, b"", -1.0, 20),
            (None, decimal.Decimal("-99.99"), None, None, None), ("bob\x00nul", decimal.Decimal("0"), b"x", 2.0, 30)]  # fmt: skip


@pytest.mark.parametrize("backend", ["memory", "rocksdb"])
def test_typed_keys_and_rows_round_trip_through_a_restore(backend: str, tmp_path: Path) -> None:
    """Strings, decimals, binaries, floats and times as keys; nested lists of structs, maps,
    large strings and dates as values: the same rows come back from the working state and
    from a restore out of the files (RocksDB: a rebuild from its checkpoint)."""
    import shutil

    k = _keys(KEY_ROWS)
    v = _values(len(KEY_ROWS), 7)
    s = open_state_store(backend, str(tmp_path), KEYS, VALUES, snapshot_interval=2)
    s.load(-1)
    s.put(k, v, order=[10, 20, None, 30])
    s.commit(0)
    s.load(0)
    got, found = s.get(k)
    assert found.tolist() == [True] * 4 and got.to_pylist() == v.to_pylist()
    s.put(k.slice(1, 2), _values(2, 8), order=[5, 40])  # a slice: offsets not at zero
    s.commit(1)
    s.close()
    if backend == "rocksdb":
        shutil.rmtree(tmp_path / "rocksdb")  # rebuilt from the changelogs
    s2 = open_state_store(backend, str(tmp_path), KEYS, VALUES, snapshot_interval=2)
    s2.load(1)
    got, found = s2.get(k)
    want = v.to_pylist()
    want[1:3] = _values(2, 8).to_pylist()
    assert found.tolist() == [True] * 4 and got.to_pylist() == want
    evicted = s2.evict(10)
    assert sorted(evicted.column("__order").to_pylist()) == [5, 10]
    assert sorted(evicted.column("user").to_pylist(), key=str) == ["", "ann"]
    s2.close()


def test_typed_keys_are_canonical() -> None:
    """The same key gives the same bytes whatever its table looks like (a slice, chunks, a
    different null layout), and floats that compare equal (``0.0``/``-0.0``, NaNs) are one key."""
    c = TypedKeys(KEYS)
    whole = c.encode(_keys(KEY_ROWS))
    assert len(set(whole)) == len(KEY_ROWS)
    assert c.encode(_keys(KEY_ROWS).slice(2, 2)) == whole[2:]
    chunked = pa.concat_tables([_keys(KEY_ROWS[:1]), _keys(KEY_ROWS[1:])])
    assert c.encode(chunked) == whole
    fl = TypedKeys(pa.schema([("x", pa.float64())]))
    a, b, nan1, nan2 = fl.encode(pa.table({"x": [0.0, -0.0, float("nan"), -float("nan")]}))
    assert a == b and nan1 == nan2 and a != nan1
    decoded = pa.Table.from_arrays(c.decode(whole), schema=KEYS)
    assert decoded.equals(_keys(KEY_ROWS))


def test_nested_keys_are_refused_before_any_io(tmp_path: Path) -> None:
    ks = pa.schema([("tags", pa.list_(pa.string()))])
    with pytest.raises(UnsupportedError, match=r"list<item: string>.*group or deduplicate by"):
        open_state_store("rocksdb", str(tmp_path / "s"), ks, pa.schema([("n", pa.int64())]))
    assert not (tmp_path / "s").exists()


class _WritesAFile:
    """Unpickling this creates ``path``: what a hostile checkpoint would carry."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (str(self.path), "w"))


def _rdict(path: Path) -> Any:
    import rocksdict

    return rocksdict.Rdict(str(path), rocksdict.Options(raw_mode=True))


def _written(tmp_path: Path, **kw: Any) -> None:
    s = open_state_store("rocksdb", str(tmp_path), KEYS, VALUES, **kw)
    s.load(-1)
    s.put(_keys(KEY_ROWS), _values(len(KEY_ROWS), 1), order=[1, 2, 3, 4])
    s.commit(0)
    s.close()


@pytest.mark.parametrize("entry", ["mstate", "row"])
def test_a_pickle_planted_in_the_database_does_not_run(tmp_path: Path, entry: str) -> None:
    """A pickle that would create a file when loaded, planted as the database's ``mstate``
    (what earlier versions pickled) or as a row: refused naming the database, and the file is
    never created."""
    marker = tmp_path / "pwned"
    state = tmp_path / "state"
    _written(state)
    payload = pickle.dumps(_WritesAFile(marker))
    db = _rdict(state / "rocksdb")
    if entry == "mstate":
        db[b"mstate"] = payload
    else:
        rows = [k for k in db.keys() if k[:1] == b"d"]  # noqa: SIM118 - an Rdict, not a dict
        for k in rows:
            db[k] = payload
    db.close()
    s = open_state_store("rocksdb", str(state), KEYS, VALUES)
    with pytest.raises(CheckpointError) as e:
        s.load(0)
        s.get(_keys(KEY_ROWS))
    assert str(state / "rocksdb") in str(e.value)
    assert ("pickle" in str(e.value)) if entry == "mstate" else ("does not decode" in str(e.value))
    s.close()
    assert not marker.exists()


@pytest.mark.parametrize(
    "mstate",
    [b"{not json", b'{"format": 1, "version": "3", "dirty": false, "rows": 1, "query": "", "operator": "", '
                   b'"partition": 0}', b"[1, 2]"],
    ids=["not-json", "version-a-string", "not-an-object"],
)  # fmt: skip
def test_a_damaged_mstate_entry_is_refused(tmp_path: Path, mstate: bytes) -> None:
    _written(tmp_path)
    db = _rdict(tmp_path / "rocksdb")
    db[b"mstate"] = mstate
    db.close()
    s = open_state_store("rocksdb", str(tmp_path), KEYS, VALUES)
    with pytest.raises(CheckpointError, match=r"state database .*rocksdb is damaged .*mstate"):
        s.load(0)
    s.close()


def test_rows_of_the_wrong_shape_are_refused() -> None:
    from headrace.state.rocksdb_codec import Damaged

    rows = TypedRows(VALUES)
    good = rows.encode(_values(2, 3), pa.array([1, 2], pa.int64()))
    for bad in (good[0][:-1], good[0] + b"\x00", b"\x80\x05junk", b""):
        with pytest.raises(Damaged):
            rows.decode([bad])
    json.dumps(rows.decode(cast(list[bytes | None], good))[0].tolist())  # (the good ones decode)
