"""transform_with_state three ways, batch by batch, over the conformance generator's parquet
micro-batches: PySpark 4's transformWithStateInPandas with a pyspark processor (RocksDB state
store), headrace with the headrace processor, and that same headrace definition translated
onto Spark (``start(..., engine=spark)``: the headrace processor inside
``headrace.spark.stateful.SparkStatefulProcessor``). The processor logic is written once per
API; the rows of every batch (and the batch ids run) are compared.

Cases: value, list and map state with no time mode (update mode); an initial state from a
static frame; event-time timers after a watermark (append mode). Spark's ``stateOperators``
metrics are not compared: Spark keeps one state row per variable, list element and timer in
several column families, headrace one row per key and variable.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import headrace as hr
from tests.conformance.conftest import selected_cases
from tests.conformance.generator import DDL, DELAY_S, generate
from tests.conformance.harness import _unmatched, rows_of, write_input

pytest.importorskip("pandas")
# the module's fixture runs every selected case on Spark twice (direct, translated): minutes
# under load, counted towards the first test's timeout
pytestmark = pytest.mark.timeout(2400)

SEED = 3
BATCHES = 5  # Spark takes seconds per TWS batch: a few batches keep the module near 2 minutes
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
TIMER_MS = 3_000  # a key's timer: its latest event time plus this

# ------------------------------------------------------------------------------ headrace side


def _ms(col: Any) -> list[int | None]:
    return pc.divide(pc.cast(col, pa.int64()), 1000).to_pylist()  # type: ignore[no-any-return]


class HrAllState(hr.StatefulProcessor):
    """Per key: rows seen (value), ids seen (list), the sum of n per parity of id (map)."""

    def init(self, handle: hr.StatefulProcessorHandle) -> None:
        self.count = handle.get_value_state("count", "c BIGINT")
        self.ids = handle.get_list_state("ids", "id BIGINT")
        self.sums = handle.get_map_state("sums", "parity BIGINT", "total BIGINT")

    def handle_input_rows(self, key: tuple[Any, ...], rows: pa.Table, tv: hr.TimerValues) -> Iterator[Any]:
        c = (self.count.get() or (0,))[0] + rows.num_rows
        self.count.update((c,))
        ids = [i for i in rows.column("id").to_pylist() if i is not None]
        if ids:
            self.ids.append_list([(i,) for i in ids])
        for i, n in zip(rows.column("id").to_pylist(), rows.column("n").to_pylist(), strict=True):
            if i is not None and n is not None:
                p = (i % 2,)
                self.sums.update_value(p, ((self.sums.get_value(p) or (0,))[0] + n,))
        total = sum(v for (v,) in self.sums.values())
        yield (key[0], c, len(list(self.ids.get())), total, self.sums.contains_key((0,)))

    def handle_initial_state(self, key: tuple[Any, ...], initial_state: pa.Table, tv: hr.TimerValues) -> None:
        self.count.update((sum(w or 0 for w in initial_state.column("weight").to_pylist()),))


class HrTimers(hr.StatefulProcessor):
    """Per key: rows since the last timer and the latest event time; a timer TIMER_MS after
    it; on input one row (k, count, -1), on a timer one row (k, count, timer) and a reset."""

    def init(self, handle: hr.StatefulProcessorHandle) -> None:
        self.state = handle.get_value_state("state", "c BIGINT, last BIGINT")

    def handle_input_rows(self, key: tuple[Any, ...], rows: pa.Table, tv: hr.TimerValues) -> Iterator[Any]:
        c, last = self.state.get() or (0, None)
        ts = [t for t in _ms(rows.column("ts")) if t is not None]
        new_last = max([*ts, *([last] if last is not None else [])]) if ts or last is not None else None
        if new_last is not None and new_last != last:
            if last is not None:
                self.handle.delete_timer(last + TIMER_MS)
            self.handle.register_timer(new_last + TIMER_MS)
        self.state.update((c + rows.num_rows, new_last))
        yield (key[0], c + rows.num_rows, -1)

    def handle_expired_timer(self, key: tuple[Any, ...], tv: hr.TimerValues, info: hr.ExpiredTimerInfo
                             ) -> Iterator[Any]:  # fmt: skip
        c, _ = self.state.get() or (0, None)
        self.state.clear()
        yield (key[0], c, info.expiry_time_ms)


# ------------------------------------------------------------------------------ Spark side


def _spark_processors() -> dict[str, Any]:
    import pandas as pd
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    class SparkAllState(StatefulProcessor):
        def init(self, handle: Any) -> None:
            self.count = handle.getValueState("count", "c BIGINT")
            self.ids = handle.getListState("ids", "id BIGINT")
            self.sums = handle.getMapState("sums", "parity BIGINT", "total BIGINT")

        def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:
            c = self.count.get()[0] if self.count.exists() else 0
            for pdf in rows:
                c += len(pdf)
                ids = [int(i) for i in pdf["id"].dropna()]
                if ids:
                    self.ids.appendList([(i,) for i in ids])
                for i, n in zip(pdf["id"], pdf["n"], strict=True):
                    if not pd.isna(i) and not pd.isna(n):
                        p = (int(i) % 2,)
                        cur = self.sums.getValue(p)[0] if self.sums.containsKey(p) else 0
                        self.sums.updateValue(p, (cur + int(n),))
            self.count.update((c,))
            total = sum(int(v[0]) for v in self.sums.values())
            n_ids = len(list(self.ids.get())) if self.ids.exists() else 0
            yield pd.DataFrame({"k": [key[0]], "c": [c], "ids": [n_ids], "total": [total],
                                "even": [self.sums.containsKey((0,))]})  # fmt: skip

        def handleInitialState(self, key: Any, initialState: Any, timerValues: Any) -> None:
            self.count.update((int(initialState["weight"].fillna(0).sum()),))

        def close(self) -> None:
            pass

    class SparkTimers(StatefulProcessor):
        def init(self, handle: Any) -> None:
            self.handle = handle
            self.state = handle.getValueState("state", "c BIGINT, last BIGINT")

        def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:
            c, last = self.state.get() if self.state.exists() else (0, None)
            n, ts = 0, []
            for pdf in rows:
                n += len(pdf)
                ts += [pd.Timestamp(t).value // 1_000_000 for t in pdf["ts"].dropna()]
            new_last = max([*ts, *([last] if last is not None else [])]) if ts or last is not None else None
            if new_last is not None and new_last != last:
                if last is not None:
                    self.handle.deleteTimer(last + TIMER_MS)
                self.handle.registerTimer(new_last + TIMER_MS)
            self.state.update((c + n, new_last))
            yield pd.DataFrame({"k": [key[0]], "c": [c + n], "fired": [-1]})

        def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Any:
            c = self.state.get()[0] if self.state.exists() else 0
            self.state.clear()
            yield pd.DataFrame({"k": [key[0]], "c": [c], "fired": [expiredTimerInfo.getExpiryTimeInMs()]})

        def close(self) -> None:
            pass

    return {"all_state": SparkAllState, "timers": SparkTimers}


ALL_OUT = "k STRING, c BIGINT, ids BIGINT, total BIGINT, even BOOLEAN"
TIMER_OUT = "k STRING, c BIGINT, fired BIGINT"
CASES = {
    # name: (headrace processor, output, output mode, time mode, initial state?, watermark?)
    "all-state": (HrAllState, ALL_OUT, "update", "none", False, False),
    "initial-state": (HrAllState, ALL_OUT, "update", "none", True, False),
    "event-time-timers": (HrTimers, TIMER_OUT, "append", "event_time", False, True),
}
_SPARK_TIME = {"none": "None", "event_time": "EventTime"}


class _SparkQuery:
    """One case started on Spark (available-now, each batch collected by id)."""

    def __init__(self, spark: Any, case: str, paths: Any, checkpoint: str) -> None:
        _, out, mode, time_mode, initial, watermark = CASES[case]
        proc = _spark_processors()["timers" if time_mode == "event_time" else "all_state"]
        df = spark.readStream.schema(DDL).option("maxFilesPerTrigger", 1).parquet(paths.main)
        if watermark:
            df = df.withWatermark("ts", f"{DELAY_S} seconds")
        kw: dict[str, Any] = {}
        if initial:
            kw["initialState"] = spark.read.parquet(paths.static).groupBy("k")
        frame = df.groupBy("k").transformWithStateInPandas(proc(), out, mode, _SPARK_TIME[time_mode], **kw)
        self.case = case
        self.got: dict[int, pa.Table] = {}
        self.query = (frame.writeStream.foreachBatch(self._collect).outputMode(mode)
                      .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())  # fmt: skip

    def _collect(self, batch: Any, batch_id: int) -> None:
        self.got[int(batch_id)] = batch.toArrow()

    def result(self) -> dict[int, pa.Table]:
        q = self.query
        try:
            assert q.awaitTermination(600), f"Spark query {self.case} did not finish"
            assert q.exception() is None, f"Spark query {self.case} failed: {q.exception()}"
        finally:
            q.stop()
        return self.got


def _headrace_frame(case: str, paths: Any) -> Any:
    proc, out, mode, time_mode, initial, watermark = CASES[case]
    s = (hr.read_stream.format("cloudFiles").option("cloudFiles.format", "parquet")
         .option("maxFilesPerTrigger", 1).schema(DDL).load(paths.main))  # fmt: skip
    if watermark:
        s = s.with_watermark("ts", f"{DELAY_S} seconds")
    init = pq.read_table(paths.static) if initial else None
    return s.group_by("k").transform_with_state(proc(), out, mode, time_mode, initial_state=init)


def _run_headrace(case: str, paths: Any, checkpoint: str) -> dict[int, pa.Table]:
    mode = CASES[case][2]
    frame = _headrace_frame(case, paths)
    got: dict[int, pa.Table] = {}

    def collect(table: pa.Table, batch_id: int) -> None:
        got[int(batch_id)] = table

    q = (frame.write_stream.foreach_batch(collect).output_mode(mode).option("checkpointLocation", checkpoint)
         .option("stateStore", "rocksdb").trigger(available_now=True).start())  # fmt: skip
    try:
        assert q.await_termination(120), f"headrace query {case} did not finish"
        assert q.exception() is None, f"headrace query {case} failed: {q.exception()}"
    finally:
        q.stop()
    return got


def _differences(spark: dict[int, pa.Table], mine: dict[int, pa.Table]) -> list[str]:
    diffs = []
    nonempty_s = {b for b, t in spark.items() if t.num_rows}
    nonempty_h = {b for b, t in mine.items() if t.num_rows}
    if nonempty_s != nonempty_h:
        diffs.append(f"batches with rows: spark {sorted(nonempty_s)}, headrace {sorted(nonempty_h)}")
    for b in sorted(nonempty_s | nonempty_h):
        s_rows = rows_of(spark[b]) if b in spark else []
        h_rows = rows_of(mine[b]) if b in mine else []
        only_s, only_h = _unmatched(s_rows, h_rows)
        if only_s or only_h:
            diffs.append(f"batch {b}: only on spark {only_s[:6]}, only on headrace {only_h[:6]}")
    return diffs


class _TranslatedQuery(_SparkQuery):
    """One case's headrace definition started on Spark (``start(engine=spark)``)."""

    def __init__(self, spark: Any, case: str, paths: Any, checkpoint: str) -> None:
        self.case = case
        self.got: dict[int, pa.Table] = {}
        self.query = (_headrace_frame(case, paths).write_stream.foreach_batch(self._collect_table)
                      .output_mode(CASES[case][2]).option("checkpointLocation", checkpoint)
                      .trigger(available_now=True).start(engine=spark))  # fmt: skip

    def _collect_table(self, table: pa.Table, batch_id: int) -> None:
        self.got[int(batch_id)] = table


