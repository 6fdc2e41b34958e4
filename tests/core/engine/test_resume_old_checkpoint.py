"""A checkpoint written by an earlier build of the engine resumes under this one: its offsets,
commit markers (linked and written whole), source state and operator state are read as they
are, the batch it left uncommitted is replayed with its recorded range, and the state carries on.

The checkpoints under ``old_checkpoints/`` were written by an earlier build (before the engine's
run object and commit order) with this module's :func:`make`, then ``commits/2`` was deleted
as a crash between a batch's state write and its marker leaves it. To write them again with
some build ``B``::

    PYTHONPATH=B/core/src python -m tests.core.engine.test_resume_old_checkpoint DIR

(the test copies them, so the files in git are never changed by a run).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

import headrace as hr

OLD = Path(__file__).parent / "old_checkpoints"
START_MS = 1_700_000_040_000  # a multiple of 4 s: batches 0-3 fall into one 4-second window
ROWS = 6  # per batch; batch b holds values 6b .. 6b+5, at START_MS + b seconds


def windows(checkpoint: str, name: str, total: int) -> hr.StreamingQuery:
    """A windowed aggregation with a watermark: markers written whole (event-time maxima)."""
    return (hr.read_stream.format("rate-micro-batch")
            .options(rowsPerBatch=ROWS, totalRows=total, startTimestamp=START_MS, advanceMillisPerBatch=1000,
                     numPartitions=2).load()
            .with_watermark("timestamp", "10 seconds")
            .group_by(hr.window("timestamp", "4 seconds")).agg("count(*) AS n", "sum(value) AS s")
            .write_stream.format("memory").query_name(name).output_mode("update")
            .option("checkpointLocation", checkpoint).trigger(available_now=True).start())  # fmt: skip


def dedup(checkpoint: str, name: str, total: int) -> hr.StreamingQuery:
    """Deduplication without a watermark: markers linked to their offsets entries, batches
    planned ahead."""
    return (hr.read_stream.format("rate-micro-batch")
            .options(rowsPerBatch=ROWS, totalRows=total, startTimestamp=START_MS, advanceMillisPerBatch=1000,
                     numPartitions=2).load()
            .with_column("k", "value % 24").drop_duplicates("k")
            .write_stream.format("memory").query_name(name).output_mode("append")
            .option("checkpointLocation", checkpoint).trigger(available_now=True).start())  # fmt: skip


QUERIES = {"windows": windows, "dedup": dedup}


def make(folder: Path) -> None:
    """Run each query over batches 0-2, then forget batch 2's commit marker."""
    for name, build in QUERIES.items():
        cp = folder / name
        q = build(str(cp), f"old_{name}", 3 * ROWS)
        q.await_termination()
        assert [p["batchId"] for p in q.recent_progress] == [0, 1, 2], q.recent_progress
        (cp / "commits" / "2").unlink()
        shutil.rmtree(cp / "progress", ignore_errors=True)  # the history is not part of the format


def resume(tmp_path: Path, name: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    cp = tmp_path / name
    shutil.copytree(OLD / name, cp)
    q = QUERIES[name](str(cp), f"old_{name}", 5 * ROWS)
    q.await_termination()
    progress = q.recent_progress
    return progress, hr.memory_table(f"old_{name}").to_pylist()


def test_the_old_checkpoints_are_there() -> None:
    for name in QUERIES:
        assert (OLD / name / "metadata").is_file() and (OLD / name / "offsets" / "2").is_file()
        assert not (OLD / name / "commits" / "2").exists() and (OLD / name / "commits" / "1").is_file()
        assert (OLD / name / "state" / "0").is_dir() or (OLD / name / "state" / "1").is_dir()


def test_an_aggregation_resumes_with_its_watermark_and_state(tmp_path: Path) -> None:
    progress, rows = resume(tmp_path, "windows")
    # batch 2 replayed (same range), then 3 and 4; the watermark continues from the markers
    assert [(p["batchId"], p["numInputRows"]) for p in progress] == [(2, 6), (3, 6), (4, 6)]
    assert [p["sources"][0]["startOffset"] for p in progress] == [{"rows": 12}, {"rows": 18}, {"rows": 24}]
    assert progress[0]["eventTime"]["watermark"] == "2023-11-14T22:13:51.000Z"  # batch 1's max - 10 s
    # the window of batches 0-3 carries the counts of batches 0 and 1 from the old state
    got = [(r["window"]["start"].timestamp() * 1000 - START_MS, r["n"], r["s"]) for r in rows]
    assert got == [(0, 3 * ROWS, sum(range(18))), (0, 4 * ROWS, sum(range(24))), (4000, ROWS, sum(range(24, 30)))]


def test_a_deduplication_resumes_with_its_state(tmp_path: Path) -> None:
    progress, rows = resume(tmp_path, "dedup")
    assert [(p["batchId"], p["numInputRows"]) for p in progress] == [(2, 6), (3, 6), (4, 6)]
    # keys 0-11 were seen by the old run: batch 4's values 24-29 (keys 0-5) are duplicates
    assert [r["value"] for r in rows] == list(range(12, 24))


if __name__ == "__main__":  # pragma: no cover - writes the fixtures (see the module's docstring)
    if len(sys.argv) != 2:
        raise SystemExit("usage: python -m tests.core.engine.test_resume_old_checkpoint DIR")
    target = Path(sys.argv[1])
    if target.exists():
        raise SystemExit(f"{target} exists; give a new folder")
    make(target)
    print(f"wrote {', '.join(QUERIES)} under {target}")
