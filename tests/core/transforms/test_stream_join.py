"""Stream-stream joins end to end (memory streams -> the engine -> foreach_batch): every join
kind with matched, unmatched and late rows, on both state backends; the refusals Spark gives;
the state bound to the join's description; a restart and a replay giving the same rows."""

from __future__ import annotations

import datetime as dt
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import headrace as hr
from headrace.errors import CheckpointError, HeadraceError, OptionsError, UnsupportedError
from headrace.testing import memory_stream
from headrace.transforms.expressions import ExpressionError

TS = pa.timestamp("us", tz="UTC")
LEFT = pa.schema([("lk", pa.string()), ("lts", TS), ("lv", pa.int64())])
RIGHT = pa.schema([("rk", pa.string()), ("rts", TS), ("rv", pa.int64())])
RANGE = "l.lk = r.rk AND l.lts BETWEEN r.rts - INTERVAL 10 SECONDS AND r.rts"
BACKENDS = ["memory", "rocksdb"]

# (left rows, right rows) per batch: (key, second, value); delay 5 s on both sides
BATCHES: list[tuple[list[tuple[str, int, int]], list[tuple[str, int, int]]]] = [
    ([("a", 10, 1), ("b", 12, 2)], [("a", 15, 10)]),  # a matches; b waits
    ([("c", 30, 3)], [("b", 40, 20), ("d", 31, 30)]),  # b@40 is too late for left b@12; nothing matches
    ([("x", 5, 4), ("d", 28, 5)], [("c", 35, 40)]),  # x@5 is late (dropped); d and c match
    ([("e", 60, 6)], [("f", 70, 50)]),  # moves the watermark to 55: the old rows are evicted
    ([("g", 80, 7)], [("h", 90, 60)]),
]


def at(second: int) -> dt.datetime:
    return dt.datetime(2026, 1, 1, tzinfo=dt.UTC) + dt.timedelta(seconds=second)


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


class Streams:
    """Two memory streams and the frames over them, watermarked (5 s) unless told not to."""

    def __init__(self, *, watermark: tuple[bool, bool] = (True, True)) -> None:
        self.left_name, self.right_name = f"l-{uuid.uuid4().hex[:8]}", f"r-{uuid.uuid4().hex[:8]}"
        self.left_stream, self.right_stream = (
            memory_stream(self.left_name, LEFT),
            memory_stream(self.right_name, RIGHT),
        )
        left = hr.read_stream.format("memory").option("name", self.left_name).schema(LEFT).load()
        right = hr.read_stream.format("memory").option("name", self.right_name).schema(RIGHT).load()
        if watermark[0]:
            left = left.with_watermark("lts", "5 seconds")
        if watermark[1]:
            right = right.with_watermark("rts", "5 seconds")
        self.left, self.right = left.alias("l"), right.alias("r")

    def add(self, lrows: list[tuple[str, int, int]], rrows: list[tuple[str, int, int]]) -> None:
        """Both sides' rows of one step. The running query plans a batch whenever it sees new
        rows, and adding to two streams is two steps: the tables are built first, so the two
        appends follow each other at once and the query sees the step's rows in one batch."""
        left = pa.Table.from_pylist([{"lk": k, "lts": at(s), "lv": v} for k, s, v in lrows], schema=LEFT)
        right = pa.Table.from_pylist([{"rk": k, "rts": at(s), "rv": v} for k, s, v in rrows], schema=RIGHT)
        self.left_stream.add(left)
        self.right_stream.add(right)


class Run:
    def __init__(self) -> None:
        self.out: dict[int, pa.Table] = {}
        self.progress: list[dict[str, Any]] = []

    def rows(self) -> list[tuple[Any, ...]]:
        """Every output row as (batch, lk, lv, rk, rv), in batch order."""
        got = []
        for b in sorted(self.out):
            for r in self.out[b].to_pylist():
                got.append((b, r.get("lk"), r.get("lv"), r.get("rk"), r.get("rv")))
        return got

    def values(self) -> list[tuple[Any, ...]]:
        return sorted(((r[2], r[4]) for r in self.rows()), key=repr)


def run(frame: Any, streams: Streams, batches: list[Any], chk: Path, backend: str = "memory",
        result: Run | None = None, **options: Any) -> Run:  # fmt: skip
    result = result or Run()
    writer = frame.write_stream.foreach_batch(lambda t, b: result.out.__setitem__(b, t))
    writer = writer.option("checkpointLocation", str(chk)).option("stateStore", backend)
    for k, v in options.items():
        writer = writer.option(k, v)
    q = writer.start()
    try:
        for lrows, rrows in batches:
            streams.add(lrows, rrows)
            q.process_all_available(60)
        if not batches:
            q.process_all_available(60)
    finally:
        q.stop()
    assert q.exception() is None, q.exception()
    result.progress += q.recent_progress
    return result


