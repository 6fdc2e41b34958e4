"""Spark conformance, the third way: every catalogue query's headrace definition translated onto
Spark (``start(..., engine=spark)``) against the same query written directly in PySpark, over
the same micro-batches, compared batch by batch (rows, columns, watermark, input rows).

Together with ``test_conformance.py`` (headrace against the direct PySpark query) this runs each
query three ways. The translated query and the direct one both run on Spark, so no difference
is expected: there are no known-difference marks here. One Spark session (the conformance
module's), queries started four at a time so Spark's per-batch latency overlaps; a case whose
Python worker missed Spark's connect-back under load runs again, fewer at a time.
"""

from __future__ import annotations

import os
import tempfile
import time
from typing import Any

import pyarrow as pa
import pytest

from tests.conformance.catalogue import CATALOGUE, Case
from tests.conformance.conftest import selected_cases
from tests.conformance.generator import generate
from tests.conformance.harness import (
    Outcome,
    QuerySpec,
    Run,
    compare,
    headrace_frame,
    start_spark,
    write_input,
)

SEED = 1
PARALLEL = 4
pytestmark = pytest.mark.timeout(2400)


class _Translated:
    """A catalogue query's headrace definition started on Spark, collecting each batch by id."""

    def __init__(self, spark: Any, spec: QuerySpec, paths: Any, data: Any, checkpoint: str) -> None:
        self.spec = spec
        self.out: dict[int, pa.Table] = {}
        self.started = time.monotonic()
        self.query = (headrace_frame(spec, paths, data).write_stream.foreach_batch(self._collect)
                      .output_mode(spec.mode).option("checkpointLocation", checkpoint)
                      .trigger(available_now=True).start(engine=spark))  # fmt: skip

    def _collect(self, table: pa.Table, batch_id: int) -> None:
        assert isinstance(table, pa.Table), (
            f"foreach_batch on Spark handed {type(table).__name__}, not a Table"
        )
        self.out[int(batch_id)] = table

    def result(self, timeout: float = 300) -> Run:
        q = self.query
        try:
            if not q.awaitTermination(timeout):
                raise AssertionError(f"translated query {self.spec.id} did not finish within {timeout} s")
            if q.exception() is not None:
                raise AssertionError(f"translated query {self.spec.id} failed: {q.exception()}")
            progress = {int(p["batchId"]): p for p in q.recentProgress}
        finally:
            q.stop()
        return Run("translated", self.out, progress, time.monotonic() - self.started)


@pytest.fixture(scope="module")
def outcomes(conformance_spark: Any, request: pytest.FixtureRequest) -> dict[str, Outcome]:
    """The selected catalogue queries, translated and direct, over the fixed seed's input."""
    import headrace.spark

    headrace.spark.register(conformance_spark, "cloudFiles")
    data = generate(SEED)
    tmp = tempfile.mkdtemp(prefix=f"conformance-engine-{SEED}-")
    paths = write_input(data, tmp)
    out: dict[str, Outcome] = {}
    selected = selected_cases(request)
    specs = [c.spec for c in CATALOGUE if c.id in selected]
    # a case whose Python worker missed Spark's fixed 10 s connect-back (many queries starting
    # at once on a loaded machine) runs again, fewer at a time, from new checkpoints
    for attempt, parallel in enumerate((PARALLEL, 2, 1)):
        _run_chunks(conformance_spark, specs, paths, data, os.path.join(tmp, f"try-{attempt}"), parallel, out)
        specs = [s for s in specs if any(_FLAKY in d for d in out[s.id].differences)]
        if not specs:
            break
    return out


_FLAKY = "failed to connect back"


def _run_chunks(spark: Any, specs: list[QuerySpec], paths: Any, data: Any, tmp: str, parallel: int,
                out: dict[str, Outcome]) -> None:  # fmt: skip
    """Run ``specs`` translated and direct, ``parallel`` queries of each kind at a time, and
    put each case's outcome in ``out``."""
    for lo in range(0, len(specs), parallel):
        chunk = specs[lo : lo + parallel]
        started: list[tuple[QuerySpec, Any, Any]] = []
        for spec in chunk:
            try:
                t = _Translated(spark, spec, paths, data, os.path.join(tmp, f"chk-t-{spec.id}"))
            except Exception as e:  # a refusal or an analysis error is the case's failure
                out[spec.id] = Outcome(spec, SEED, [f"translation failed: {type(e).__name__}: {e}"])
                continue
            started.append((spec, t, start_spark(spark, spec, paths, os.path.join(tmp, f"chk-d-{spec.id}"))))
        for spec, t, d in started:
            try:
                translated, direct = t.result(), d.result()
            except Exception as e:
                out[spec.id] = Outcome(spec, SEED, [str(e).splitlines()[0]])
                continue
            out[spec.id] = compare(spec, SEED, direct, translated)


@pytest.mark.parametrize("case", CATALOGUE, ids=[c.id for c in CATALOGUE])
def test_translated_same_as_direct_pyspark(case: Case, outcomes: dict[str, Outcome]) -> None:
    outcome = outcomes[case.id]
    assert outcome.identical, ("the translated query ('headrace' below) differs from the direct PySpark query "
                               f"('spark'):\n{outcome.report(limit=40)}")  # fmt: skip
