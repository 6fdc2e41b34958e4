"""Kill-and-restart runs for the contract suites: at crash points, at random moments timed from a
measured run (weighted towards the sink's write and commit), between the calls a sink's commit
makes to its client, and at the connector's own crash points; each one checked to have landed.

A kill that never happens proves nothing, so every helper here fails (naming what happened and
the fix) when the process was not killed where it was meant to be.

The random kills draw from one seed per pytest session, printed in pytest's header and in every
kill failure; ``--headrace-seed=N`` or ``HEADRACE_KIT_SEED=N`` fixes it to reproduce a run.
"""

from __future__ import annotations

import os
import random
from collections.abc import Mapping
from typing import Any

import pytest

from headrace.testing._pipeline import STEP_PREFIX, PipelineResult, TracePoint, run_pipeline

__all__ = [
    "CRASH_POINTS",
    "SEED_ENV",
    "commit_step_kills",
    "connector_points",
    "first_batch_window",
    "kill_at_point",
    "kit_seed",
    "measured_run",
    "random_kills",
]

SEED_ENV = "HEADRACE_KIT_SEED"
_seed: list[int] = []


def kit_seed() -> int:
    """The session's random-kill seed: ``--headrace-seed`` (set by the kit's pytest plugin),
    else ``HEADRACE_KIT_SEED``, else drawn once per process. Called by every random-kill test."""
    if not _seed:
        raw = os.environ.get(SEED_ENV, "").strip()
        try:
            _seed.append(int(raw) if raw else random.SystemRandom().randrange(1, 1 << 31))
        except ValueError:
            raise pytest.UsageError(
                f"{SEED_ENV}={raw!r} is not an integer; set it to the seed a failing run printed, or unset it"
            ) from None
    return _seed[0]


def set_kit_seed(seed: int) -> None:
    """Fix the session's seed (the pytest plugin, once, from ``--headrace-seed``)."""
    _seed[:] = [seed]


def _reproduce() -> str:
    return f"random-kill seed {kit_seed()}: reproduce with --headrace-seed={kit_seed()} or {SEED_ENV}={kit_seed()}"

CRASH_POINTS = ("before_offsets", "after_offsets", "mid_write", "before_sink_commit", "after_sink_commit", "after_commit")


def kill_at_point(spec: Mapping[str, Any], point: str, batch: int, *, timeout: float, why: str = "") -> PipelineResult:
    """Run ``spec`` armed to SIGKILL itself at ``point`` of batch ``batch``; fail unless it did."""
    result = run_pipeline(spec, crash=f"{point}:{batch}", timeout=timeout, trace=True)
    if result.killed:
        return result
    if result.returncode != 0:
        result.check()
    seen = sorted({t.point for t in result.trace if t.batch == batch and not t.point.startswith(STEP_PREFIX)})
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


def measured_run(spec: Mapping[str, Any], *, timeout: float, batch: int = 0) -> tuple[PipelineResult, float]:
    """The measured run: the pipeline killed at the end of its first batch (``after_commit`` of
    ``batch``, the first batch it runs), traced. Returns it and that batch's duration (seconds)."""
    result = kill_at_point(
        spec, "after_commit", batch, timeout=timeout,
        why="The pipeline must commit at least one batch.",
    )  # fmt: skip
    window = first_batch_window(result)
    assert window is not None, f"the measured run left no trace of batch {batch}: {result.trace}"
    return result, max(window[1].at - window[0].at, 0.005)


def _windows(result: PipelineResult) -> dict[str, tuple[float, float]]:
    """The phases of the measured run's first batch, in seconds after it started: the whole
    batch, the sink's write (read and write, after the offsets are logged) and its commit."""
    window = first_batch_window(result)
    assert window is not None
    start, end = window
    at = {t.point: t.at - start.at for t in result.trace if t.batch == start.batch and t.point in CRASH_POINTS}
    whole = (0.0, max(end.at - start.at, 0.005))
    write = (at.get("after_offsets", 0.0), at.get("before_sink_commit", whole[1]))
    commit = (at.get("before_sink_commit", 0.0), at.get("after_sink_commit", whole[1]))
    return {"commit": commit, "write": write, "batch": whole}


