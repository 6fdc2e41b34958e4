"""cloudFiles under the shared bad-record policy (headrace.badrecords): fail, drop, deadLetter,
thresholds, and SIGKILL at every stage with every bad row dead-lettered exactly once."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

import headrace as hr
from headrace.badrecords import read_dead_letters
from headrace.errors import OptionsError, StreamingQueryException
from headrace.testing import run_until_done
from tests.plugins.cloudfiles.helpers import output

FILES = 10


def seed(folder: Path, files: int = FILES) -> tuple[set[int], set[str]]:
    """JSON-lines files where every 4th record has an amount that is not a number and every 7th
    is not JSON. Returns the good ids and the locations (file#record) of the bad records."""
    folder.mkdir(parents=True, exist_ok=True)
    good: set[int] = set()
    bad: set[str] = set()
    for f in range(files):
        lines = []
        for k in range(10):
            i = f * 10 + k
            if i % 7 == 3:
                lines.append(f"{{not json {i}")
                bad.add(f"file://{folder}/f{f:03d}.json#record={k}")
            elif i % 4 == 1:
                lines.append(json.dumps({"id": i, "amount": f"n/a-{i}"}))
                bad.add(f"file://{folder}/f{f:03d}.json#record={k}")
            else:
                lines.append(json.dumps({"id": i, "amount": i * 10}))
                good.add(i)
        tmp = folder / f".f{f:03d}.tmp"
        tmp.write_text("\n".join(lines) + "\n")
        os.replace(tmp, folder / f"f{f:03d}.json")
    return good, bad


def _frame(tmp_path: Path, **opts: Any) -> hr.StreamFrame:
    return (hr.read_stream.format("cloudFiles").options({"cloudFiles.format": "json", **opts})
            .schema("id BIGINT, amount BIGINT").load(str(tmp_path / "in")))  # fmt: skip


def _run(tmp_path: Path, name: str, **opts: Any) -> hr.StreamingQuery:
    q = (_frame(tmp_path, **opts).write_stream.format("memory").query_name(name)
         .option("checkpointLocation", str(tmp_path / f"chk-{name}")).trigger(available_now=True).start())  # fmt: skip
    q.await_termination(60)
    return q


def test_fail_is_the_policy_once_set_and_names_the_record(tmp_path: Path) -> None:
    seed(tmp_path / "in", 1)
    with pytest.raises(StreamingQueryException, match=r"f000\.json#record=1: value does not convert: amount='n/a-1' is not int64"):
        _run(tmp_path, "br_fail", badRecordsPolicy="fail")


def test_drop_counts_in_progress(tmp_path: Path) -> None:
    good, bad = seed(tmp_path / "in", 3)
    q = _run(tmp_path, "br_drop", badRecordsPolicy="drop")
    assert set(hr.memory_table("br_drop").column("id").to_pylist()) == good
    assert q.last_progress is not None
    metrics = q.last_progress["sources"][0]["metrics"]
    assert metrics["numBadRecords"] == metrics["numBadRecordsDropped"] == len(bad)
    assert metrics["numBadRecordsDeadLettered"] == 0


def test_dead_letters_carry_the_error_the_origin_and_the_offset(tmp_path: Path) -> None:
    good, bad = seed(tmp_path / "in", 2)
    q = _run(tmp_path, "br_dlq", badRecordsPolicy="deadLetter", badRecordsPath=str(tmp_path / "dlq"))
    assert set(hr.memory_table("br_dlq").column("id").to_pylist()) == good
    letters = read_dead_letters(str(tmp_path / "dlq"))
    assert {x["location"] for x in letters} == bad
    assert {x["origin"] for x in letters} == {"source-0-cloudFiles"} and {x["batchId"] for x in letters} == {0}
    malformed = next(x for x in letters if x["location"].endswith("f000.json#record=3"))
    assert malformed["error"] == "malformed json record" and malformed["record"] == "{not json 3"
    uncast = next(x for x in letters if x["location"].endswith("f000.json#record=1"))
    assert json.loads(uncast["record"]) == {"id": 1, "amount": "n/a-1"} and "is not int64" in uncast["error"]
    assert q.last_progress is not None
    assert q.last_progress["sources"][0]["metrics"]["numBadRecordsDeadLettered"] == len(bad)


@pytest.mark.parametrize(("opts", "message"), [
    ({"maxBadRecords": 2}, "more than maxBadRecords=2"),
    ({"maxBadRecordsFraction": 0.1}, "more than maxBadRecordsFraction=0.1"),
], ids=["count", "fraction"])  # fmt: skip
def test_a_threshold_fails_the_batch_before_anything_is_committed(tmp_path: Path, opts: dict[str, Any], message: str) -> None:
    seed(tmp_path / "in", 2)
    with pytest.raises(StreamingQueryException, match=message):
        _run(tmp_path, "br_max", badRecordsPolicy="deadLetter", badRecordsPath=str(tmp_path / "dlq"), **opts)
    assert hr.memory_table("br_max").num_rows == 0
    assert not (tmp_path / "dlq").exists()


def test_options_are_checked_before_any_io(tmp_path: Path) -> None:
    with pytest.raises(OptionsError) as e:
        _frame(tmp_path, badRecordsPolicy="deadLetter", maxBadRecordsFraction=2).write_stream.format(
            "memory").query_name("x").start()  # fmt: skip
    text = str(e.value)
    assert "badRecordsPath" in text and "is required with badRecordsPolicy=deadLetter" in text
    assert "maxBadRecordsFraction" in text
    with pytest.raises(OptionsError, match="badRecordsPolicy"):
        _frame(tmp_path, badRecordsPolicy="skip").write_stream.format("memory").query_name("x").start()


def dead_letters(tmp_path: Path, to: str) -> list[dict[str, Any]]:
    if to == "delta":
        from deltalake import DeltaTable

        return DeltaTable(str(tmp_path / "dlq")).to_pyarrow_table().to_pylist()
    return read_dead_letters(str(tmp_path / "dlq"))


def test_dead_letters_to_a_delta_table(tmp_path: Path) -> None:
    pytest.importorskip("deltalake")
    good, bad = seed(tmp_path / "in", 3)
    q = _run(tmp_path, "br_delta", badRecordsPolicy="deadLetter", badRecordsSink="delta",
             badRecordsPath=str(tmp_path / "dlq"), **{"cloudFiles.maxFilesPerTrigger": 1})  # fmt: skip
    assert set(hr.memory_table("br_delta").column("id").to_pylist()) == good
    letters = dead_letters(tmp_path, "delta")
    assert {x["location"] for x in letters} == bad and len(letters) == len(bad)
    assert {x["batchId"] for x in letters} == {0, 1, 2} and {x["origin"] for x in letters} == {"source-0-cloudFiles"}
    assert q.last_progress is not None
    assert q.last_progress["sources"][0]["metrics"]["numBadRecordsDeadLettered"] > 0


def test_a_bad_dead_letter_sink_is_refused_at_start(tmp_path: Path) -> None:
    seed(tmp_path / "in", 1)
    with pytest.raises(OptionsError, match="mode"):
        (_frame(tmp_path, badRecordsPolicy="deadLetter", badRecordsSink="files",
                badRecordsSinkOptions={"path": str(tmp_path / "d"), "mode": "x"})
         .write_stream.format("memory").query_name("br_badsink").start())  # fmt: skip
    assert not (tmp_path / "d").exists()


def spec(tmp_path: Path, to: str = "json") -> dict[str, Any]:
    target = {"badRecordsSink": "delta"} if to == "delta" else {}
    return {
        "source": {"format": "cloudFiles", "path": str(tmp_path / "in"), "options": {
            "cloudFiles.format": "json", "cloudFiles.maxFilesPerTrigger": 2,
            "badRecordsPolicy": "deadLetter", "badRecordsPath": str(tmp_path / "dlq"), **target},
            "schema": "id BIGINT, amount BIGINT"},
        "sink": {"format": "files", "options": {"path": str(tmp_path / "out"), "format": "arrow"}},
        "checkpoint": str(tmp_path / "chk"),
        "trigger": {"available_now": True},
    }  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("to", ["json", "delta"], ids=["json-folder", "delta-table"])
def test_sigkill_at_every_stage_dead_letters_every_bad_row_exactly_once(tmp_path: Path, to: str) -> None:
    if to == "delta":
        pytest.importorskip("deltalake")
    good, bad = seed(tmp_path / "in")
    results = run_until_done(
        spec(tmp_path, to),
        crashes=["mid_write:0", "before_sink_commit:1", "after_sink_commit:2", "after_commit:3"],
        random_kills=2, kill_window=(0.8, 1.6), timeout=90,
    )  # fmt: skip
    assert sum(r.killed for r in results) >= 4
    got = output(tmp_path / "out").column("id").to_pylist()
    assert sorted(got) == sorted(good), f"{len(got) - len(set(got))} duplicates, {len(good - set(got))} missing"
    letters = dead_letters(tmp_path, to)
    locations = [x["location"] for x in letters]
    assert len(locations) == len(set(locations)), "a bad record was dead-lettered twice"
    assert set(locations) == bad
    if to == "json":  # one dead-letter file per batch that had bad records, and no leftover temporary file
        assert {p.suffix for p in (tmp_path / "dlq").rglob("*") if p.is_file()} == {".jsonl"}
