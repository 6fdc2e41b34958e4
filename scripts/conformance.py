#!/usr/bin/env python
"""Spark conformance, deep tier: every catalogue query (tests/conformance/catalogue.py) on
PySpark Structured Streaming and on headrace over many seeds' inputs, compared batch by batch.

    .venv/bin/python scripts/conformance.py --seeds 200            # seeds 1..200
    .venv/bin/python scripts/conformance.py --seeds 200 --session-seeds 1 --driver-memory 3g \
        --results docs/conformance_deep.jsonl                      # the 200-seed run, its record kept in git
    .venv/bin/python scripts/conformance.py --seeds 20 --start 1000 --query session
    .venv/bin/python scripts/conformance.py --minutes 10            # as many seeds as fit
    .venv/bin/python scripts/conformance.py --seeds 500 --results deep.jsonl   # resumable
    .venv/bin/python scripts/conformance.py --seeds 500 --results deep.jsonl --summary  # what it holds

One Spark session serves several seeds (``--session-seeds``; then a fresh one in a fresh JVM,
as the driver's memory fills up over many streaming queries). Per seed, the input is written once, the seed's cases
start on Spark as concurrent streaming queries (each with its own checkpoint and its own
``foreachBatch`` collection, so concurrency changes no result; ``--parallel`` of them at once)
and headrace runs the same cases one after another while Spark works; each pair is then
compared. With ``--results FILE`` every compared pair is appended to FILE as a JSON line (seed,
case, differences, both engines' seconds, the commit it ran on) as its seed finishes, and a new
run with the same FILE skips the pairs already there: a run that is stopped resumes where it
was, also on another machine from the record kept in git (docs/conformance_deep.jsonl).

Prints ``seed S: N/M identical`` per seed (with its wall and CPU seconds), then which seeds
ran on which commit, then per query/mode pair ``N/M identical`` over the seeds (and for a case
with a known difference how many seeds differed only as it says), then the summary line
``N/M query-seed pairs identical``; every seed that differed unexplained is listed with its
first differences, so ``--seeds 1 --start <seed> --query <id> --verbose`` reproduces one.
Exit status 1 when a seed differs in a way the catalogue does not explain.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import tree_cpu
from tests.conformance.catalogue import CATALOGUE, SOMETIMES, Case, Known
from tests.conformance.generator import Input, generate
from tests.conformance.harness import (
    Outcome,
    Run,
    compare,
    run_headrace,
    spark_session,
    spark_skip_reason,
    start_spark,
    write_input,
)

_SPARK_TIMEOUT_S = 900  # a Spark query still running after this long is reported as failed


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"


def run_seed(spark: Any, cases: Sequence[Case], data: Input, *, parallel: int) -> list[Outcome]:
    """Every case over one seed's input: Spark's queries run concurrently (``parallel`` at a
    time) while headrace runs the cases in turn; then each pair is compared."""
    tmp = tempfile.mkdtemp(prefix=f"conformance-{data.seed}-")
    try:
        paths = write_input(data, tmp)
        specs = [c.spec for c in cases]
        failed: dict[str, list[str]] = defaultdict(list)
        spark_runs: dict[str, Run] = {}
        headrace_runs: dict[str, Run] = {}
        pending = list(specs)
        running: list[Any] = []

        def top_up() -> None:
            while pending and len(running) < parallel:
                spec = pending.pop(0)
                try:
                    running.append(start_spark(spark, spec, paths, os.path.join(tmp, f"chk-spark-{spec.id}")))
                except Exception as e:
                    failed[spec.id].append(f"spark failed: {_first_line(e)}")

        top_up()
        for spec in specs:  # headrace works while Spark's queries run
            try:
                headrace_runs[spec.id] = run_headrace(
                    spec, paths, data, os.path.join(tmp, f"chk-headrace-{spec.id}")
                )
            except Exception as e:
                failed[spec.id].append(f"headrace failed: {_first_line(e)}")
        while running:
            finished = [
                h for h in running if not h.query.isActive or time.monotonic() - h.started > _SPARK_TIMEOUT_S
            ]
            if not finished:  # a query that ends frees its place at once, whichever it is
                try:
                    spark.streams.awaitAnyTermination(60)
                except Exception:  # a failed query's error is reported by its result()
                    pass
                spark.streams.resetTerminated()
                continue
            for handle in finished:
                running.remove(handle)
                try:
                    spark_runs[handle.spec.id] = handle.result(timeout=1)  # ended, or too late
                except Exception as e:
                    failed[handle.spec.id].append(f"spark failed: {_first_line(e)}")
            top_up()
        outcomes = []
        for spec in specs:
            if failed.get(spec.id):
                outcomes.append(Outcome(spec, data.seed, ["; ".join(failed[spec.id])]))
            else:
                outcomes.append(compare(spec, data.seed, spark_runs[spec.id], headrace_runs[spec.id]))
        return outcomes
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _stop_spark(spark: Any) -> None:
    """Stop ``spark`` and the JVM under it, so that the next session starts a fresh JVM: a
    session stopped and started again in the same JVM ran each seed slower than the one before
    (its heap full of what the earlier sessions left) until it ran out of memory."""
    from pyspark import SparkContext

    spark.stop()
    gateway = SparkContext._gateway
    if gateway is None:
        return
    proc = getattr(gateway, "proc", None)
    gateway.shutdown()
    SparkContext._gateway = None
    SparkContext._jvm = None
    if proc is not None:
        if proc.stdin is not None:
            proc.stdin.close()  # the gateway exits when its stdin closes
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _load_results(path: str | None, by_id: dict[str, Case]) -> dict[tuple[int, str], Outcome]:
    """The pairs a results file already holds (lines of cases no longer in the catalogue, or
    cut short by a stop mid-write, are skipped). A pair whose Spark query failed (a broadcast
    or the query timing out on a loaded machine, a stop mid-seed) is not held: it runs again;
    headrace's failures are held, they are results."""
    done: dict[tuple[int, str], Outcome] = {}
    for doc in _result_lines(path):
        try:
            case = by_id[doc["case"]]
            outcome = Outcome(case.spec, int(doc["seed"]), list(doc["differences"]),
                              float(doc.get("spark_s", 0.0)), float(doc.get("headrace_s", 0.0)))  # fmt: skip
        except (ValueError, KeyError, TypeError):
            continue
        if any(d.startswith("spark failed:") for d in outcome.differences):
            done.pop((outcome.seed, case.id), None)
            continue
        done[(outcome.seed, case.id)] = outcome
    return done


