"""delta -> delta survives SIGKILL at every engine crash point and at random times, exactly once."""

from __future__ import annotations

import os
import random
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, WriterProperties, write_deltalake

from headrace.testing import CRASH_POINTS, run_pipeline, run_until_done

ROWS_PER_COMMIT = 40
COMMITS = 8


def _source(path: str) -> None:
    props = WriterProperties(max_row_group_size=10)  # several record batches per file (mid_write)
    for c in range(COMMITS):
        lo = c * ROWS_PER_COMMIT
        write_deltalake(path, pa.table({"v": pa.array(range(lo, lo + ROWS_PER_COMMIT), pa.int64()),
                                        "p": [str(c % 2)] * ROWS_PER_COMMIT}),
                        mode="append", partition_by=["p"], writer_properties=props)  # fmt: skip


@pytest.mark.slow
def test_delta_to_delta_exactly_once_across_kills(tmp_path: Path) -> None:
    src, out = str(tmp_path / "src"), str(tmp_path / "out")
    _source(src)
    spec = {
        "source": {"format": "delta", "options": {"path": src, "maxFilesPerTrigger": 1}},
        "sink": {"format": "delta", "options": {"path": out, "partitionBy": "p"}},
        "checkpoint": str(tmp_path / "out" / "_checkpoints" / "q"),
        "name": "kill",
        "trigger": {"available_now": True},
    }
    # each run resumes from the checkpoint and dies at the next crash point, one batch further on
    crashes = ["before_offsets:0", *(f"{p}:{i + 1}" for i, p in enumerate(CRASH_POINTS))]
    results = run_until_done(spec, crashes=crashes, random_kills=1, kill_window=(0.5, 1.5), seed=7)
    killed = sum(r.killed for r in results[: len(crashes)])
    assert killed == len(crashes), [r.stderr[-500:] for r in results if not r.killed]
    got = DeltaTable(out).to_pyarrow_table().column("v").to_pylist()
    dup = [v for v, n in Counter(got).items() if n > 1]
    assert not dup, f"duplicated rows: {dup[:10]}"
    assert sorted(got) == list(range(ROWS_PER_COMMIT * COMMITS))
    # appends after the kills flow on with the same checkpoint
    write_deltalake(src, pa.table({"v": pa.array([10_000], pa.int64()), "p": ["0"]}), mode="append")
    run_pipeline(spec).check()
    assert sorted(DeltaTable(out).to_pyarrow_table().column("v").to_pylist())[-1] == 10_000


def _cdc_source(path: str, rng: random.Random) -> None:
    """A Delta table with its change feed: inserts, updates of one column, deletes, re-inserts;
    each commit changes a key at most once (distinct _commit_version per key event)."""
    write_deltalake(path, pa.table({"id": pa.array(range(10), pa.int64()), "name": [f"n{i}" for i in range(10)],
                                    "city": ["c0"] * 10}), configuration={"delta.enableChangeDataFeed": "true"})  # fmt: skip
    alive, gone = set(range(10)), set()
    for _ in range(14):
        dt, x = DeltaTable(path), rng.choice(sorted(alive))
        r = rng.random()
        if r < 0.45:
            dt.update({"city": f"'c{rng.randrange(4)}'"}, predicate=f"id = {x}")
        elif r < 0.75:
            dt.update({"name": f"'m{rng.randrange(4)}'"}, predicate=f"id = {x}")
        elif r < 0.9 and len(alive) > 3:
            dt.delete(f"id = {x}")
            alive.discard(x)
            gone.add(x)
        else:
            back = sorted(gone)[:1] or [100 + len(alive)]
            write_deltalake(path, pa.table({"id": pa.array(back, pa.int64()), "name": ["back"], "city": ["c9"]}),
                            mode="append")  # fmt: skip
            alive.update(back)
            gone.difference_update(back)


