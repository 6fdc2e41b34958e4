"""The deep tier's results file (scripts/conformance.py), without Spark: pairs round-trip and
resume, a failed Spark query runs again, each line names the commit it ran on, the record
kept in docs/ holds no unexplained difference, and a seed's CPU figure counts the Spark JVM."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from types import ModuleType

import pytest

from tests.conformance.catalogue import CATALOGUE
from tests.conformance.harness import Outcome

ROOT = Path(__file__).resolve().parents[2]
RECORD = ROOT / "docs" / "conformance_deep.jsonl"


@pytest.fixture(scope="module")
def deep() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "conformance_deep_tier", ROOT / "scripts" / "conformance.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CASE = CATALOGUE[0]


def test_pairs_round_trip_and_a_failed_spark_query_runs_again(deep: ModuleType, tmp_path: Path) -> None:
    path = str(tmp_path / "r.jsonl")
    by_id = {c.id: c for c in CATALOGUE}
    other = CATALOGUE[1]
    deep._append_results(path, [Outcome(CASE.spec, 1, [], 2.5, 0.1),
                                Outcome(other.spec, 1, ["spark failed: Py4JError: gone"], 0.0, 0.1),
                                Outcome(CASE.spec, 2, ["batch 1: rows differ"], 2.0, 0.1)], "abc1234")  # fmt: skip
    with open(path, "a", encoding="utf-8") as f:
        f.write('{"seed": 3, "case": "no-such-case", "identical": true, "differences": []}\n')
        f.write('{"seed": 4, "case": "' + CASE.id + '", "ident')  # cut short by a stop mid-write
    done = deep._load_results(path, by_id)
    assert sorted(done) == [(1, CASE.id), (2, CASE.id)]
    assert done[(2, CASE.id)].differences == ["batch 1: rows differ"]
    assert done[(1, CASE.id)].identical
    lines = Path(path).read_text(encoding="utf-8").splitlines()[:3]
    assert [json.loads(line)["commit"] for line in lines] == ["abc1234"] * 3


def test_seeds_are_reported_by_the_commit_they_ran_on(deep: ModuleType, tmp_path: Path) -> None:
    path = str(tmp_path / "r.jsonl")
    deep._append_results(path, [Outcome(CASE.spec, s, [], 1.0, 0.1) for s in (1, 2, 3, 7)], "aaa")
    deep._append_results(path, [Outcome(CASE.spec, s, [], 1.0, 0.1) for s in (8, 9)], "bbb+changes")
    with open(path, "a", encoding="utf-8") as f:  # a line from before commits were recorded
        f.write(json.dumps({"seed": 10, "case": CASE.id, "identical": True, "differences": []}) + "\n")
    assert deep._seeds_by_commit(path, range(1, 10)) == {"aaa": [1, 2, 3, 7], "bbb+changes": [8, 9]}
    assert deep._seeds_by_commit(path, range(10, 11)) == {"unknown": [10]}
    assert deep._seed_ranges([1, 2, 3, 7, 9, 10]) == "1-3, 7, 9-10"


def test_the_code_version_is_a_commit(deep: ModuleType) -> None:
    assert re.fullmatch(r"[0-9a-f]{7,40}(\+changes)?|unknown", deep.code_version())


def test_the_kept_deep_tier_record_holds_no_unexplained_difference(deep: ModuleType) -> None:
    """docs/conformance_deep.jsonl is the deep run's record (resumed across machines from it);
    every difference in it is one the catalogue names, and every line names its commit."""
    by_id = {c.id: c for c in CATALOGUE}
    done = deep._load_results(str(RECORD), by_id)
    assert done, f"{RECORD} holds no pair"
    results: dict[str, list[Outcome]] = defaultdict(list)
    for (_, cid), o in done.items():
        results[cid].append(o)
    lines, unexplained = deep.summarise(CATALOGUE, results)
    assert unexplained == 0, "\n".join(
        line for line in lines if "UNEXPLAINED" in line or line.startswith("    ")
    )
    seeds = range(1, 1 + max(seed for seed, _ in done))
    assert "unknown" not in deep._seeds_by_commit(str(RECORD), seeds)


def test_tree_cpu_counts_live_and_ended_children(deep: ModuleType) -> None:
    """A seed's CPU figure counts the Spark JVM (a live child) and JVMs already stopped."""
    burn = "import sys, time\nt = time.process_time()\nwhile time.process_time() - t < 0.4: pass\nprint(1, flush=True)\nsys.stdin.read()"
    before = deep.tree_cpu()
    child = subprocess.Popen(
        [sys.executable, "-c", burn], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "1"  # burnt, still alive
        alive = deep.tree_cpu()
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait()
    ended = deep.tree_cpu()
    assert alive - before >= 0.35
    assert ended >= alive - 0.01
