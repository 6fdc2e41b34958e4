"""SIGKILL a rate-micro-batch -> files pipeline 20 times at random points, then let it finish:
every row must be in the output exactly once."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import pytest

from headrace.checkpoint import Checkpoint
from headrace.connectors.files import read_files
from headrace.testing import CRASH_POINTS, run_pipeline

# so many batches (4,000) that the runs killed within about a second cannot finish them all
# between them (a quiet 2-core machine commits a 300-row batch every ~3 ms, so ten such runs
# get through about a third): a run that finished would leave later crash points unreachable
TOTAL = 1_200_000
PER_BATCH = 300


@pytest.mark.slow
def test_twenty_kills_at_random_points_lose_and_duplicate_nothing(tmp_path: Path) -> None:
    chk = tmp_path / "chk"
    spec = {
        "source": {"format": "rate-micro-batch",
                   "options": {"rowsPerBatch": PER_BATCH, "totalRows": TOTAL, "numPartitions": 2}},
        "sink": {"format": "files", "options": {"path": str(tmp_path / "out")}},
        "checkpoint": str(chk),
        "name": "kill20",
        "trigger": {"available_now": True},
    }  # fmt: skip
    rng = random.Random(20)
    kills = 0
    for i in range(20):
        done = Checkpoint(str(chk)).committed_ids()[-1] + 1 if (chk / "commits").is_dir() and Checkpoint(
            str(chk)).committed_ids() else 0  # fmt: skip
        if i % 2 == 0:
            point = rng.choice(CRASH_POINTS)
            result = run_pipeline(spec, crash=f"{point}:{done + rng.randint(0, 1)}")
        else:
            result = run_pipeline(spec, kill_after=rng.uniform(0.3, 1.2))
        kills += result.killed
        if not result.killed:
            result.check()
    assert kills >= 15, f"only {kills} of 20 runs were killed: the test is not exercising crashes"
    run_pipeline(spec).check()
    got = Counter(read_files(str(tmp_path / "out")).column("value").to_pylist())
    missing = [v for v in range(TOTAL) if got[v] == 0]
    dups = [v for v, n in got.items() if n > 1]
    assert not missing, f"{len(missing)} rows lost, e.g. {missing[:5]}"
    assert not dups, f"{len(dups)} rows duplicated, e.g. {dups[:5]}"
    assert len(got) == TOTAL
