"""SCD type 2 with trackHistoryColumnList / trackHistoryExceptColumnList (Databricks' TRACK
HISTORY ON): a change to untracked columns updates the current version in place, a change to a
tracked column closes it and opens a new one. Checked against an independent reference."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from headrace.plugins import registry
from headrace.protocols import SinkContext

BASE = {"keys": "id", "sequenceBy": "seq", "applyAsDeletes": "op = 'D'", "exceptColumnList": "op,seq",
        "storedAsScdType": "2"}  # fmt: skip
SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("city", pa.string()), ("seq", pa.int64()), ("op", pa.string())])


def sink(options: dict[str, Any], tmp_path: Path, schema: pa.Schema | None = None) -> Any:
    spec = registry().get("delta")
    opts = spec.sink_options.parse(options, connector="delta", role="sink")
    (tmp_path / "state").mkdir(exist_ok=True)
    return spec.load_sink()(opts, SinkContext(query_id="q1", state_path=str(tmp_path / "state"), schema=schema))


def events(rows: list[tuple[int, str | None, str | None, int, str]]) -> pa.Table:
    return pa.Table.from_pylist([dict(zip(SCHEMA.names, r, strict=True)) for r in rows], schema=SCHEMA)


def apply(s: Any, batch_id: int, table: pa.Table) -> None:
    s.commit(batch_id, [s.write(batch_id, iter(table.to_batches(max_chunksize=3)))])


def history(path: Path) -> list[tuple[Any, ...]]:
    t = DeltaTable(str(path)).to_pyarrow_table()
    return sorted((r["id"], r["name"], r["city"], r["__START_AT"], r["__END_AT"]) for r in t.to_pylist())


def reference(evs: list[tuple[int, str | None, str | None, int, str]], tracked: set[str]) -> list[tuple[Any, ...]]:
    """SCD type 2 with history on ``tracked`` only, computed event by event in sequence order
    (of a key's events with one sequence value the last non-delete counts, else the delete):
    the expected table, independent of batching."""
    last: dict[tuple[int, int], tuple[int, str | None, str | None, int, str]] = {}
    for e in evs:
        if e[4] != "D" or last.get((e[0], e[3]), e)[4] == "D":
            last[(e[0], e[3])] = e
    done: list[tuple[Any, ...]] = []
    open_: dict[int, dict[str, Any]] = {}
    for id_, name, city, seq, op in sorted(last.values(), key=lambda e: e[3]):
        cur = open_.get(id_)
        if op == "D":
            if cur is not None:
                done.append((id_, cur["name"], cur["city"], cur["start"], seq))
                del open_[id_]
            continue
        new = {"name": name, "city": city}
        if cur is not None and all(cur[c] == new[c] for c in tracked):
            cur.update(new)  # in place: the version's start stays
            continue
        if cur is not None:
            done.append((id_, cur["name"], cur["city"], cur["start"], seq))
        open_[id_] = {**new, "start": seq}
    done += [(i, c["name"], c["city"], c["start"], None) for i, c in open_.items()]
    return sorted(done)


def test_untracked_change_updates_in_place(tmp_path: Path) -> None:
    out = tmp_path / "t"
    s = sink({"path": str(out), **BASE, "trackHistoryExceptColumnList": "city"}, tmp_path)
    apply(s, 0, events([(1, "Isabel", "Monterrey", 1, "I"), (2, "Raul", "Oaxaca", 2, "I")]))
    # id 1: city only (in place), then name (new version), then city again (in place on the new one)
    apply(s, 1, events([(1, "Isabel", "Tijuana", 3, "U"), (1, "Chiquita", "Tijuana", 5, "U"),
                        (1, "Chiquita", "Mexicali", 6, "U"), (2, None, None, 7, "D")]))  # fmt: skip
    assert history(out) == [(1, "Chiquita", "Mexicali", 5, None), (1, "Isabel", "Tijuana", 1, 5),
                            (2, "Raul", "Oaxaca", 2, 7)]  # fmt: skip
    # a later batch: city-only change on the current row in the table, then a re-insert of id 2
    apply(s, 2, events([(1, "Chiquita", "Puebla", 8, "U"), (2, "Raul", "Leon", 9, "I")]))
    assert history(out) == [(1, "Chiquita", "Puebla", 5, None), (1, "Isabel", "Tijuana", 1, 5),
                            (2, "Raul", "Leon", 9, None), (2, "Raul", "Oaxaca", 2, 7)]  # fmt: skip
    version = DeltaTable(str(out)).version()
    apply(sink({"path": str(out), **BASE, "trackHistoryExceptColumnList": "city"}, tmp_path), 2,
          events([(1, "Chiquita", "Puebla", 8, "U"), (2, "Raul", "Leon", 9, "I")]))  # a replay after a restart
    assert DeltaTable(str(out)).version() == version
    # older than the current version (start 5): ignored
    apply(s, 3, events([(1, "Old", "Old", 4, "U")]))
    assert [r for r in history(out) if r[0] == 1 and r[4] is None] == [(1, "Chiquita", "Puebla", 5, None)]


def test_track_history_column_list(tmp_path: Path) -> None:
    out = tmp_path / "t"
    s = sink({"path": str(out), **BASE, "trackHistoryColumnList": "name"}, tmp_path)
    apply(s, 0, events([(1, "a", "x", 1, "I"), (1, "a", "y", 2, "U"), (1, "b", "y", 3, "U")]))
    assert history(out) == [(1, "a", "y", 1, 3), (1, "b", "y", 3, None)]


@pytest.mark.parametrize("option", ["trackHistoryColumnList", "trackHistoryExceptColumnList"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_matches_the_reference_whatever_the_batching(tmp_path: Path, option: str, seed: int) -> None:
    rng = random.Random(seed)
    evs: list[tuple[int, str | None, str | None, int, str]] = []
    state: dict[int, tuple[str, str]] = {}
    for seq in range(1, 400):
        id_ = rng.randrange(12)
        if id_ in state and rng.random() < 0.12:
            evs.append((id_, None, None, seq, "D"))
            del state[id_]
            continue
        name, city = state.get(id_, ("n0", "c0"))
        if rng.random() < 0.35:
            name = f"n{rng.randrange(3)}"
        else:
            city = f"c{rng.randrange(3)}"
        state[id_] = (name, city)
        evs.append((id_, name, city, seq, "U"))
    out = tmp_path / "t"
    s = sink({"path": str(out), **BASE, option: "name"}, tmp_path)
    pos, batch = 0, 0
    while pos < len(evs):  # batches of consecutive sequences, shuffled inside
        n = rng.randrange(1, 60)
        chunk = evs[pos:pos + n]
        rng.shuffle(chunk)
        apply(s, batch, events(chunk))
        pos, batch = pos + n, batch + 1
    tracked = {"name"} if option == "trackHistoryColumnList" else {"city"}
    expected = reference(evs, tracked)
    assert history(out) == expected
    assert len(expected) < sum(e[4] == "U" for e in evs)  # some changes were in place


def test_options_are_checked_before_any_io(tmp_path: Path) -> None:
    spec = registry().get("delta")
    out = tmp_path / "t"
    with pytest.raises(Exception, match="cannot be used together"):
        spec.sink_options.parse({"path": str(out), **BASE, "trackHistoryColumnList": "name",
                                 "trackHistoryExceptColumnList": "city"}, connector="delta", role="sink")  # fmt: skip
    with pytest.raises(Exception, match="storedAsScdType=2"):
        spec.sink_options.parse({"path": str(out), **BASE, "storedAsScdType": "1", "trackHistoryColumnList": "name"},
                                connector="delta", role="sink")  # fmt: skip
    with pytest.raises(Exception, match=r"'nope', not a column of the target table \(its columns: id, name, city\)"):
        sink({"path": str(out), **BASE, "trackHistoryColumnList": "name,nope"}, tmp_path, schema=SCHEMA)
    s = sink({"path": str(out), **BASE, "trackHistoryExceptColumnList": "op"}, tmp_path)  # op is not written
    with pytest.raises(Exception, match=r"trackHistoryExceptColumnList names 'op', not a column of the target table"):
        apply(s, 0, events([(1, "a", "x", 1, "I")]))
    assert not out.exists() and not list((tmp_path / "state").rglob("*.arrow"))
