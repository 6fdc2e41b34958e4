"""The contract kit tested on itself: deliberately broken SQLite plugins each fail it with a
message naming their bug, a correct one passes, and kill tests that kill nothing fail.

The kit runs once, in a subprocess (as a plugin author's pytest would), over
tests/core/testing/kit_targets.py; the broken connectors come from
tests/core/testing/broken_sqlite.py through ``HEADRACE_PLUGINS``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import cast

import pytest

pytest.importorskip("headrace_sqlite", reason="needs the example plugin: pip install -e examples/headrace-sqlite")

ROOT = Path(__file__).resolve().parents[3]
TARGETS = "tests/core/testing/kit_targets.py"
SELECT = (
    "not discovered and (not kill_and_restart or (SeparateTransaction and connector-points) or "
    "(CorrectSink and connector-points) or (TooFewBatches and random-kills) or (OneRowBatches and mid_write) or "
    "(ChunkedCommit and commit-steps) or (CorrectSink and commit-steps))"
)
KILL = "test_kill_and_restart_loses_nothing"

# class, test, what the failure must say
BROKEN = [
    ("TestReplayNotSkipped", "test_recommitting_a_batch_does_not_duplicate", "replay not skipped"),
    ("TestRunKeyed", "test_recommitting_a_batch_does_not_duplicate", "bookkeeping keyed by the run"),
    ("TestWritesBeforeCommit", "test_rows_invisible_until_commit", "rows written before commit"),
    ("TestFirstWriterOnly", "test_several_writers_one_commit", "only the first writer's message committed"),
    ("TestIgnoresLimit", "test_ranges_are_associative_and_replay_is_deterministic", "the read limit is ignored"),
    ("TestOffByOne", "test_ranges_are_associative_and_replay_is_deterministic", "off-by-one at the range boundary"),
    ("TestReadsPastEnd", "test_ranges_are_associative_and_replay_is_deterministic", "a partition read past its end"),
    ("TestUnpicklablePartition", "test_partitions_are_picklable", "cannot be pickled"),
    ("TestSeparateTransaction", f"{KILL}[connector-points]", "are not atomic"),
    ("TestIgnoresAvailableNow", "test_available_now_stops_at_what_was_there", "the available-now cap is ignored"),
    # the bugs of a plugin written from contrib.md alone that the first kit let through
    ("TestChunkedCommit", f"{KILL}[commit-steps]", "the sink's commit is not atomic across the calls it makes to its client"),
    ("TestPerPartitionLimit", "test_every_read_limit_is_exact", "batch 0 read 14 rows under a limit of 7"),
    ("TestRoundsPastLimit", "test_every_read_limit_is_exact", "batch 0 read 9 rows under a limit of 7"),
    ("TestSwallowsCommitError", "test_a_failed_commit_fails_and_its_replay_lands_once",
     "the sink swallowed a failure in commit and reported success"),
    ("TestBatchKeyed", "test_two_queries_into_one_target_both_land",
     "query B's batch 0 was skipped because query A committed batch 0: the idempotency record must include the query id"),
    ("TestPageReread", "test_many_small_ranges_read_what_one_large_range_reads",
     "re-reads the entry at a page boundary"),
    ("TestCommitsAhead", "test_commit_releases_only_what_is_before_its_end",
     "Source.commit({'next': 8}) deleted data at or after its end"),
    ("TestInferredSchema", "test_every_read_limit_is_exact",
     "the schema of batch 0 [{'next': 0}, {'next': 8}) under ReadLimit(max_rows=7)"),
    ("TestInferredSchema", "test_every_read_limit_is_exact",
     "differs from the source's declared schema: column 'value' is int64, declared int32"),
    ("TestMutatesStart", "test_every_read_limit_is_exact", "latest_offset changed its start argument"),
    # kill tests that kill nothing fail instead of passing
    ("TestTooFewBatches", f"{KILL}[random-kills]", "no random kill did"),
    ("TestTooFewBatches", f"{KILL}[random-kills]", "reproduce with --headrace-seed="),
    ("TestOneRowBatches", f"{KILL}[mid_write]", "crash point 'mid_write' of batch 4 was never reached"),
]


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], str | None]:
    """(class, test) -> None when it passed, else its failure text."""
    report = tmp_path_factory.mktemp("kit") / "report.xml"
    env = dict(os.environ, HEADRACE_PLUGINS="tests.core.testing.broken_sqlite")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", TARGETS, "-p", "no:cacheprovider", "-q", "-k", SELECT,
         f"--junitxml={report}", "-o", "junit_family=xunit1"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert report.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    result: dict[tuple[str, str], str | None] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        cls = case.get("classname", "").rsplit(".", 1)[-1]
        bad = case.find("failure")
        if bad is None:
            bad = case.find("error")
        skipped = case.find("skipped")
        result[(cls, case.get("name", ""))] = (
            None if bad is None and skipped is None else
            (f"SKIPPED {skipped.get('message')}" if bad is None and skipped is not None
             else f"{cast(ET.Element, bad).get('message')}\n{cast(ET.Element, bad).text}")  # bad is set here
        )  # fmt: skip
    return result


@pytest.mark.parametrize(("cls", "test", "says"), BROKEN, ids=[b[0].removeprefix("Test") for b in BROKEN])
def test_a_broken_plugin_fails_the_kit_naming_its_bug(
    outcomes: dict[tuple[str, str], str | None], cls: str, test: str, says: str
) -> None:
    assert (cls, test) in outcomes, f"{cls}::{test} did not run; ran: {sorted(outcomes)[:20]}"
    failure = outcomes[(cls, test)]
    assert failure is not None, f"{cls}::{test} passed, but the plugin is broken"
    assert not failure.startswith("SKIPPED"), f"{cls}::{test} was skipped: {failure}"
    assert says in failure, f"{cls}::{test} failed without saying {says!r}:\n{failure[:3000]}"


def test_a_correct_plugin_passes(outcomes: dict[tuple[str, str], str | None]) -> None:
    correct = {k: v for k, v in outcomes.items() if k[0] in ("TestCorrectSource", "TestCorrectSink")}
    assert len(correct) >= 15, sorted(correct)
    failed = {k: v for k, v in correct.items() if v is not None and not v.startswith("SKIPPED")}
    assert not failed, "\n\n".join(f"{k}: {v}" for k, v in failed.items())
    assert correct[("TestCorrectSink", f"{KILL}[connector-points]")] is None, "the correct sink's crash point was not killed at"
    assert correct[("TestCorrectSink", f"{KILL}[commit-steps]")] is None, "the correct sink's commit was not killed between its steps"
    assert correct[("TestCorrectSink", "test_a_failed_commit_fails_and_its_replay_lands_once")] is None, "the fault test did not run"
