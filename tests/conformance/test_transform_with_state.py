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
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

import headrace as hr
from tests.conformance.conftest import selected_cases
from tests.conformance.generator import DDL, DELAY_S, generate
from tests.conformance.harness import _unmatched, rows_of, write_input

pytest.importorskip("pandas")

# every selected case runs on Spark in the module fixture, twice (direct, translated; seconds
# to minutes per query on a loaded machine, retried when Spark's Python worker misses its
# connect-back): it counts towards the first test's timeout
pytestmark = pytest.mark.timeout(3000)

SEED = 3
BATCHES = 5  # Spark takes seconds per TWS batch: a few batches keep the module near 2 minutes
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
TIMER_MS = 3_000  # a key's timer: its latest event time plus this

# ------------------------------------------------------------------------------ headrace side


def _ms(col: Any) -> list[int | None]:
    return pc.divide(pc.cast(col, pa.int64()), 1000).to_pylist()


class HrAllState(hr.StatefulProcessor):
    """Per key: rows seen (value), ids seen (list), the sum of n per parity of id (map); with
    ``ttl_ms``, each of them expires that long after its update."""

    def __init__(self, ttl_ms: int | None = None) -> None:
        self.ttl_ms = ttl_ms

    def init(self, handle: hr.StatefulProcessorHandle) -> None:
        self.count = handle.get_value_state("count", "c BIGINT", ttl=self.ttl_ms)
        self.ids = handle.get_list_state("ids", "id BIGINT", ttl=self.ttl_ms)
        self.sums = handle.get_map_state("sums", "parity BIGINT", "total BIGINT", ttl=self.ttl_ms)

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
        def __init__(self, ttl_ms: int | None = None) -> None:
            self.ttl_ms = ttl_ms

        def init(self, handle: Any) -> None:
            self.count = handle.getValueState("count", "c BIGINT", self.ttl_ms)
            self.ids = handle.getListState("ids", "id BIGINT", self.ttl_ms)
            self.sums = handle.getMapState("sums", "parity BIGINT", "total BIGINT", self.ttl_ms)

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
TTL_MS = 1  # a value lives within the batch that wrote it: expired by the next batch's time
CASES = {
    # name: (headrace processor, output, output mode, time mode, initial state?, watermark?, TTL)
    "all-state": (HrAllState, ALL_OUT, "update", "none", False, False, None),
    "initial-state": (HrAllState, ALL_OUT, "update", "none", True, False, None),
    "ttl-expiry": (HrAllState, ALL_OUT, "update", "processing_time", False, False, TTL_MS),
    "event-time-timers": (HrTimers, TIMER_OUT, "append", "event_time", False, True, None),
}
_SPARK_TIME = {"none": "None", "processing_time": "ProcessingTime", "event_time": "EventTime"}


class _SparkQuery:
    """One case started on Spark, each batch collected by id: available-now, or in processing
    time mode (where Spark runs a batch without data after every batch, so an available-now
    query never ends) a processing-time trigger stopped once the last file's batch is done."""

    def __init__(self, spark: Any, case: str, paths: Any, checkpoint: str, files: int) -> None:
        hr_proc, out, mode, time_mode, initial, watermark, ttl = CASES[case]
        proc = _spark_processors()["all_state" if hr_proc is HrAllState else "timers"]
        df = spark.readStream.schema(DDL).option("maxFilesPerTrigger", 1).parquet(paths.main)
        if watermark:
            df = df.withWatermark("ts", f"{DELAY_S} seconds")
        kw: dict[str, Any] = {}
        if initial:
            kw["initialState"] = spark.read.parquet(paths.static).groupBy("k")
        processor = proc(ttl) if ttl is not None else proc()
        frame = df.groupBy("k").transformWithStateInPandas(processor, out, mode, _SPARK_TIME[time_mode], **kw)
        self.case = case
        self.files = files
        self.endless = time_mode == "processing_time"
        self.got: dict[int, pa.Table] = {}
        writer = (
            frame.writeStream.foreachBatch(self._collect)
            .outputMode(mode)
            .option("checkpointLocation", checkpoint)
        )
        trigger = {"processingTime": "0 seconds"} if self.endless else {"availableNow": True}
        self.query = writer.trigger(**trigger).start()

    def _collect(self, batch: Any, batch_id: int) -> None:
        self.got[int(batch_id)] = batch.toArrow()

    def _input_done(self) -> bool:
        """Every file's batch has run: batches 0 to ``files - 1`` each read one file (a batch
        without data runs only once none is left)."""
        return any(p["batchId"] >= self.files - 1 for p in self.query.recentProgress)

    def result(self) -> dict[int, pa.Table]:
        q = self.query
        try:
            if self.endless:
                deadline = time.monotonic() + 600
                while not self._input_done() and q.exception() is None and time.monotonic() < deadline:
                    q.awaitTermination(0.2)
                assert q.exception() is None, f"Spark query {self.case} failed: {q.exception()}"
                assert self._input_done(), f"Spark query {self.case} did not read its input"
            else:
                assert q.awaitTermination(600), f"Spark query {self.case} did not finish"
                assert q.exception() is None, f"Spark query {self.case} failed: {q.exception()}"
        finally:
            q.stop()
        return self.got


