"""AggregateOperator per output mode and state backend, checked against DuckDB running the same
query over all input at once."""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pytest

from headrace.errors import HeadraceError, UnsupportedError
from headrace.transforms.aggregate import AggregateOperator, parse_aggregate
from headrace.transforms.expressions import ExpressionError
from headrace.transforms.operator import BatchInfo, OperatorContext
from headrace.transforms.window import window
from tests.core.transforms.stateful_harness import run_batches

BACKENDS = ["memory", "rocksdb"]
TS = pa.timestamp("us", tz="UTC")
AGGS = ["count(*) AS n", "sum(amount) AS total", "min(amount) AS lo", "max(name) AS hi", "avg(amount) AS mean",
        "stddev(amount) AS sd", "count(amount) AS n_amount"]  # fmt: skip
SQL_AGGS = ("count(*) AS n, sum(amount) AS total, min(amount) AS lo, max(name) AS hi, avg(amount) AS mean, "
            "stddev_samp(amount) AS sd, count(amount) AS n_amount")  # fmt: skip


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def make_batches(n_batches: int, rows: int, *, keys: int = 7, seed: int = 1, lateness_s: int = 0,
                 start_s: int = 1_700_000_000) -> list[pa.Table]:  # fmt: skip
    """Rows with event times increasing by batch (each batch 60 s of events), some out of order."""
    rng = random.Random(seed)
    out = []
    for b in range(n_batches):
        ts, user, amount, name = [], [], [], []
        for _ in range(rows):
            t = start_s + b * 60 + rng.uniform(0, 60) - rng.uniform(0, lateness_s)
            ts.append(int(t * 1_000_000))
            user.append(f"u{rng.randrange(keys)}")
            amount.append(None if rng.random() < 0.1 else rng.randrange(-50, 100))
            name.append(rng.choice(["a", "bb", "c", None]))
        out.append(pa.table({"ts": pa.array(ts, pa.int64()).cast(TS), "user": user,
                             "amount": pa.array(amount, pa.int64()), "name": name}))  # fmt: skip
    return out


def duck(batches: list[pa.Table], sql: str) -> list[dict[str, Any]]:
    con = duckdb.connect()
    con.register("events", pa.concat_tables(batches))
    return con.sql(sql).to_arrow_table().to_pylist()


def norm(rows: list[dict[str, Any]], key: tuple[str, ...]) -> dict[Any, dict[str, Any]]:
    out = {}
    for r in rows:
        r = dict(r)
        if isinstance(r.get("window"), dict):
            w = r.pop("window")
            r["wstart"], r["wend"] = w["start"], w["end"]
        k = tuple(r[c] for c in key)
        assert k not in out, f"key {k} emitted twice"
        out[k] = r
    return out


def assert_rows_equal(got: dict[Any, dict[str, Any]], want: dict[Any, dict[str, Any]]) -> None:
    assert set(got) == set(want), f"missing {sorted(set(want) - set(got))[:5]}, extra {sorted(set(got) - set(want))[:5]}"
    for k, w in want.items():
        g = got[k]
        for c, v in w.items():
            if isinstance(v, float) or isinstance(g[c], float):
                assert (v is None and g[c] is None) or math.isclose(g[c], v, rel_tol=1e-9, abs_tol=1e-9), (k, c, g[c], v)
            else:
                assert g[c] == v, (k, c, g[c], v)


