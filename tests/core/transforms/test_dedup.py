"""DropDuplicatesOperator (drop_duplicates, drop_duplicates_within_watermark) for both state
backends, checked against DuckDB over all input at once."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pytest

from headrace.errors import HeadraceError, UnsupportedError
from headrace.transforms.dedup import DropDuplicatesOperator, _first_rows
from headrace.transforms.operator import BatchInfo, OperatorContext
from tests.core.transforms.stateful_harness import run_batches

BACKENDS = ["memory", "rocksdb"]
TS = pa.timestamp("us", tz="UTC")
T0 = 1_700_000_000


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def events(rows: list[tuple[int, str, int]]) -> pa.Table:
    """(event second after T0, id, value) rows."""
    return pa.table({"ts": pa.array([(T0 + s) * 1_000_000 for s, _, _ in rows], pa.int64()).cast(TS),
                     "id": [i for _, i, _ in rows], "v": [v for _, _, v in rows]})  # fmt: skip


def random_batches(n: int, rows: int, seed: int = 2) -> list[pa.Table]:
    rng = random.Random(seed)
    return [events([(b * 10 + rng.randrange(10), f"id{rng.randrange(60)}", rng.randrange(3)) for _ in range(rows)])
            for b in range(n)]  # fmt: skip


def first_per_key(batches: list[pa.Table], keys: list[str]) -> list[dict[str, Any]]:
    con = duckdb.connect()
    t = pa.concat_tables(batches)
    t = t.append_column("rn", pa.array(range(t.num_rows)))
    con.register("events", t)
    part = ", ".join(keys)
    return con.sql(f"SELECT * EXCLUDE rn FROM events QUALIFY row_number() OVER (PARTITION BY {part} ORDER BY rn) = 1 "
                   "ORDER BY rn").to_arrow_table().to_pylist()  # fmt: skip


@pytest.mark.parametrize("keys", [["id"], ["id", "v"], []], ids=["one-column", "two-columns", "all-columns"])
@pytest.mark.parametrize("chunks", [1, 4], ids=["one-chunk", "four-chunks"])
def test_drop_duplicates_matches_duckdb(backend: str, tmp_path: Path, keys: list[str], chunks: int) -> None:
    batches = random_batches(5, 80)
    run = run_batches(lambda: DropDuplicatesOperator(keys), batches, state_path=str(tmp_path), backend=backend,
                      mode="append", chunks=chunks)  # fmt: skip
    assert run.all_rows() == first_per_key(batches, keys or ["ts", "id", "v"])


def test_restart_keeps_seen_keys(backend: str, tmp_path: Path) -> None:
    batches = random_batches(6, 50, seed=4)
    mk = lambda: DropDuplicatesOperator(["id"])  # noqa: E731
    run = run_batches(mk, batches[:3], state_path=str(tmp_path), backend=backend, mode="append")
    run = run_batches(mk, batches[3:], state_path=str(tmp_path), backend=backend, mode="append", run=run)
    assert run.all_rows() == first_per_key(batches, ["id"])


def test_event_time_key_state_is_evicted_by_watermark(backend: str, tmp_path: Path) -> None:
    # the same (ts, id) repeated within a few batches; watermark delay 15 s
    rows = [[(b * 10 + j % 10, f"id{j % 5}", 0) for j in range(20)] for b in range(8)]
    rows[2] += [(5, "id0", 1)]  # late by then (watermark of batch 2 is 19 - 15 = 4 < 5): a duplicate of batch 0's row
    rows[4] += [(5, "id0", 1)]  # late: watermark of batch 4 is 39 - 15 = 24 >= 5
    batches = [events(r) for r in rows]
    run = run_batches(lambda: DropDuplicatesOperator(["ts", "id"], watermark_column="ts"), batches,
                      state_path=str(tmp_path), backend=backend, mode="append", watermark=("ts", 15_000))  # fmt: skip
    got = [(r["ts"].timestamp() - T0, r["id"]) for r in run.all_rows()]
    assert len(got) == len(set(got))
    assert set(got) == {(b * 10 + j % 10, f"id{j % 5}") for b in range(8) for j in range(20)}
    assert run.metrics[4]["numRowsDroppedByWatermark"] == 1
    assert run.metrics[2]["numRowsDroppedByWatermark"] == 0
    # state holds only keys the watermark has not passed
    assert max(m["numRowsTotal"] for m in run.metrics) <= 10 * 3
    assert run.metrics[-1]["numRowsRemoved"] > 0


def test_within_watermark_expires_keys(backend: str, tmp_path: Path) -> None:
    batches = [
        events([(0, "a", 1), (1, "b", 1), (2, "a", 2)]),  # a@2 duplicate within the chunk
        events([(8, "a", 3), (30, "c", 1)]),  # a@8: still within a's expiry (0 + 10 s)
        # watermark 20: a and b expire (10, 11 < 20), but as in Spark only after this batch's rows
        events([(31, "a", 4), (31, "b", 2)]),
        events([(15, "d", 1), (40, "a", 5)]),  # watermark 21: d is late, a is new again
    ]
    run = run_batches(lambda: DropDuplicatesOperator(["id"], within_watermark=True, watermark_column="ts",
                                                     watermark_delay="10 seconds"),
                      batches, state_path=str(tmp_path), backend=backend, mode="append",
                      watermark=("ts", 10_000))  # fmt: skip
    got = [(r["ts"].timestamp() - T0, r["id"], r["v"]) for r in run.all_rows()]
    assert got == [(0, "a", 1), (1, "b", 1), (30, "c", 1), (40, "a", 5)]
    assert run.metrics[3]["numRowsDroppedByWatermark"] == 1


def test_within_watermark_a_key_expires_when_the_watermark_reaches_its_expiry(backend: str, tmp_path: Path) -> None:
    """PySpark 4.3 removes a key once ``watermarkForEviction >= expiresAt``: a key whose expiry
    (first event time + delay) equals the watermark is gone after that batch."""
    batches = [
        events([(0, "a", 1)]),  # a expires at 10 s
        events([(20, "b", 1)]),  # watermark 10 s after batch 0 (0 s): a kept; watermark 10 s from now on
        events([(21, "c", 1)]),  # watermark 10 s: a's expiry reached, evicted
    ]
    run = run_batches(lambda: DropDuplicatesOperator(["id"], within_watermark=True, watermark_column="ts",
                                                     watermark_delay="10 seconds"),
                      batches, state_path=str(tmp_path), backend=backend, mode="append",
                      watermark=("ts", 10_000))  # fmt: skip
    assert run.watermarks[2] is not None and run.watermarks[2] % 1000 == 0
    assert [m["numRowsTotal"] for m in run.metrics] == [1, 2, 2]  # b (30 s), c (31 s); a (10 s) evicted at 10 s


def test_real_time_emits_per_chunk(backend: str, tmp_path: Path) -> None:
    op = DropDuplicatesOperator(["id"])
    t = events([(i, f"id{i % 3}", i) for i in range(9)])
    op.output_schema(t.schema)
    op.open(OperatorContext(index=0, state_path=str(tmp_path), state_backend=backend, real_time=True))
    info = BatchInfo(0, real_time=True)
    op.begin(info)
    outs = [op.process(t.slice(i, 2), info) for i in range(0, 9, 2)]
    assert [o.column("id").to_pylist() if o is not None else None for o in outs] == [["id0", "id1"], ["id2"], None,
                                                                                     None, None]  # fmt: skip
    assert op.finish(info) is None
    assert op.metrics()["numRowsTotal"] == 3
    op.close()


def test_modes_and_definition_errors() -> None:
    schema = events([(0, "a", 1)]).schema
    op = DropDuplicatesOperator(["id"])
    op.check_output_mode("append")
    op.check_output_mode("update")
    with pytest.raises(UnsupportedError, match="Complete output mode not supported"):
        op.check_output_mode("complete")
    with pytest.raises(UnsupportedError, match="needs a watermark"):
        DropDuplicatesOperator(["id"], within_watermark=True)
    with pytest.raises(HeadraceError, match="no column 'nope'"):
        DropDuplicatesOperator(["nope"]).output_schema(schema)
    with pytest.raises(HeadraceError, match="not a timestamp"):
        DropDuplicatesOperator(["id"], watermark_column="id").output_schema(schema)


def first_rows_by_group_by(keys: pa.Table) -> list[int]:
    pos = pa.array(range(keys.num_rows), pa.int64())
    grouped = keys.append_column("__i", pos).group_by(keys.column_names, use_threads=False).aggregate([("__i", "min")])
    return sorted(grouped.column("__i_min").to_pylist())


@pytest.mark.parametrize(
    "columns",
    [
        {"id": pa.int64()},
        {"id": pa.int64(), "ts": TS},
        {"small": pa.int8(), "flag": pa.bool_(), "day": pa.date32()},
        {"name": pa.string(), "id": pa.int64()},
    ],
    ids=["int64", "int64-and-timestamp", "int8-bool-date", "string-and-int64"],
)
def test_first_rows_are_each_keys_first_with_nulls_equal(columns: dict[str, pa.DataType]) -> None:
    rng = random.Random(5)
    n = 3000  # few distinct values per column: long probe chains and many repeats, nulls among them
    def column(typ: pa.DataType) -> pa.Array:
        values = [None if rng.random() < 0.1 else rng.randrange(40) for _ in range(n)]
        if pa.types.is_string(typ):
            return pa.array([None if v is None else str(v % 5) for v in values], typ)
        if pa.types.is_boolean(typ):
            return pa.array([None if v is None else v % 2 == 0 for v in values], typ)
        return pa.array(values, pa.int32() if pa.types.is_date32(typ) else pa.int64()).cast(typ)

    data = {name: column(typ) for name, typ in columns.items()}
    keys = pa.table(data)
    first = _first_rows(keys)
    assert first is not None
    assert first.tolist() == first_rows_by_group_by(keys)
    distinct = keys.take(pa.array(first))
    assert _first_rows(distinct) is None  # every key differs: nothing to drop