_FLAKY = ("failed to connect back", "CANNOT_OPEN_SOCKET")


def _spark_case(spark: Any, case: str, paths: Any, folder: Path, attempts: int = 3, *,
                translated: bool = False) -> dict[int, pa.Table]:  # fmt: skip
    """Run one case on Spark (the pyspark processor, or with ``translated`` the headrace
    definition started on Spark); again from a new checkpoint (up to ``attempts`` times) when
    its Python worker missed the deadline to connect to Spark, which a loaded machine causes."""
    cls, name = (_TranslatedQuery, "translated") if translated else (_SparkQuery, "spark")
    for attempt in range(attempts):
        try:
            return cls(spark, case, paths, str(folder / f"{name}-{case}-{attempt}")).result()
        except Exception as e:  # awaitTermination raises the query's StreamingQueryException
            if attempt == attempts - 1 or not any(f in str(e) for f in _FLAKY):
                raise
    raise AssertionError("unreachable")


@pytest.fixture(scope="module")
def spark_results(conformance_spark: Any, request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    """The selected cases over the seed's input on Spark (direct and translated), then on
    headrace; {case: (spark batches, headrace batches, translated batches)}."""
    import headrace.spark

    headrace.spark.register(conformance_spark, "cloudFiles")
    conformance_spark.conf.set("spark.sql.streaming.stateStore.providerClass", ROCKSDB)
    cases = [c for c in CASES if c in selected_cases(request)]
    data = generate(SEED, batches=BATCHES)
    with tempfile.TemporaryDirectory(prefix="tws-conf-") as d:
        paths = write_input(data, d)
        try:
            # one at a time: started together on a loaded machine, Spark's Python workers missed
            # their deadline to connect back ("Python worker failed to connect back")
            spark = {c: _spark_case(conformance_spark, c, paths, Path(d)) for c in cases}
            translated = {
                c: _spark_case(conformance_spark, c, paths, Path(d), translated=True) for c in cases
            }
        finally:
            conformance_spark.conf.unset("spark.sql.streaming.stateStore.providerClass")
        mine = {c: _run_headrace(c, paths, str(Path(d) / f"headrace-{c}")) for c in cases}
        yield {"data": data, **{c: (spark[c], mine[c], translated[c]) for c in cases}}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_transform_with_state_matches_spark(spark_results: dict[str, Any], case: str) -> None:
    spark, mine, _ = spark_results[case]
    assert any(t.num_rows for t in spark.values()), "Spark emitted nothing: the case tests nothing"
    diffs = _differences(spark, mine)
    assert not diffs, f"{case} ({spark_results['data'].describe()}):\n" + "\n".join(diffs)


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_translated_same_as_direct_pyspark(spark_results: dict[str, Any], case: str) -> None:
    """The headrace processor run by Spark (the translation) emits what the pyspark one does."""
    spark, _, translated = spark_results[case]
    diffs = _differences(spark, translated)
    assert not diffs, ("the translated query ('headrace' below) differs from the direct PySpark query:\n"
                       f"{case} ({spark_results['data'].describe()}):\n" + "\n".join(diffs))  # fmt: skip
