"""delta -> delta survives SIGKILL at every engine crash point and at random times, exactly once."""

from __future__ import annotations

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