# (lv, rv) of every output row, per join kind, over BATCHES
EXPECTED: dict[str, list[tuple[int | None, int | None]]] = {
    "inner": [(1, 10), (3, 40), (5, 30)],
    "left": [(1, 10), (2, None), (3, 40), (5, 30), (6, None)],  # e@60 too: the last watermark is 75 s
    "right": [(1, 10), (3, 40), (5, 30), (None, 20), (None, 50)],
    "full": [(1, 10), (2, None), (3, 40), (5, 30), (6, None), (None, 20), (None, 50)],
    "left_semi": [(1, None), (3, None), (5, None)],
}


@pytest.mark.parametrize("how", list(EXPECTED))
def test_each_join_kind_matches_waits_and_emits_unmatched_rows_once(
    how: str, backend: str, tmp_path: Path
) -> None:
    s = Streams()
    got = run(s.left.join(s.right, RANGE, how=how), s, BATCHES, tmp_path / "chk", backend)
    assert got.values() == sorted(EXPECTED[how], key=repr)
    rows = got.rows()
    # the late left row x@5 is never joined nor emitted, and counted as dropped
    assert all(r[1] != "x" for r in rows)
    assert sum(op["numRowsDroppedByWatermark"] for p in got.progress for op in p["stateOperators"]) == 1
    first_batch = {r[2]: r[0] for r in rows if r[2] is not None}
    if how in ("left", "full"):
        # left b@12 waits until the watermark passes 12 + 10 s (rows of the right side to come
        # are later than the watermark): emitted by the batch whose watermark is 25 s
        b = next(r for r in rows if r[2] == 2)
        wm = _watermark_of(got, b[0])
        assert wm >= at(22) and _watermark_of(got, b[0] - 1) < at(22) if b[0] > 0 else True
    if how in ("right", "full"):
        b = next(r for r in rows if r[4] == 20)  # right b@40: emitted once the watermark passes 40
        assert _watermark_of(got, b[0]) >= at(40)
    assert first_batch.get(1, 0) == 0  # a@10 matched a@15 in the first batch


def _watermark_of(got: Run, batch: int) -> dt.datetime:
    p = next(p for p in got.progress if p["batchId"] == batch)
    return dt.datetime.fromisoformat(p["eventTime"]["watermark"].replace("Z", "+00:00"))


def test_state_is_evicted_by_the_watermark_and_reported_like_spark(tmp_path: Path) -> None:
    s = Streams()
    got = run(s.left.join(s.right, RANGE, how="inner"), s, BATCHES, tmp_path / "chk")
    ops = [p["stateOperators"][0] for p in got.progress]
    assert {op["operatorName"] for op in ops} == {"symmetricHashJoin"}
    assert ops[0]["numRowsUpdated"] == 3 and ops[0]["numRowsTotal"] == 3
    # the last batches hold only the rows the watermark has not passed
    assert ops[-1]["numRowsTotal"] < sum(len(lr) + len(rr) for lr, rr in BATCHES)
    assert sum(op["numRowsRemoved"] for op in ops) > 0
    assert all(
        k in ops[0]
        for k in ("numRowsTotal", "numRowsUpdated", "numRowsDroppedByWatermark", "memoryUsedBytes")
    )


def test_a_join_on_key_columns_outputs_each_key_once(tmp_path: Path) -> None:
    s = Streams()
    left = s.left.with_column_renamed("lk", "k")
    right = s.right.with_column_renamed("rk", "k")
    got = Run()
    q = (left.join(right, ["k"], how="inner").write_stream.foreach_batch(lambda t, b: got.out.__setitem__(b, t))
         .option("checkpointLocation", str(tmp_path / "chk")).start())  # fmt: skip
    s.add([("a", 10, 1)], [("a", 11, 2), ("b", 11, 3)])
    q.process_all_available(60)
    q.stop()
    table = pa.concat_tables(got.out.values())
    assert table.column_names == ["k", "lts", "lv", "rts", "rv"]
    assert table.to_pylist() == [{"k": "a", "lts": at(10), "lv": 1, "rts": at(11), "rv": 2}]