def random_kills(spec: Mapping[str, Any], n: int, *, timeout: float, seed: int | None = None,
                 batch: int = 0) -> list[PipelineResult]:  # fmt: skip
    """The measured run (its first batch is ``batch``), then up to ``n`` runs each SIGKILLed at
    a random moment inside its first batch, timed from the measured run's: the first kill inside
    the sink's commit, the second inside the sink's write, the third anywhere in the batch, then
    any of these (the commit twice as likely). ``seed``: the session's :func:`kit_seed` by default.

    A run that ends before its kill means the stream is finished: the kills stop there. Fails
    when no random kill landed mid-run."""
    seed = kit_seed() if seed is None else seed
    rng = random.Random(seed)
    measured, duration = measured_run(spec, timeout=timeout, batch=batch)
    windows = _windows(measured)
    results = [measured]
    for i in range(n):
        phase = ("commit", "write", "batch")[i] if i < 3 else rng.choice(("commit", "commit", "write", "batch"))
        lo, hi = windows[phase]
        delay = rng.uniform(lo, max(hi, lo + 0.001))
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
            f"{delay:.3f} s into its first batch (in the sink's {phase} phase; batch {batch} of the measured run "
            f"took {duration:.3f} s). The pipeline needs more batches: seed more rows (seed_rows / kill_rows) or "
            f"split them finer (limit / kill_rows_per_batch). ({_reproduce()})"
        )
    return results


def commit_step_kills(spec: Mapping[str, Any], batch: int, points: int, *, timeout: float) -> list[PipelineResult]:
    """Kills between the steps of the sink's commit, with no crash point marked: a traced run
    (starting at ``batch``) counts the calls the commit of its second batch makes to the sink's
    client (``commit_steps`` of the pipeline spec), then up to ``points`` runs are each SIGKILLed
    just after one of those calls (evenly spaced, never after the last), in the commit of their
    own second batch: a process's first commit may import modules and warm caches, its second
    makes the calls every later one makes. Needs ``points + 3`` batches from ``batch`` on.

    Skips when the commit makes one client call or none (nothing between to kill at); fails
    when a kill did not land."""
    traced_batch = batch + 1
    traced = run_pipeline(dict(spec, commit_steps={"batch": traced_batch, "kill_after": None}), timeout=timeout,
                          crash=f"after_commit:{traced_batch}", trace=True)  # fmt: skip
    if not traced.killed:
        traced.check()
    steps = [t.point.removeprefix(STEP_PREFIX) for t in traced.trace if t.point.startswith(STEP_PREFIX)]
    if len(steps) < 2:
        pytest.skip(f"commit({traced_batch}) made {len(steps)} call(s) to the sink's client ({', '.join(steps) or 'none'}): "
                    "nothing between two steps to kill at (a commit that is one atomic call needs no crash point)")  # fmt: skip
    n = min(points, len(steps) - 1)
    after = sorted({max(1, round((k + 1) * (len(steps) - 1) / n)) for k in range(n)})
    runs = [traced]
    for j, k in enumerate(after):
        # each run starts at batch + 2 + j (the replay of the one killed before) and is killed in
        # the commit of the batch after it: a fresh batch, the second commit of its process
        at = batch + 3 + j
        res = run_pipeline(dict(spec, commit_steps={"batch": at, "kill_after": k}), timeout=timeout, trace=True)
        if not res.killed:
            res.check()
            pytest.fail(
                f"the kill after client call {k} of commit({at}) ({steps[k - 1]}) never landed: the run ended "
                f"({res.last_point()}), so this kill test tested nothing; commit({traced_batch}) of the traced run made "
                f"{len(steps)} client calls ({', '.join(steps[:12])}). The pipeline needs batches that all commit "
                "alike: raise kill_rows (or lower kill_rows_per_batch)"
            )
        runs.append(res)
    return runs


def connector_points(result: PipelineResult, *, ignore: tuple[str, ...] = ()) -> list[tuple[str, int]]:
    """The crash points a run passed that are not the engine's (nor start with a prefix in
    ``ignore``: the kit's own connectors): ``(point, first batch id)``, in the order first reached."""
    seen: dict[str, int] = {}
    for t in result.trace:
        if t.point not in CRASH_POINTS and t.point not in seen and not t.point.startswith((*ignore, STEP_PREFIX)):
            seen[t.point] = t.batch
    return list(seen.items())


def landed(results: list[PipelineResult]) -> str:
    """Where each killed run died, for failure messages."""
    return "; ".join(r.last_point() for r in results if r.killed) or "no kill"


def seed_note() -> str:
    """The session's seed and how to reproduce with it, for failure messages of random kills."""
    return _reproduce()