def _result_lines(path: str | None) -> Iterator[dict[str, Any]]:
    """The results file's lines as JSON objects (a line cut short by a stop mid-write, or not
    an object, is skipped); nothing when there is no file."""
    if not path or not os.path.exists(path):
        return
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            if isinstance(doc, dict):
                yield doc


_REPO = Path(__file__).resolve().parents[1]
# what decides a pair's result: the engine, the plugins and the conformance harness
_CODE_PATHS = ("core", "plugins", "tests/conformance", "scripts/conformance.py")


def code_version() -> str:
    """The commit the compared code is at (short hash), with ``+changes`` when the engine, a
    plugin or the harness differs from it in the work tree; ``unknown`` outside a git checkout."""
    try:
        head = subprocess.run(["git", "-C", str(_REPO), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
        changed = subprocess.run(["git", "-C", str(_REPO), "status", "--porcelain", "--untracked-files=no",
                                  "--", *_CODE_PATHS], capture_output=True, text=True, check=True).stdout  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+changes" if changed.strip() else "")


def _seeds_by_commit(path: str | None, seeds: range) -> dict[str, list[int]]:
    """Which seeds of ``seeds`` each commit in the results file ran (``unknown`` for lines
    written before the file recorded it)."""
    by_commit: dict[str, set[int]] = defaultdict(set)
    for doc in _result_lines(path):
        try:
            seed = int(doc["seed"])
        except (ValueError, KeyError, TypeError):
            continue
        if seed in seeds:
            by_commit[str(doc.get("commit", "unknown"))].add(seed)
    return {c: sorted(s) for c, s in by_commit.items()}


def _seed_ranges(seeds: Sequence[int]) -> str:
    """``[1, 2, 3, 7]`` as ``1-3, 7``."""
    parts: list[str] = []
    for s in seeds:
        if parts and parts[-1].split("-")[-1] == str(s - 1):
            parts[-1] = f"{parts[-1].split('-')[0]}-{s}"
        else:
            parts.append(str(s))
    return ", ".join(parts)


def _append_results(path: str | None, outcomes: Sequence[Outcome], commit: str) -> None:
    if not path:
        return
    with open(path, "a", encoding="utf-8") as f:
        for o in outcomes:
            f.write(json.dumps({"seed": o.seed, "case": o.spec.id, "identical": o.identical,
                                "differences": o.differences, "spark_s": round(o.spark_seconds, 3),
                                "headrace_s": round(o.headrace_seconds, 3), "commit": commit}) + "\n")  # fmt: skip
        f.flush()
        os.fsync(f.fileno())


def _explanations(case: Case) -> list[Known]:
    return [k for k in (case.known, SOMETIMES.get(case.id)) if k is not None]


def _explained(case: Case, o: Outcome) -> bool:
    """Whether every difference of ``o`` is one the catalogue knows for ``case``."""
    known = _explanations(case)
    return all(any(k.explains(d) for k in known) for d in o.differences)


def summarise(cases: Sequence[Case], results: dict[str, list[Outcome]]) -> tuple[list[str], int]:
    """The per-case lines and the summary line; and how many pairs differ unexplained."""
    lines: list[str] = []
    unexplained_total = 0
    for case in cases:
        outs = sorted(results.get(case.id, []), key=lambda o: o.seed)
        same = sum(o.identical for o in outs)
        line = f"{case.id:32s} {same}/{len(outs)} identical"
        for k in _explanations(case):
            as_known = sum(1 for o in outs if not o.identical and all(k.explains(d) for d in o.differences))
            if as_known or k is case.known:
                line += f", {as_known}/{len(outs)} differ as known ({k.reason.split(':')[0]})"
        unexplained = [o for o in outs if not o.identical and not _explained(case, o)]
        if unexplained:
            unexplained_total += len(unexplained)
            line += f"; UNEXPLAINED on seeds {[o.seed for o in unexplained][:20]}"
        lines.append(line)
        lines += ["    " + o.report(limit=4).replace("\n", "\n    ") for o in unexplained[:2]]
    pairs = sum(len(results.get(c.id, [])) for c in cases)
    identical = sum(o.identical for c in cases for o in results.get(c.id, []))
    every = sum(1 for c in cases if results.get(c.id) and all(o.identical for o in results[c.id]))
    lines.append(f"\nsummary: {identical}/{pairs} query-seed pairs identical; {every}/{len(cases)} query/mode pairs "
                 f"identical on every seed run; {unexplained_total} pairs with unexplained differences")  # fmt: skip
    return lines, unexplained_total


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=20, help="how many seeds (default 20)")
    ap.add_argument("--start", type=int, default=1, help="the first seed (default 1)")
    ap.add_argument("--minutes", type=float, default=None, help="stop starting seeds after this many minutes")
    ap.add_argument(
        "--query", action="append", default=[], help="only cases whose id contains this (repeatable)"
    )
    ap.add_argument("--parallel", type=int, default=40, help="Spark queries run at once (default 40)")
    ap.add_argument("--results", default=None, help="append each pair's result to this JSON-lines file and skip "
                    "the pairs it already holds (resumable)")  # fmt: skip
    ap.add_argument("--session-seeds", type=int, default=6, help="start a fresh Spark session (and JVM) "
                    "after this many seeds (default 6: one local session's driver (1 GB) fills up after about a dozen)")  # fmt: skip
    ap.add_argument("--driver-memory", default="1g", help="the Spark driver's heap (default 1g; local mode "
                    "runs the tasks in the driver, and a long session's state stores and generated "
                    "classes fill it)")  # fmt: skip
    ap.add_argument("--summary", action="store_true", help="run nothing: summarise the pairs --results holds")
    ap.add_argument(
        "--verbose", action="store_true", help="print every difference of every seed that differs"
    )
    args = ap.parse_args(argv)
    if args.parallel < 1:
        print(f"--parallel must be 1 or more, not {args.parallel}", file=sys.stderr)
        return 2
    reason = None if args.summary else spark_skip_reason()  # a summary reads the results file only
    if reason:
        print(f"cannot run Spark: {reason}", file=sys.stderr)
        return 2
    cases = [c for c in CATALOGUE if not args.query or any(q in c.id for q in args.query)]
    if not cases:
        print(
            f"no catalogue case matches {args.query}; ids: {', '.join(c.id for c in CATALOGUE)}",
            file=sys.stderr,
        )
        return 2
    by_id = {c.id: c for c in cases}
    seeds = range(args.start, args.start + args.seeds)
    done = {k: o for k, o in _load_results(args.results, by_id).items() if k[0] in seeds}
    results: dict[str, list[Outcome]] = defaultdict(list)
    for (_, cid), o in done.items():
        results[cid].append(o)
    if done:
        print(f"{args.results}: {len(done)} pairs already run, skipped", flush=True)
    started = time.monotonic()
    spark = None
    seeds_run = 0
    commit = code_version()
    cpu_mark = tree_cpu()  # the process tree's CPU seconds when the last seed ended
    try:
        for seed in seeds if not args.summary else ():
            todo = [c for c in cases if (seed, c.id) not in done]
            if not todo:
                continue
            if args.minutes is not None and time.monotonic() - started > args.minutes * 60:
                break
            if spark is not None and seeds_run and seeds_run % max(args.session_seeds, 1) == 0:
                _stop_spark(spark)
                spark = None
            if spark is None:
                session_start = time.monotonic()
                spark = spark_session(args.driver_memory, raw_local_files=True)
                print(f"Spark session up in {time.monotonic() - session_start:.1f} s; {len(cases)} query/mode pairs",
                      flush=True)  # fmt: skip
            t = time.monotonic()
            data = generate(seed)
            outcomes = run_seed(spark, todo, data, parallel=args.parallel)
            _append_results(args.results, outcomes, commit)
            seeds_run += 1
            for o in outcomes:
                results[o.spec.id].append(o)
            seed_outs = [o for c in cases for o in results[c.id] if o.seed == seed]
            same = sum(o.identical for o in seed_outs)
            cpu_now = tree_cpu()  # (since the last seed ended or the run started: a session's start counts)
            print(f"seed {seed}: {same}/{len(seed_outs)} identical ({data.describe().split(': ', 1)[1]}; "
                  f"{time.monotonic() - t:.0f} s, {cpu_now - cpu_mark:.0f} CPU-s)", flush=True)  # fmt: skip
            cpu_mark = cpu_now
            for o in outcomes:
                if not o.identical and (args.verbose or not _explained(by_id[o.spec.id], o)):
                    print(
                        "    " + o.report(limit=1000 if args.verbose else 3).replace("\n", "\n    "),
                        flush=True,
                    )
    finally:
        if spark is not None:
            _stop_spark(spark)
    seeds_seen = sorted({o.seed for outs in results.values() for o in outs})
    print(f"\n== {len(seeds_seen)} seeds ({seeds_run} run now, {time.monotonic() - started:.0f} s), "
          f"{sum(len(v) for v in results.values())} query-seed pairs")  # fmt: skip
    for c, ran in _seeds_by_commit(args.results, seeds).items():
        print(f"ran on {c}: seeds {_seed_ranges(ran)}")
    lines, unexplained_total = summarise(cases, results)
    print("\n".join(lines), flush=True)
    return 1 if unexplained_total else 0


if __name__ == "__main__":
    sys.exit(main())
