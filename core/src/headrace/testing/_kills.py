"""Kill-and-restart runs for the contract suites: at crash points, at random moments timed from a
measured run, and at the connector's own crash points; each one checked to have landed.

A kill that never happens proves nothing, so every helper here fails (naming what happened and
the fix) when the process was not killed where it was meant to be.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

import pytest

from headrace.testing._pipeline import PipelineResult, TracePoint, run_pipeline

__all__ = ["CRASH_POINTS", "connector_points", "first_batch_window", "kill_at_point", "measured_run", "random_kills"]

CRASH_POINTS = ("before_offsets", "after_offsets", "mid_write", "before_sink_commit", "after_sink_commit", "after_commit")


def kill_at_point(spec: Mapping[str, Any], point: str, batch: int, *, timeout: float, why: str = "") -> PipelineResult:
    """Run ``spec`` armed to SIGKILL itself at ``point`` of batch ``batch``; fail unless it did."""
    result = run_pipeline(spec, crash=f"{point}:{batch}", timeout=timeout, trace=True)
    if result.killed:
        return result
    if result.returncode != 0:
        result.check()
    seen = sorted({t.point for t in result.trace if t.batch == batch})
    pytest.fail(
        f"crash point {point!r} of batch {batch} was never reached: the pipeline ran to the end "
        f"({result.last_point()}; points passed in batch {batch}: {', '.join(seen) or 'none'}), so this "
        f"kill test tested nothing. {why}".rstrip()
    )


def first_batch_window(result: PipelineResult) -> tuple[TracePoint, TracePoint] | None:
    """The first batch a run started and finished: its ``before_offsets`` and ``after_commit``."""
    starts = [t for t in result.trace if t.point == "before_offsets"]
    if not starts:
        return None
    first = starts[0]
    end = next((t for t in result.trace if t.point == "after_commit" and t.batch == first.batch), None)
    return (first, end) if end is not None else None


def measured_run(spec: Mapping[str, Any], *, timeout: float) -> tuple[PipelineResult, float]:
    """The measured run: the pipeline killed at the end of its first batch (``after_commit:0``),
    traced. Returns it and the first batch's duration (seconds)."""
    result = kill_at_point(
        spec, "after_commit", 0, timeout=timeout,
        why="The pipeline must commit at least one batch.",
    )  # fmt: skip
    window = first_batch_window(result)
    assert window is not None, f"the measured run left no trace of batch 0: {result.trace}"
    return result, max(window[1].at - window[0].at, 0.005)


def random_kills(spec: Mapping[str, Any], n: int, *, timeout: float, seed: int = 0) -> list[PipelineResult]:
    """The measured run, then up to ``n`` runs each SIGKILLed at a random moment inside its first
    batch: ``uniform(0.05, 0.6) * d`` seconds after the batch starts, where ``d`` is the duration
    of the first batch of the measured run (or, if that batch is quicker, as the next one starts).

    A run that ends before its kill means the stream is finished: the kills stop there. Fails
    when no random kill landed mid-run."""
    rng = random.Random(seed)
    measured, duration = measured_run(spec, timeout=timeout)
    results = [measured]
    for i in range(n):
        delay = rng.uniform(0.05, 0.6) * duration
        res = run_pipeline(spec, kill_at=("before_offsets", delay), timeout=timeout)
        if res.killed:
            results.append(res)
            continue
        res.check()
        if len(results) > 1:
            break  # an earlier kill landed; this run finished the stream
        batches = sorted({t.batch for t in res.trace})
        if not batches:
            why = "it found no batch left to run (the measured run had finished the stream)"
        else:
            why = f"it ran batches {batches[0]}-{batches[-1]} to the end in {res.elapsed:.2f} s"
        pytest.fail(
            f"random kill {i + 1} of {n} did not land, so no random kill did: {why}, before the kill "
            f"{delay:.3f} s into its first batch (batch 0 of the measured run took {duration:.3f} s). The "
            "pipeline needs more batches: seed more rows (seed_rows / kill_rows) or split them finer "
            "(limit / kill_rows_per_batch)."
        )
    return results


def connector_points(result: PipelineResult, *, ignore: tuple[str, ...] = ()) -> list[tuple[str, int]]:
    """The crash points a run passed that are not the engine's (nor start with a prefix in
    ``ignore``: the kit's own connectors): ``(point, first batch id)``, in the order first reached."""
    seen: dict[str, int] = {}
    for t in result.trace:
        if t.point not in CRASH_POINTS and t.point not in seen and not t.point.startswith(ignore):
            seen[t.point] = t.batch
    return list(seen.items())


def landed(results: list[PipelineResult]) -> str:
    """Where each killed run died, for failure messages."""
    return "; ".join(r.last_point() for r in results if r.killed) or "no kill"
