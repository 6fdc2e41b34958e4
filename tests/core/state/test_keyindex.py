"""The memory backend's key indexes against a dict model: lookups, inserts into tombstones,
growth and rehashing, nulls in keys."""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pytest

from headrace.state.keyindex import DictIndex, FixedKeyIndex, KeyIndex, fixed_width_keys, key_index

SCHEMA = pa.schema([("w", pa.timestamp("us", tz="UTC")), ("k", pa.int32()), ("b", pa.bool_())])


def table(rows: list[tuple[int | None, int | None, bool | None]]) -> pa.Table:
    w, k, b = zip(*rows, strict=True) if rows else ((), (), ())
    return pa.table({"w": pa.array(list(w), pa.int64()).cast(SCHEMA.field("w").type),
                     "k": pa.array(list(k), pa.int32()), "b": pa.array(list(b), pa.bool_())}, schema=SCHEMA)  # fmt: skip


def test_fixed_width_keys_choose_the_numpy_index() -> None:
    assert fixed_width_keys(SCHEMA) and isinstance(key_index(SCHEMA), FixedKeyIndex)
    assert isinstance(key_index(pa.schema([("s", pa.string()), ("k", pa.int64())])), DictIndex)
    assert isinstance(key_index(pa.schema([("f", pa.float64())])), DictIndex)


@pytest.mark.parametrize("make", [lambda: FixedKeyIndex(3), DictIndex], ids=["fixed", "dict"])
def test_index_matches_a_dict_model(make: type) -> None:
    rng = random.Random(3)
    index: KeyIndex = make()
    model: dict[tuple[int | None, int | None, bool | None], int] = {}
    free: list[int] = []
    nxt = 0

    def key() -> tuple[int | None, int | None, bool | None]:
        return (rng.choice([None, 0, 1, -(2**62), rng.randrange(200)]), rng.choice([None, 0, rng.randrange(50)]),
                rng.choice([None, True, False]))  # fmt: skip

    for _ in range(60):
        batch = list(dict.fromkeys(key() for _ in range(rng.randrange(1, 400))))
        prepared = index.prepare(table(batch))
        slots = index.lookup(prepared)
        assert slots.tolist() == [model.get(k, -1) for k in batch]
        new = np.flatnonzero(slots < 0)
        assigned = []
        for _i in new:
            if free:
                assigned.append(free.pop())
            else:
                assigned.append(nxt)
                nxt += 1
        index.insert(prepared, new, np.asarray(assigned, np.int64))
        for i, s in zip(new.tolist(), assigned, strict=True):
            model[batch[i]] = s
        gone = rng.sample(sorted(model, key=str), k=min(len(model), rng.randrange(0, 300)))
        if gone:
            drop = np.asarray([model.pop(k) for k in gone], np.int64)
            index.remove(drop)
            free.extend(drop.tolist())
        assert len(index) == len(model)
        assert sorted(index.live_slots().tolist()) == sorted(model.values())
    everything = list(model) + [key() for _ in range(200)]
    assert index.lookup(index.prepare(table(everything))).tolist() == [model.get(k, -1) for k in everything]


def test_fixed_index_grows_and_stays_half_empty() -> None:
    index = FixedKeyIndex(1)
    n = 100_000
    keys = pa.table({"k": np.arange(n, dtype=np.int64) * 7919})
    prepared = index.prepare(keys)
    index.insert(prepared, np.arange(n), np.arange(n, dtype=np.int64))
    assert len(index) == n and len(index._table) >= 2 * n
    assert index.lookup(prepared).tolist() == list(range(n))
    index.remove(np.arange(0, n, 2, dtype=np.int64))
    got = index.lookup(prepared)
    assert (got[0::2] == -1).all() and (got[1::2] == np.arange(1, n, 2)).all()


def test_fixed_index_answers_a_repeated_batch_of_keys_from_its_memo_and_stays_exact() -> None:
    """A batch with the same keys as the one before (an open window's keys) is answered from
    the memo of the last lookup; inserts, removals and other batches keep every answer exact."""
    index = FixedKeyIndex(2)
    model: dict[tuple[int, int], int] = {}
    nxt = 0
    rng = np.random.default_rng(7)

    def run(keys: list[tuple[int, int]], *, insert: bool = True) -> None:
        nonlocal nxt
        t = pa.table({"a": [k[0] for k in keys], "b": [k[1] for k in keys]}, schema=pa.schema([("a", pa.int64()), ("b", pa.int64())]))
        prepared = index.prepare(t)
        slots = index.lookup(prepared)
        assert slots.tolist() == [model.get(k, -1) for k in keys]
        if insert:
            new = np.flatnonzero(slots < 0)
            assigned = np.arange(nxt, nxt + len(new), dtype=np.int64)
            nxt += len(new)
            index.insert(prepared, new, assigned)
            model.update({keys[i]: int(s) for i, s in zip(new.tolist(), assigned.tolist(), strict=True)})

    window = [(w, k) for w in (1,) for k in range(500)]
    run(window)  # all new
    run(window)  # the memo: all found
    run(window[:250] + [(2, k) for k in range(250)], insert=False)  # other keys: looked up, not inserted
    run(window[:250] + [(2, k) for k in range(250)])  # the same keys again, inserted by a new batch object
    run(window[:250] + [(2, k) for k in range(250)])  # the memo after that insert
    gone = [window[i] for i in rng.choice(500, 100, replace=False).tolist()]
    index.remove(np.asarray([model.pop(k) for k in gone], np.int64))
    run(window, insert=False)  # after a removal: the memo is not used
    run(window)
    run(window)
    assert len(index) == len(model)