def test_restart_continues_from_the_state(backend: str, tmp_path: Path) -> None:
    # a snapshot after every batch: the restart restores from one
    s = Streams()
    frame = s.left.join(s.right, RANGE, how="full")
    first = run(frame, s, BATCHES[:2], tmp_path / "chk", backend, stateSnapshotInterval=1)
    second = run(frame, s, BATCHES[2:], tmp_path / "chk", backend, stateSnapshotInterval=1)
    values = sorted([(r[2], r[4]) for r in first.rows() + second.rows()], key=repr)
    assert values == sorted(EXPECTED["full"], key=repr)


def test_a_replayed_batch_gives_the_same_rows(backend: str, tmp_path: Path) -> None:
    # run everything, then remove the last commit marker: the restart replays that batch from
    # state version n-1 and must produce the same rows
    s = Streams()
    frame = s.left.join(s.right, RANGE, how="left")
    got = run(frame, s, BATCHES, tmp_path / "chk", backend)
    last = max(got.out)
    (tmp_path / "chk" / "commits" / str(last)).unlink()
    again = Run()
    run(frame, s, [], tmp_path / "chk", backend, again)
    assert last in again.out
    assert again.out[last].to_pylist() == got.out[last].to_pylist()


def test_a_changed_join_is_refused_at_restart(tmp_path: Path) -> None:
    s = Streams()
    run(s.left.join(s.right, RANGE, how="inner"), s, BATCHES[:1], tmp_path / "chk")
    with pytest.raises(CheckpointError, match="joinType"):
        run(s.left.join(s.right, RANGE, how="left"), s, [], tmp_path / "chk")


# ------------------------------------------------------------------------------------ refusals


@pytest.mark.parametrize(
    ("how", "on", "watermark", "error"),
    [
        pytest.param("inner", "l.lv < r.rv", (True, True), "without equality predicate", id="no-equality"),
        pytest.param("left", "l.lk = r.rk", (True, True), "LeftOuter join .* without a watermark", id="left-no-range"),
        pytest.param("left", RANGE, (True, False), "LeftOuter join", id="left-no-right-watermark"),
        pytest.param("right", "l.lk = r.rk AND l.lts >= r.rts - INTERVAL 1 HOUR", (True, True), "RightOuter join",
                     id="right-bounded-on-the-left-only"),
        pytest.param("left_semi", "l.lk = r.rk", (False, False), "LeftSemi join", id="semi-no-watermark"),
        pytest.param("full", "l.lk = r.rk", (True, True), "FullOuter join", id="full-no-range"),
        pytest.param("left_anti", RANGE, (True, True), "not supported", id="anti"),
        pytest.param("cross", RANGE, (True, True), "not supported", id="cross"),
    ],
)  # fmt: skip
def test_spark_refusals_at_definition(how: str, on: str, watermark: tuple[bool, bool], error: str) -> None:
    s = Streams(watermark=watermark)
    with pytest.raises(UnsupportedError, match=error):
        s.left.join(s.right, on, how=how)


def test_the_refused_outer_joins_are_those_spark_accepts_otherwise() -> None:
    # Spark accepts a full outer join bounded on one side, and a left outer join whose left
    # side has no watermark (its rows then wait for ever)
    s = Streams()
    s.left.join(s.right, "l.lk = r.rk AND l.lts >= r.rts - INTERVAL 1 HOUR", how="full")
    Streams(watermark=(False, True)).left.join(Streams(watermark=(False, True)).right, RANGE, how="left")


def test_update_mode_is_refused(tmp_path: Path) -> None:
    s = Streams()
    writer = s.left.join(s.right, RANGE).write_stream.foreach_batch(lambda t, b: None).output_mode("update")
    with pytest.raises(UnsupportedError, match="only in Append output mode"):
        writer.option("checkpointLocation", str(tmp_path / "chk")).start()


def test_real_time_mode_is_refused_with_the_references_reason(tmp_path: Path) -> None:
    s = Streams()
    writer = (
        s.left.join(s.right, RANGE).write_stream.format("memory").query_name(f"rt-{uuid.uuid4().hex[:6]}")
    )
    with pytest.raises(UnsupportedError, match="stream-stream joins are not supported in real-time mode"):
        writer.option("checkpointLocation", str(tmp_path / "chk")).trigger(real_time="5 seconds").start()


def test_columns_on_both_sides_must_be_renamed() -> None:
    s = Streams()
    right = s.right.with_column_renamed("rv", "lv")
    with pytest.raises(ExpressionError, match=r"both sides have column\(s\) \['lv'\]"):
        s.left.join(right, RANGE)