@pytest.mark.parametrize("chunks", [1, 3], ids=["one-chunk", "three-chunks"])
def test_update_mode_by_key_matches_duckdb(backend: str, tmp_path: Path, chunks: int) -> None:
    batches = make_batches(5, 300)
    run = run_batches(lambda: AggregateOperator(["user"], AGGS), batches, state_path=str(tmp_path), backend=backend,
                      mode="update", chunks=chunks)  # fmt: skip
    latest: dict[Any, dict[str, Any]] = {}
    for t in run.outputs:
        assert t is not None
        rows = norm(t.to_pylist(), ("user",))  # each key at most once per batch
        latest.update(rows)
    want = norm(duck(batches, f"SELECT user, {SQL_AGGS} FROM events GROUP BY user"), ("user",))
    assert_rows_equal(latest, want)
    # update mode emits only the keys a batch touched
    only = [pa.table({"ts": pa.array([1_700_000_000_000_000], pa.int64()).cast(TS), "user": ["u3"],
                      "amount": pa.array([5], pa.int64()), "name": ["z"]})]  # fmt: skip
    run2 = run_batches(lambda: AggregateOperator(["user"], AGGS), only, state_path=str(tmp_path), backend=backend,
                       mode="update", run=run)  # fmt: skip
    out = run2.outputs[-1]
    assert out is not None and out.column("user").to_pylist() == ["u3"]
    assert out.column("n").to_pylist() == [want[("u3",)]["n"] + 1]
    m = run2.metrics[-1]
    assert m["numRowsTotal"] == 7 and m["numRowsUpdated"] == 1 and m["numRowsDroppedByWatermark"] == 0


def test_complete_mode_emits_whole_result_every_batch(backend: str, tmp_path: Path) -> None:
    batches = make_batches(4, 200)
    run = run_batches(lambda: AggregateOperator(["user", "name"], AGGS[:5]), batches, state_path=str(tmp_path),
                      backend=backend, mode="complete")  # fmt: skip
    for i in range(len(batches)):
        out = run.outputs[i]
        assert out is not None
        want = duck(batches[: i + 1], f"SELECT user, name, {', '.join(SQL_AGGS.split(', ')[:5])} FROM events GROUP BY ALL")
        assert_rows_equal(norm(out.to_pylist(), ("user", "name")), norm(want, ("user", "name")))


def test_global_aggregation(backend: str, tmp_path: Path) -> None:
    batches = make_batches(3, 100)
    run = run_batches(lambda: AggregateOperator([], ["count(*) AS n", "sum(amount) AS s"]), batches,
                      state_path=str(tmp_path), backend=backend, mode="complete")  # fmt: skip
    out = run.outputs[-1]
    assert out is not None and out.column_names == ["n", "s"]
    assert out.to_pylist() == duck(batches, "SELECT count(*) AS n, sum(amount)::BIGINT AS s FROM events")