@pytest.mark.slow
def test_delta_cdc_scd2_track_history_exactly_once_across_kills(tmp_path: Path) -> None:
    from tests.plugins.delta.test_scd2_track_history import reference

    src, out = str(tmp_path / "src"), str(tmp_path / "out")
    _cdc_source(src, random.Random(5))
    spec = {
        "source": {"format": "delta", "options": {"path": src, "readChangeFeed": True, "maxFilesPerTrigger": 1, "startingVersion": 0}},
        "sink": {"format": "delta", "options": {
            "path": out, "keys": "id", "sequenceBy": "_commit_version", "applyAsDeletes": "_change_type = 'delete'",
            "exceptColumnList": "_change_type,_commit_version,_commit_timestamp", "storedAsScdType": "2",
            "trackHistoryExceptColumnList": "city"}},
        "checkpoint": str(tmp_path / "chk"),
        "trigger": {"available_now": True},
    }  # fmt: skip
    # each run dies at the next batch's crash point (mid_write last: a one-record-batch write has no middle)
    for point in [*(p for p in CRASH_POINTS if p != "mid_write"), "mid_write"]:
        commits = tmp_path / "chk" / "commits"  # offsets are planned ahead: the next batch is the next uncommitted
        batch = max((int(n) for n in os.listdir(commits) if n.isdigit()), default=-1) + 1 if commits.is_dir() else 0
        r = run_pipeline(spec, crash=f"{point}:{batch}")
        assert r.killed or point == "mid_write", f"{point}:{batch} {r.stderr[-500:]}"
    run_pipeline(spec, kill_after=1.0)
    run_pipeline(spec).check()
    feed = pa.table(DeltaTable(src).load_cdf(starting_version=0).read_all()).to_pylist()
    evs = [(r["id"], r["name"], r["city"], r["_commit_version"], "D" if r["_change_type"] == "delete" else "U")
           for r in feed if r["_change_type"] != "update_preimage"]  # fmt: skip
    got = sorted((r["id"], r["name"], r["city"], r["__START_AT"], r["__END_AT"])
                 for r in DeltaTable(out).to_pyarrow_table().to_pylist())  # fmt: skip
    assert got == reference(evs, {"name"})
    assert len(got) < sum(e[4] == "U" for e in evs)  # city-only changes made no versions


@pytest.mark.slow
def test_delta_cdc_scd1_tombstones_exactly_once_across_kills(tmp_path: Path) -> None:
    """Events out of order across batches (older inserts after deletes) into SCD type 1: SIGKILL
    at every crash point; the table is each key's latest event, computed from all events at once
    (the stored sequence guards live rows, the tombstones deleted ones)."""
    rng = random.Random(17)
    evs = [(rng.randrange(30), seq, "delete" if rng.random() < 0.3 else "insert") for seq in rng.sample(range(1, 9000), 300)]
    src, out = str(tmp_path / "events"), str(tmp_path / "out")
    for i in range(0, len(evs), 30):  # 10 commits, sequences shuffled across them
        part = evs[i:i + 30]
        write_deltalake(src, pa.table({"id": pa.array([e[0] for e in part], pa.int64()), "v": [f"v{e[1]}" for e in part],
                                       "seq": pa.array([e[1] for e in part], pa.int64()),
                                       "op": [e[2] for e in part]}), mode="append")  # fmt: skip
    spec = {
        "source": {"format": "delta", "options": {"path": src, "maxFilesPerTrigger": 1}},
        "sink": {"format": "delta", "options": {"path": out, "keys": "id", "sequenceBy": "seq",
                                                "applyAsDeletes": "op = 'delete'", "exceptColumnList": "op"}},
        "checkpoint": str(tmp_path / "chk"),
        "trigger": {"available_now": True},
    }  # fmt: skip
    commits = tmp_path / "chk" / "commits"
    points = [*(p for p in CRASH_POINTS if p != "mid_write"), "delta_between_tombstones_and_merge", "mid_write"]
    for point in points:
        batch = max((int(n) for n in os.listdir(commits) if n.isdigit()), default=-1) + 1 if commits.is_dir() else 0
        r = run_pipeline(spec, crash=f"{point}:{batch}")
        assert r.killed or point == "mid_write", f"{point}:{batch} {r.stderr[-500:]}"
    run_pipeline(spec).check()
    assert (tmp_path / "chk" / "sinks" / "0" / "tombstones" / "from-0" / "changelog").is_dir()
    latest: dict[int, tuple[int, str]] = {}
    for id_, seq, op in evs:
        if id_ not in latest or latest[id_][0] < seq:
            latest[id_] = (seq, op)
    expected = sorted((k, f"v{seq}") for k, (seq, op) in latest.items() if op != "delete")
    assert sorted((r["id"], r["v"]) for r in DeltaTable(out).to_pyarrow_table().to_pylist()) == expected