def test_an_unknown_qualifier_names_the_aliases() -> None:
    s = Streams()
    with pytest.raises(ExpressionError, match="names neither side"):
        s.left.join(s.right, "x.lk = r.rk")


def test_a_stateful_step_on_a_side_is_refused() -> None:
    s = Streams()
    with pytest.raises(UnsupportedError, match="stateful step"):
        s.left.drop_duplicates("lk").join(s.right, RANGE)


def test_an_unknown_join_type_names_the_choices() -> None:
    s = Streams()
    with pytest.raises(HeadraceError, match="inner, left, right, full, left_semi"):
        s.left.join(s.right, RANGE, how="sideways")


# ------------------------------------------------------------------------------------ watermarks


def test_the_watermark_waits_for_both_sides_with_the_min_policy(tmp_path: Path) -> None:
    s = Streams()
    got = run(s.left.join(s.right, RANGE), s, [([("a", 100, 1)], [])], tmp_path / "chk")
    # the right side has seen no row: its watermark counts as 0, and so is the query's (Spark)
    assert all(p["eventTime"]["watermark"] == "1970-01-01T00:00:00.000Z" for p in got.progress)


def test_a_bad_watermark_policy_is_an_options_error(tmp_path: Path) -> None:
    s = Streams()
    writer = s.left.join(s.right, RANGE).write_stream.foreach_batch(lambda t, b: None)
    with pytest.raises(OptionsError, match="multipleWatermarkPolicy"):
        writer.option("checkpointLocation", str(tmp_path / "c")).option(
            "multipleWatermarkPolicy", "median"
        ).start()


# ------------------------------------------------------------------------------------ many rows per key


def _random_batches(seed: int) -> list[tuple[list[tuple[str, int, int]], list[tuple[str, int, int]]]]:
    """12 batches of 30 rows a side over 4 keys, each batch 10 s later (never late for a 5 s
    delay), so keys hold many rows and the watermark evicts some of a key's rows, not all."""
    import random

    rnd = random.Random(seed)
    out = []
    for b in range(12):
        out.append(([(f"k{rnd.randrange(4)}", b * 10 + rnd.randrange(10), 1000 * b + i) for i in range(30)],
                    [(f"k{rnd.randrange(4)}", b * 10 + rnd.randrange(10), 1000 * b + i) for i in range(30)]))  # fmt: skip
    return out


@pytest.mark.parametrize("keys", ["string", "bigint"])
@pytest.mark.parametrize("how", ["inner", "left"])
def test_many_rows_per_key_join_like_a_join_of_everything(
    how: str, keys: str, backend: str, tmp_path: Path
) -> None:
    cond = "l.lk = r.rk AND l.lts BETWEEN r.rts - INTERVAL 15 SECONDS AND r.rts + INTERVAL 3 SECONDS"
    batches = _random_batches(7)
    s = Streams()
    left, right = s.left, s.right
    if keys == "bigint":  # the integer keys' path (numpy's unique instead of a group-by)
        left = left.with_column("lk", "CAST(substr(lk, 2) AS BIGINT)").alias("l")
        right = right.with_column("rk", "CAST(substr(rk, 2) AS BIGINT)").alias("r")
    got = run(left.join(right, cond, how=how), s, batches, tmp_path / "chk", backend)
    lefts = [r for lr, _ in batches for r in lr]
    rights = [r for _, rr in batches for r in rr]
    want: list[tuple[int, int | None]] = [
        (lv, rv) for lk, lt, lv in lefts for rk, rt, rv in rights if lk == rk and rt - 15 <= lt <= rt + 3]
    if how == "left":
        last = max(t for _, t, _ in lefts + rights)
        wm = last - 5  # the final watermark; a left row leaves the state at wm - 15 s - 1 ms
        matched = {lv for lv, _ in want}
        want += [(lv, None) for _, lt, lv in lefts if lv not in matched and lt * 1000 <= (wm - 15) * 1000 - 1]
    assert sorted(((r[2], r[4]) for r in got.rows()), key=repr) == sorted(want, key=repr)
    removed = sum(op["numRowsRemoved"] for p in got.progress for op in p["stateOperators"])
    assert removed > 0