def _window_sql(duration_s: int, slide_s: int) -> str:
    n = -(-duration_s // slide_s)
    return f"""
        WITH w AS (
          SELECT *, epoch_us(ts) - ((epoch_us(ts) % {slide_s * 1_000_000}) + {slide_s * 1_000_000})
                    % {slide_s * 1_000_000} - k * {slide_s * 1_000_000} AS ws
          FROM events, range({n}) AS r(k))
        SELECT make_timestamp(ws) AS wstart, make_timestamp(ws + {duration_s * 1_000_000}) AS wend, user, {SQL_AGGS}
        FROM w WHERE ws + {duration_s * 1_000_000} > epoch_us(ts) GROUP BY ALL"""


def _as_utc(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    import datetime as dt

    for r in rows:
        for c in ("wstart", "wend"):
            r[c] = r[c].replace(tzinfo=dt.UTC)
    return rows


@pytest.mark.parametrize(("duration", "slide"), [(60, 60), (60, 20), (50, 20)], ids=["tumbling", "sliding", "sliding-uneven"])
def test_append_mode_windows_once_when_watermark_passes(backend: str, tmp_path: Path, duration: int, slide: int) -> None:
    """In-order data (no late rows): every window is emitted exactly once, after the watermark
    passed its end, with DuckDB's values; a last batch far in the future closes the rest."""
    batches = make_batches(6, 200, seed=3)
    flush = pa.table({"ts": pa.array([1_800_000_000_000_000], pa.int64()).cast(TS), "user": ["zz"],
                      "amount": pa.array([1], pa.int64()), "name": ["x"]})  # fmt: skip
    keys: list[Any] = [window("ts", f"{duration} seconds", None if slide == duration else f"{slide} seconds"), "user"]
    run = run_batches(lambda: AggregateOperator(keys, AGGS, watermark_column="ts"),
                      [*batches, flush, flush.slice(0, 0)], state_path=str(tmp_path), backend=backend, mode="append",
                      watermark=("ts", 5_000))  # fmt: skip
    got = norm(run.all_rows(), ("wstart", "wend", "user"))
    want = norm(_as_utc(duck(batches, _window_sql(duration, slide))), ("wstart", "wend", "user"))
    assert_rows_equal(got, want)
    assert run.outputs[0] is None  # nothing is final before the watermark moves
    assert sum(m["numRowsDroppedByWatermark"] for m in run.metrics) == 0
    assert run.metrics[-1]["numRowsTotal"] <= -(-duration // slide)  # only the flush row's windows remain


def test_late_rows_are_dropped_and_counted(backend: str, tmp_path: Path) -> None:
    t0 = 1_700_000_000
    def b(secs: list[int]) -> pa.Table:
        return pa.table({"ts": pa.array([(t0 + s) * 1_000_000 for s in secs], pa.int64()).cast(TS),
                         "user": ["a"] * len(secs), "amount": pa.array([1] * len(secs), pa.int64()),
                         "name": ["x"] * len(secs)})  # fmt: skip
    # windows of 10 s, watermark delay 5 s; batch 1 runs with watermark t0+25
    batches = [b([1, 2, 30]), b([3, 12, 21, 26, 31]), b([100])]
    run = run_batches(lambda: AggregateOperator([window("ts", "10 seconds"), "user"], ["count(*) AS n"],
                                                watermark_column="ts"), batches, state_path=str(tmp_path),
                      backend=backend, mode="append", watermark=("ts", 5_000))  # fmt: skip
    # batch 1: window [0,10) closed (end 10 <= 25) and [10,20) closed: rows 3 and 12 are late
    assert run.metrics[1]["numRowsDroppedByWatermark"] == 2
    got = {(r["window"]["start"].timestamp() - t0): r["n"] for r in run.all_rows()}
    # batch 1 emits [0,10) (its 2 rows from batch 0); batch 2 runs with watermark t0+26: nothing
    assert got == {0: 2}
    out = run_batches(lambda: AggregateOperator([window("ts", "10 seconds"), "user"], ["count(*) AS n"],
                                                watermark_column="ts"), [b([200])], state_path=str(tmp_path),
                      backend=backend, mode="append", watermark=("ts", 5_000), run=run)  # fmt: skip
    got = {(r["window"]["start"].timestamp() - t0): r["n"] for r in out.all_rows()}
    # the restarted run's batch 3 has watermark t0+95: [20,30) and [30,40) close, [100,110) not yet
    assert got == {0: 2, 20: 2, 30: 2}


def test_update_mode_with_watermark_evicts_closed_windows(backend: str, tmp_path: Path) -> None:
    batches = make_batches(8, 100, seed=5)
    run = run_batches(lambda: AggregateOperator([window("ts", "30 seconds"), "user"], ["count(*) AS n"],
                                                watermark_column="ts"), batches, state_path=str(tmp_path),
                      backend=backend, mode="update", watermark=("ts", 1_000))  # fmt: skip
    totals = [m["numRowsTotal"] for m in run.metrics]
    assert max(totals) <= 7 * 4, totals  # bounded: only windows the watermark has not passed
    latest = {}
    for t in run.outputs:
        for r in (t.to_pylist() if t is not None else []):
            latest[(r["window"]["start"], r["user"])] = r["n"]
    want = duck(batches, "SELECT make_timestamp(epoch_us(ts) - epoch_us(ts) % 30000000) AS ws, user, count(*) AS n "
                         "FROM events GROUP BY ALL")  # fmt: skip
    import datetime as dt

    assert latest == {(r["ws"].replace(tzinfo=dt.UTC), r["user"]): r["n"] for r in want}


def test_replay_restores_previous_state_and_output(backend: str, tmp_path: Path) -> None:
    """Batch 2 ran (and committed its state) but the sink never committed: the replay of batch
    2 by a new operator produces exactly the same output."""
    batches = make_batches(3, 150, seed=9)
    mk = lambda: AggregateOperator(["user"], AGGS)  # noqa: E731
    first = run_batches(mk, batches, state_path=str(tmp_path), backend=backend, mode="update")
    again = run_batches(mk, batches[:2], state_path=str(tmp_path / "other"), backend=backend, mode="update")
    replay = run_batches(mk, batches[2:], state_path=str(tmp_path), backend=backend, mode="update", run=again)
    a, b = first.outputs[2], replay.outputs[2]
    assert a is not None and b is not None
    assert sorted(a.to_pylist(), key=lambda r: r["user"]) == sorted(b.to_pylist(), key=lambda r: r["user"])


def test_real_time_update_emits_per_chunk(backend: str, tmp_path: Path) -> None:
    batches = make_batches(2, 90)
    op = AggregateOperator(["user"], ["count(*) AS n"])
    op.output_schema(batches[0].schema)
    op.open(OperatorContext(index=0, state_path=str(tmp_path), state_backend=backend, output_mode="update",
                            real_time=True))  # fmt: skip
    info = BatchInfo(0, real_time=True)
    op.begin(info)
    outs = [op.process(batches[0].slice(i, 30), info) for i in range(0, 90, 30)]
    assert all(o is not None and o.num_rows > 0 for o in outs)
    assert op.finish(info) is None
    last: dict[str, int] = {}
    for o in outs:
        assert o is not None
        last.update(zip(o.column("user").to_pylist(), o.column("n").to_pylist(), strict=True))
    want = {r["user"]: r["n"] for r in duck(batches[:1], "SELECT user, count(*) AS n FROM events GROUP BY user")}
    assert last == want
    op.close()


def test_output_mode_rules() -> None:
    no_wm = AggregateOperator(["user"], ["count(*) AS n"])
    with pytest.raises(UnsupportedError, match="Append output mode not supported"):
        no_wm.check_output_mode("append")
    no_wm.check_output_mode("update")
    no_wm.check_output_mode("complete")
    wm_not_key = AggregateOperator(["user"], ["count(*) AS n"], watermark_column="ts")
    with pytest.raises(UnsupportedError, match="not a grouping key"):
        wm_not_key.check_output_mode("append")
    AggregateOperator([window("ts", "1 minute"), "user"], ["count(*)"], watermark_column="ts").check_output_mode("append")
    with pytest.raises(UnsupportedError, match="not one of"):
        no_wm.check_output_mode("upsert")


def test_definition_errors() -> None:
    schema = make_batches(1, 1)[0].schema
    with pytest.raises(HeadraceError, match="not of the form"):
        parse_aggregate("sum(a) + 1 AS x")
    with pytest.raises(UnsupportedError, match="first\\(\\) is not supported"):
        parse_aggregate("first(a)")
    with pytest.raises(UnsupportedError, match="distinct aggregations"):
        parse_aggregate("count(DISTINCT user)")
    with pytest.raises(HeadraceError, match="no column 'nope'"):
        AggregateOperator(["nope"], ["count(*)"]).output_schema(schema)
    with pytest.raises(ExpressionError, match="missing_col"):
        AggregateOperator(["user"], ["sum(missing_col) AS s"]).output_schema(schema)
    with pytest.raises(HeadraceError, match="not a timestamp"):
        AggregateOperator([window("user", "1 minute")], ["count(*)"]).output_schema(schema)
    with pytest.raises(HeadraceError, match="slide"):
        window("ts", "1 minute", "2 minutes")
    with pytest.raises(HeadraceError, match="not a duration"):
        window("ts", "soon")
    out = AggregateOperator([window("ts", "1 minute"), "user"], ["count(*)", "sum(amount)", "avg(amount) AS m"]
                            ).output_schema(schema)  # fmt: skip
    assert out.names == ["window", "user", "count(1)", "sum(amount)", "m"]
    assert out.field("window").type == pa.struct([("start", TS), ("end", TS)])
    assert out.field("sum(amount)").type == pa.int64()


@pytest.mark.parametrize("chunks", [1, 3], ids=["one-chunk", "three-chunks"])
def test_column_types_merge_across_batches(backend: str, tmp_path: Path, chunks: int) -> None:
    """Decimals, 32-bit ints and floats, timestamps, strings, null keys: merged values keep
    DuckDB's types and values over all input (with three chunks per batch, the chunks' partials
    are combined first: decimals by DuckDB, the rest by Arrow)."""
    import decimal

    def b(seed: int) -> pa.Table:
        rng = random.Random(seed)
        n = 50
        return pa.table({
            "k": [rng.choice(["x", "y", None]) for _ in range(n)],
            "d": pa.array([decimal.Decimal(rng.randrange(-999, 999)) / 100 for _ in range(n)], pa.decimal128(10, 2)),
            "i": pa.array([rng.randrange(100) for _ in range(n)], pa.int32()),
            "f": pa.array([rng.random() for _ in range(n)], pa.float32()),
            "t": pa.array([1_700_000_000_000_000 + rng.randrange(10**9) for _ in range(n)], pa.int64()).cast(TS),
        })  # fmt: skip
    batches = [b(s) for s in range(4)]
    aggs = ["sum(d) AS sd", "min(d) AS mind", "sum(i) AS si", "sum(i * 2) AS si2", "max(f) AS mf", "min(t) AS mint",
            "max(k) AS mk", "count(*) AS n"]  # fmt: skip
    run = run_batches(lambda: AggregateOperator(["k"], aggs), batches, state_path=str(tmp_path), backend=backend,
                      mode="complete", chunks=chunks)  # fmt: skip
    out = run.outputs[-1]
    assert out is not None
    want = duck(batches, "SELECT k, sum(d) AS sd, min(d) AS mind, sum(i)::BIGINT AS si, sum(i * 2)::BIGINT AS si2, "
                         "max(f) AS mf, min(t) AS mint, max(k) AS mk, count(*) AS n FROM events GROUP BY k")  # fmt: skip
    assert sorted(out.to_pylist(), key=lambda r: str(r["k"])) == sorted(want, key=lambda r: str(r["k"]))


def test_append_mode_keyed_by_the_event_time_column(backend: str, tmp_path: Path) -> None:
    """group_by(<watermark column>) in append mode: a key is emitted once the watermark passes
    it, late rows are dropped."""
    def b(secs: list[int]) -> pa.Table:
        return pa.table({"ts": pa.array([(1_700_000_000 + s) * 1_000_000 for s in secs], pa.int64()).cast(TS),
                         "v": pa.array([1] * len(secs), pa.int64())})  # fmt: skip
    batches = [b([1, 1, 5]), b([1, 9, 12]), b([30]), b([31])]
    run = run_batches(lambda: AggregateOperator(["ts"], ["count(*) AS n"], watermark_column="ts"), batches,
                      state_path=str(tmp_path), backend=backend, mode="append", watermark=("ts", 3_000))  # fmt: skip
    got = [(int(r["ts"].timestamp()) - 1_700_000_000, r["n"]) for r in run.all_rows()]
    # batch 1 (watermark 2): the 1 s row is late; emits 1 s. batch 2 (9): 5 s and 9 s. batch 3 (27): 12 s.
    assert got == [(1, 2), (5, 1), (9, 1), (12, 1)]
    assert run.metrics[1]["numRowsDroppedByWatermark"] == 1


PROBE_TYPES = [pa.int8(), pa.int32(), pa.int64(), pa.uint16(), pa.uint64(), pa.float32(), pa.float64(), pa.bool_(),
               pa.string(), pa.binary(), pa.date32(), pa.timestamp("us"), pa.timestamp("ms"), pa.timestamp("ms", tz="UTC"),
               pa.timestamp("ns", tz="UTC"), TS, pa.timestamp("us", tz="Europe/Paris"), pa.large_string(), pa.decimal128(10, 2)]  # fmt: skip


@pytest.mark.parametrize("t", PROBE_TYPES, ids=str)
def test_schemas_derived_without_duckdb_are_duckdbs(t: pa.DataType, monkeypatch: pytest.MonkeyPatch) -> None:
    """Over bare columns, the state and output schemas are derived at start() without planning
    SQL; they must be exactly what DuckDB's plan gives (state metadata records them)."""
    numeric = pa.types.is_integer(t) or pa.types.is_floating(t)
    schema = pa.schema([("ts", TS), ("key", t), ("x", t)])
    aggs = ["count(*) AS n", "count(x) AS nx", "min(x) AS lo", "max(x) AS hi"]
    if numeric:
        aggs += ["sum(x) AS s", "avg(x) AS a", "stddev(x) AS sd"]

    def schemas() -> tuple[pa.Schema, ...]:
        op = AggregateOperator([window("ts", "1 minute"), "key"], aggs, watermark_column="ts")
        out = op.output_schema(schema)
        return op._key_schema, op._value_schema, op._partial_schema, out

    derived = schemas()
    from headrace.transforms import aggregate

    monkeypatch.setattr(aggregate, "known_probe", lambda *a: None)
    assert derived == schemas()


@pytest.mark.parametrize(("duration", "slide"), [(60, 60), (60, 20)], ids=["tumbling", "sliding"])
def test_integer_keys_grouped_by_direct_indexing_match_duckdb(backend: str, tmp_path: Path, duration: int,
                                                               slide: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Windows and an integer bucket, counts and sums without nulls (the shape of the bench):
    the partials of each chunk and their combination go through dense_group; the result is
    DuckDB's over all input."""
    from headrace.transforms import agg_partial

    calls = []
    real = agg_partial.dense_group

    def spy(*args: Any, **kwargs: Any) -> Any:
        out = real(*args, **kwargs)
        calls.append(out is not None)
        return out

    monkeypatch.setattr(agg_partial, "dense_group", spy)
    rng = random.Random(5)
    batches = []
    for b in range(5):
        ts = [(1_700_000_000 + b * 30 + rng.uniform(0, 40)) * 1_000_000 for _ in range(400)]
        batches.append(pa.table({"ts": pa.array([int(t) for t in ts], pa.int64()).cast(TS),
                                 "user": pa.array([rng.randrange(-20, 20) for _ in ts], pa.int64()),
                                 "amount": pa.array([rng.randrange(-50, 100) for _ in ts], pa.int64())}))  # fmt: skip
    aggs = ["count(*) AS n", "sum(amount) AS total", "avg(amount) AS mean", "stddev(amount) AS sd",
            "count(amount) AS n_amount"]  # fmt: skip
    keys: list[Any] = [window("ts", f"{duration} seconds", None if slide == duration else f"{slide} seconds"), "user"]
    run = run_batches(lambda: AggregateOperator(keys, aggs, watermark_column="ts"), batches, state_path=str(tmp_path),
                      backend=backend, mode="update", chunks=3)  # fmt: skip
    assert calls and all(calls)
    latest: dict[Any, dict[str, Any]] = {}
    for t in run.outputs:
        if t is not None:
            latest.update(norm(t.to_pylist(), ("wstart", "wend", "user")))
    sql = _window_sql(duration, slide).replace(SQL_AGGS, "count(*) AS n, sum(amount)::BIGINT AS total, avg(amount) AS mean, "
                                               "stddev_samp(amount) AS sd, count(amount) AS n_amount")  # fmt: skip
    want = norm(_as_utc(duck(batches, sql)), ("wstart", "wend", "user"))
    assert_rows_equal(latest, want)


def test_chunks_within_one_window_match_duckdb(backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each chunk lies in one tumbling window (the common case: chunks are short next to
    windows): its window start is a constant key for dense_group, no column; the result is
    DuckDB's over all input."""
    from headrace.transforms import agg_partial

    constants = []
    real = agg_partial.dense_group

    def spy(*args: Any, **kwargs: Any) -> Any:
        constants.append(kwargs.get("constants"))
        return real(*args, **kwargs)

    monkeypatch.setattr(agg_partial, "dense_group", spy)
    rng = random.Random(11)
    batches = []
    for b in range(4):  # batch b in minute b // 2: two batches per window, one window per batch
        ts = [(1_700_000_040 + (b // 2) * 60 + rng.uniform(0, 50)) * 1_000_000 for _ in range(300)]
        batches.append(pa.table({"ts": pa.array([int(t) for t in ts], pa.int64()).cast(TS),
                                 "user": pa.array([rng.randrange(0, 30) for _ in ts], pa.int64()),
                                 "amount": pa.array([rng.randrange(-50, 100) for _ in ts], pa.int64())}))  # fmt: skip
    aggs = ["count(*) AS n", "sum(amount) AS total", "avg(amount) AS mean"]
    keys: list[Any] = [window("ts", "60 seconds"), "user"]
    run = run_batches(lambda: AggregateOperator(keys, aggs, watermark_column="ts"), batches, state_path=str(tmp_path),
                      backend=backend, mode="update", chunks=3)  # fmt: skip
    firsts = [c for c in constants if c]
    assert firsts and all(set(c) == {"__ws"} for c in firsts)
    latest: dict[Any, dict[str, Any]] = {}
    for t in run.outputs:
        if t is not None:
            latest.update(norm(t.to_pylist(), ("wstart", "wend", "user")))
    sql = _window_sql(60, 60).replace(SQL_AGGS, "count(*) AS n, sum(amount)::BIGINT AS total, avg(amount) AS mean")
    want = norm(_as_utc(duck(batches, sql)), ("wstart", "wend", "user"))
    assert_rows_equal(latest, want)


@pytest.mark.parametrize("aligned", [True, False], ids=["same-keys", "different-keys"])
def test_chunk_partials_combine_like_one_partial(aligned: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Partials of several chunks combined per key equal the partial of all their rows; when
    every chunk has the same keys in the same order they are merged row by row (no grouping),
    with nulls (a sum over no value) on either side."""
    def chunk(seed: int) -> pa.Table:
        rng = random.Random(seed)
        users = ["a", "b", "c", "d"] if aligned else rng.sample(["a", "b", "c", "d", "e"], 4)
        return pa.table({"ts": pa.array([1_700_000_000_000_000 + i for i in range(8)], pa.int64()).cast(TS),
                         "user": users * 2,
                         "amount": pa.array([None if (seed + i) % 3 == 0 else rng.randrange(-9, 9) for i in range(8)],
                                            pa.int64()),
                         "name": [rng.choice(["x", "y", None]) for _ in range(8)]})  # fmt: skip
    op = AggregateOperator([window("ts", "1 minute"), "user"], AGGS, watermark_column="ts")
    op.output_schema(chunk(0).schema)
    chunks = [chunk(s) for s in range(3)]
    parts = [op.partial(c) for c in chunks]
    whole = op.partial(pa.concat_tables(chunks))
    if aligned:
        def no_concat(*a: Any, **k: Any) -> Any:
            raise AssertionError("aligned partials were grouped")
        monkeypatch.setattr(pa, "concat_tables", no_concat)
    got = op._combine(parts)
    monkeypatch.undo()
    assert got.schema == whole.schema
    key = ("user",)
    g, w = norm(got.drop_columns(["__ws"]).to_pylist(), key), norm(whole.drop_columns(["__ws"]).to_pylist(), key)
    assert_rows_equal(g, w)


def _same_keys_batches(n: int) -> list[pa.Table]:
    """Every batch: the same 50 integer keys, event time advancing 20 s per batch (1-minute
    windows: a batch usually touches the keys of the window before it again)."""
    out = []
    for b in range(n):
        ts = [(1_700_000_000 + b * 20 + i % 10) * 1_000_000 for i in range(200)]
        out.append(pa.table({"ts": pa.array(ts, pa.int64()).cast(TS), "k": pa.array([i % 50 for i in range(200)]),
                             "v": pa.array([b * 1000 + i for i in range(200)], pa.int64())}))  # fmt: skip
    return out


@pytest.mark.parametrize("mode", ["update", "append", "complete"])
def test_batches_with_the_same_keys_match_duckdb(backend: str, tmp_path: Path, mode: str) -> None:
    """The bench's shape: every batch the same integer keys (partials grouped by direct
    indexing, chunks aligned and merged row by row), windows closed by the watermark between
    batches. The result is DuckDB's."""
    batches = _same_keys_batches(9)
    wm = ("ts", 5_000) if mode != "complete" else None
    aggs = ["count(*) AS n", "sum(v) AS s", "avg(v) AS a"]
    run = run_batches(lambda: AggregateOperator([window("ts", "1 minute"), "k"], aggs, watermark_column="ts"),
                      [*batches, *([batches[0].slice(0, 0)] if mode == "append" else [])], state_path=str(tmp_path),
                      backend=backend, mode=mode, watermark=wm, chunks=2)  # fmt: skip
    want = norm(_as_utc(duck(batches, "SELECT time_bucket(INTERVAL 1 minute, ts) AS wstart, "
                                      "time_bucket(INTERVAL 1 minute, ts) + INTERVAL 1 minute AS wend, k, count(*) AS n, "
                                      "sum(v)::BIGINT AS s, avg(v) AS a FROM events GROUP BY ALL")), ("wstart", "wend", "k"))  # fmt: skip
    if mode == "complete":
        got = norm(run.outputs[-1].to_pylist() if run.outputs[-1] is not None else [], ("wstart", "wend", "k"))
    elif mode == "update":
        got = {}
        for t in run.outputs:
            if t is not None:
                got.update(norm(t.to_pylist(), ("wstart", "wend", "k")))
    else:  # append: the windows the watermark closed, each once
        got = norm(run.all_rows(), ("wstart", "wend", "k"))
        want = {k: v for k, v in want.items() if k in got}
        assert len(got) >= len(want) > 0
    assert_rows_equal(got, want)


def test_a_replayed_batch_after_same_key_batches_gives_the_same_output(backend: str, tmp_path: Path) -> None:
    """Batch 2 run twice in one operator (a replay): it starts again from version 1 restored
    from files, and gives the same output."""
    batches = _same_keys_batches(3)
    op = AggregateOperator([window("ts", "1 minute"), "k"], ["count(*) AS n", "sum(v) AS s"])
    op.output_schema(batches[0].schema)
    op.open(OperatorContext(index=0, state_path=str(tmp_path), state_backend=backend, output_mode="update"))
    try:
        outs = []
        for b in [0, 1, 2, 2]:
            info = BatchInfo(b)
            op.begin(info)
            op.process(batches[b], info)
            out = op.finish(info)
            assert out is not None
            outs.append(out.sort_by([("k", "ascending")]).to_pylist())
        assert outs[3] == outs[2]
    finally:
        op.close()
