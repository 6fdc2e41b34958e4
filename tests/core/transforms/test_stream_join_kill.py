"""Two rate-micro-batch streams -> a stream-stream left outer join -> Delta, SIGKILLed at every
engine crash point and at random moments, for both state stores: every joined pair and every
unmatched left row the final watermark evicts is in the table exactly once."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import headrace as hr
from headrace.testing import CRASH_POINTS, run_until_done

deltalake = pytest.importorskip("deltalake")

PER_BATCH = 20
BATCHES = 24
START_MS = 1_700_000_000_000
ADVANCE_MS = 1_000  # each batch's rows are one second later
DELAY_S = 2
BOUND_S = 2  # a left row matches right rows up to 2 s later
KEYS = 10


def _rate(**extra: Any) -> dict[str, Any]:
    return {"rowsPerBatch": PER_BATCH, "totalRows": PER_BATCH * BATCHES, "numPartitions": 2,
            "startTimestamp": START_MS, "advanceMillisPerBatch": ADVANCE_MS, **extra}  # fmt: skip


def left_outer_join(stream: Any) -> Any:
    """The pipeline's plan (loaded by the subprocess runner): the spec's stream on the left; on
    the right a second rate stream keeping every fourth row (so the odd keys never match)."""
    left = (stream.select_expr("value AS lv", f"value % {KEYS} AS lk", "timestamp AS lts")
            .with_watermark("lts", f"{DELAY_S} seconds").alias("l"))  # fmt: skip
    right = (hr.read_stream.format("rate-micro-batch").options(**_rate()).load()
             .where("value % 4 = 0")
             .select_expr("value AS rv", f"value % {KEYS} AS rk", "timestamp AS rts")
             .with_watermark("rts", f"{DELAY_S} seconds").alias("r"))  # fmt: skip
    return left.join(
        right, f"l.lk = r.rk AND l.lts BETWEEN r.rts - INTERVAL {BOUND_S} SECONDS AND r.rts", how="left"
    )


def expected() -> Counter[tuple[int, int | None]]:
    """(lv, rv) of every output row: the pairs, and the unmatched left rows the final watermark
    evicts (a left row waits until the watermark passes its time + the bound)."""

    def sec(i: int) -> int:
        return i // PER_BATCH

    rows = range(PER_BATCH * BATCHES)
    right = [j for j in rows if j % 4 == 0]
    final_wm_ms = sec(PER_BATCH * BATCHES - 1) * ADVANCE_MS - DELAY_S * 1000
    out: Counter[tuple[int, int | None]] = Counter()
    for i in rows:
        hits = [j for j in right if j % KEYS == i % KEYS and sec(j) - BOUND_S <= sec(i) <= sec(j)]
        for j in hits:
            out[(i, j)] += 1
        # Spark's state watermark for the left side: wm - bound - 1 ms (BETWEEN is inclusive)
        if not hits and sec(i) * ADVANCE_MS <= final_wm_ms - BOUND_S * 1000 - 1:
            out[(i, None)] += 1
    return out


@pytest.mark.slow
@pytest.mark.timeout(1500)  # a dozen subprocess runs, each importing headrace: minutes on a loaded machine
@pytest.mark.parametrize("backend", ["memory", "rocksdb"])
def test_left_outer_join_to_delta_exactly_once_across_kills(tmp_path: Path, backend: str) -> None:
    out = str(tmp_path / "out")
    spec = {
        "source": {"format": "rate-micro-batch", "options": _rate()},
        "frame": f"{__name__}:left_outer_join",
        "sink": {"format": "delta", "options": {"path": out, "stateStore": backend}},
        "checkpoint": str(tmp_path / "chk"),
        "name": "join-kill",
        "output_mode": "append",
        "trigger": {"available_now": True},
    }  # fmt: skip
    # each run resumes and dies at the next crash point, a few batches further on each time
    crashes = ["before_offsets:0", *(f"{p}:{3 * i + 2}" for i, p in enumerate(CRASH_POINTS))]
    results = run_until_done(
        spec, crashes=crashes, random_kills=2, kill_window=(1.0, 2.5), seed=17, timeout=300
    )
    killed = sum(r.killed for r in results[: len(crashes)])
    assert killed == len(crashes), [r.stderr[-800:] for r in results if not r.killed]
    rows = deltalake.DeltaTable(out).to_pyarrow_table().to_pylist()
    got = Counter((r["lv"], r["rv"]) for r in rows)
    twice = [k for k, n in got.items() if n > 1]
    assert not twice, f"rows written more than once: {twice[:5]}"
    want = expected()
    assert sum(1 for _, rv in want if rv is None) > 0  # the test covers unmatched rows
    assert got == want