def _headrace_frame(case: str, paths: Any, data: Any) -> Any:
    proc, out, mode, time_mode, initial, watermark, ttl = CASES[case]
    s = (hr.read_stream.format("cloudFiles").option("cloudFiles.format", "parquet")
         .option("maxFilesPerTrigger", 1).schema(DDL).load(paths.main))  # fmt: skip
    if watermark:
        s = s.with_watermark("ts", f"{DELAY_S} seconds")
    init = data.static if initial else None
    processor = proc(ttl) if ttl is not None else proc()
    return s.group_by("k").transform_with_state(processor, out, mode, time_mode, initial_state=init)


def _run_headrace(case: str, paths: Any, data: Any, checkpoint: str) -> dict[int, pa.Table]:
    mode = CASES[case][2]
    frame = _headrace_frame(case, paths, data)
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

    def __init__(self, spark: Any, case: str, paths: Any, checkpoint: str, files: int, data: Any) -> None:
        self.case = case
        self.got: dict[int, pa.Table] = {}
        self.files = files
        self.endless = False
        self.query = (_headrace_frame(case, paths, data).write_stream.foreach_batch(self._collect_table)
                      .output_mode(CASES[case][2]).option("checkpointLocation", checkpoint)
                      .trigger(available_now=True).start(engine=spark))  # fmt: skip

    def _collect_table(self, table: pa.Table, batch_id: int) -> None:
        self.got[int(batch_id)] = table


_FLAKY = ("failed to connect back", "CANNOT_OPEN_SOCKET")


def _spark_case(spark: Any, case: str, paths: Any, folder: Path, attempts: int = 8, *,
                translated: Any = None) -> dict[int, pa.Table]:  # fmt: skip
    """Run one case on Spark (the pyspark processor, or with ``translated`` (the generated
    data) the headrace definition started on Spark); again from a new checkpoint (up to
    ``attempts`` times) when its Python worker missed the deadline to connect to Spark: Spark
    waits a fixed 10 s for the driver-side runner that calls the processor's ``init``
    (``StreamingPythonRunner``, not configurable), which a loaded machine can miss."""
    for attempt in range(attempts):
        try:
            if translated is not None:
                where = str(folder / f"translated-{case}-{attempt}")
                return _TranslatedQuery(spark, case, paths, where, BATCHES, translated).result()
            return _SparkQuery(spark, case, paths, str(folder / f"spark-{case}-{attempt}"), BATCHES).result()
        except Exception as e:  # awaitTermination raises the query's StreamingQueryException
            if attempt == attempts - 1 or not any(f in str(e) for f in _FLAKY):
                raise
    raise AssertionError("unreachable")


@pytest.fixture(scope="module")
def spark_results(conformance_spark: Any, request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    """The selected cases over the seed's input on Spark (direct and, but for TTL cases,
    translated), then on headrace; {case: (spark batches, headrace batches, translated batches
    or None)}. TTL needs processing-time mode on Spark, where an available-now query never
    ends (docs/spark.md): a translated TTL case is not run."""
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
                c: _spark_case(conformance_spark, c, paths, Path(d), translated=data)
                for c in cases if CASES[c][6] is None
            }  # fmt: skip
        finally:
            conformance_spark.conf.unset("spark.sql.streaming.stateStore.providerClass")
        mine = {c: _run_headrace(c, paths, data, str(Path(d) / f"headrace-{c}")) for c in cases}
        yield {"data": data, **{c: (spark[c], mine[c], translated.get(c)) for c in cases}}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_transform_with_state_matches_spark(spark_results: dict[str, Any], case: str) -> None:
    spark, mine, _ = spark_results[case]
    assert any(t.num_rows for t in spark.values()), "Spark emitted nothing: the case tests nothing"
    diffs = _differences(spark, mine)
    assert not diffs, f"{case} ({spark_results['data'].describe()}):\n" + "\n".join(diffs)


@pytest.mark.slow
@pytest.mark.parametrize("case", [c for c, spec in CASES.items() if spec[6] is None])
def test_translated_same_as_direct_pyspark(spark_results: dict[str, Any], case: str) -> None:
    """The headrace processor run by Spark (the translation) emits what the pyspark one does."""
    spark, _, translated = spark_results[case]
    diffs = _differences(spark, translated)
    assert not diffs, ("the translated query ('headrace' below) differs from the direct PySpark query:\n"
                       f"{case} ({spark_results['data'].describe()}):\n" + "\n".join(diffs))  # fmt: skip
