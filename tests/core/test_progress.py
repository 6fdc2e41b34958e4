"""Progress reports: the rates are Spark's (StreamingQueryProgress)."""

from __future__ import annotations

import pytest

import headrace as hr


def _build(started: float, previous: float | None, rows: int, seconds: float) -> hr.QueryProgress:
    return hr.QueryProgress.build(
        id="i", run_id="r", name="n", batch_id=0, started=started, durations={"triggerExecution": seconds},
        previous_trigger=previous, sources=[("s", {}, {}, {}, rows, {})], sink=("k", rows, {}),
    )  # fmt: skip


def test_input_rate_is_rows_over_the_time_since_the_previous_trigger_start() -> None:
    p = _build(started=100.5, previous=100.0, rows=2000, seconds=0.002)
    assert p.input_rows_per_second == pytest.approx(4000.0)  # 2,000 rows / 0.5 s between trigger starts
    assert p.processed_rows_per_second == pytest.approx(1_000_000.0)  # 2,000 rows / the 2 ms batch
    assert p.sources[0].input_rows_per_second == pytest.approx(4000.0)
    assert p.sources[0].processed_rows_per_second == pytest.approx(1_000_000.0)


def test_a_runs_first_batch_has_no_input_rate_as_in_spark() -> None:
    """No previous trigger: Spark reports 0, not the processing rate (a spike of 1M rows/s
    there flattened every later input rate of the dashboard's chart to the bottom)."""
    p = _build(started=100.0, previous=None, rows=2000, seconds=0.002)
    assert p.input_rows_per_second == 0.0 and p.sources[0].input_rows_per_second == 0.0
    assert p.processed_rows_per_second == pytest.approx(1_000_000.0)
    assert p.to_dict()["inputRowsPerSecond"] == 0.0