def test_a_full_outer_join_matches_null_keys_as_spark_does(backend: str, tmp_path: Path) -> None:
    # Spark's symmetric hash join compares keys' bytes and infers no IS NOT NULL filter for a
    # full outer join, so a NULL key matches a NULL key there (inner, left, right and semi
    # joins filter NULL keys out first); tests/conformance's ss-join-full case shows it
    s = Streams()
    left_rows = [{"lk": None, "lts": at(10), "lv": 1}, {"lk": "a", "lts": at(10), "lv": 2}]
    right_rows = [{"rk": None, "rts": at(12), "rv": 10}]
    s.left_stream.add(left_rows)
    s.right_stream.add(right_rows)
    got = run(s.left.join(s.right, RANGE, how="full"), s, [([("z", 100, 3)], [("y", 100, 20)])], tmp_path / "chk",
              backend)  # fmt: skip
    assert (1, 10) in got.values()
    inner = Streams()
    inner.left_stream.add(left_rows)
    inner.right_stream.add(right_rows)
    assert run(inner.left.join(inner.right, RANGE), inner, [], tmp_path / "chk2", backend).values() == []


# ------------------------------------------------------------------------------------ cost per batch


def _work_of_small_batch(state_rows: int, backend: str, path: Path) -> dict[str, int]:
    """The stores' work for a batch of 10 rows a side, with ``state_rows`` rows a side in state."""
    import numpy as np

    from headrace.transforms.operator import BatchInfo, OperatorContext
    from headrace.transforms.stream_join import StreamStreamJoinOperator
    from headrace.transforms.watermark import WatermarkOperator

    ls = pa.schema([("lk", pa.int64()), ("lts", TS)])
    rs = pa.schema([("rk", pa.int64()), ("rts", TS)])
    op = StreamStreamJoinOperator([WatermarkOperator("lts", "1 minute")], [WatermarkOperator("rts", "1 minute")], 1,
                                  "l.lk = r.rk AND l.lts BETWEEN r.rts - INTERVAL 10 MINUTES AND r.rts", "inner",
                                  aliases=("l", "r"))  # fmt: skip
    op.bind_sources([ls, rs])
    op.output_schema(ls)
    op.open(
        OperatorContext(
            index=0, state_path=str(path), state_backend=backend, options={"checkpointFsync": False}
        )
    )
    ts0 = int(at(0).timestamp()) * 1_000_000

    def batch(b: int, keys: np.ndarray) -> None:
        info = BatchInfo(b, watermark_ms=0, late_watermark_ms=0)
        op.begin(info)
        ts = pa.array(np.full(len(keys), ts0, np.int64)).cast(TS)
        op.process(pa.table({"lk": keys, "lts": ts}, schema=ls).replace_schema_metadata({b"headrace.input_side": b"0"}),
                   info)  # fmt: skip
        op.process(pa.table({"rk": keys + 10**9, "rts": ts}, schema=rs).replace_schema_metadata(
            {b"headrace.input_side": b"1"}), info)  # fmt: skip
        op.finish(info)
        w = op.state_write()
        if w is not None:
            w.result()

    try:
        batch(0, np.arange(state_rows, dtype=np.int64))
        before = [s.work.copy() for s in op._stores()]
        batch(1, np.arange(10, dtype=np.int64) * 7)
        total: dict[str, int] = {}
        for s, b in zip(op._stores(), before, strict=True):
            for k, v in s.work.minus(b).items():
                total[k] = total.get(k, 0) + v
        return total
    finally:
        op.close()


def test_a_batch_costs_the_same_whatever_the_state_size(backend: str, tmp_path: Path) -> None:
    small = _work_of_small_batch(1_000, backend, tmp_path / "small")
    large = _work_of_small_batch(20_000, backend, tmp_path / "large")
    for key in ("rows_looked_up", "rows_written", "rows_scanned", "changelog_rows"):
        assert large[key] == small[key], (key, small, large)


def test_an_aggregation_after_a_join_runs_with_the_query_watermark(tmp_path: Path) -> None:
    # a difference from Spark (docs/transforms.md): Spark gives an operator after a stream-stream
    # join the join's output watermark (lower by the join's time bound); headrace runs it with the
    # query's watermark, so a window closes as soon as the watermark passes its end
    s = Streams()
    frame = s.left.join(s.right, RANGE).group_by(hr.window("lts", "10 seconds")).agg("count(*) AS n")
    got = run(
        frame, s, [([("a", 10, 1)], [("a", 15, 10)]), ([("z", 40, 2)], [("y", 40, 20)])], tmp_path / "chk"
    )
    emitted = [(b, r["n"]) for b in sorted(got.out) for r in got.out[b].to_pylist()]
    # [10, 20) closes in the first batch whose watermark (35 s) passes 20 s
    assert [n for _, n in emitted] == [1]
    assert _watermark_of(got, emitted[0][0]) == at(35)
