"""Progress history kept with the checkpoint: written per batch, bounded, across restarts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import headrace as hr
from headrace.cli import main
from headrace.errors import StreamingQueryException, register_secret
from headrace.history import ProgressHistory, query_state, read_history, redact


def _run(chk: Path, name: str, total: int, per_batch: int = 10, fn: Any = None) -> hr.StreamingQuery:
    frame = hr.read_stream.format("rate-micro-batch").options(rowsPerBatch=per_batch, totalRows=total).load()
    if fn is not None:
        frame = frame.map_batches(fn)
    q = (frame.write_stream.format("memory").query_name(name).option("checkpointLocation", str(chk))
         .trigger(available_now=True).start())  # fmt: skip
    return q


def test_history_has_every_batch_of_a_run_and_survives_a_restart(tmp_path: Path) -> None:
    q = _run(tmp_path, "hist", 30)
    assert q.await_termination(30)
    records = read_history(str(tmp_path))
    assert records == json.loads(json.dumps(q.recent_progress))
    assert [r["batchId"] for r in records] == [0, 1, 2]
    state = query_state(str(tmp_path))
    assert state["status"] == "finished" and state["name"] == "hist" and state["id"] == q.id
    assert state["runId"] == q.run_id and state["batchId"] == 2

    q2 = _run(tmp_path, "hist", 50)  # a new run of the same query continues the history
    assert q2.await_termination(30)
    records = read_history(str(tmp_path))
    assert [r["batchId"] for r in records] == [0, 1, 2, 3, 4]
    assert {r["runId"] for r in records} == {q.run_id, q2.run_id}
    assert [r["batchId"] for r in read_history(str(tmp_path), limit=2)] == [3, 4]
    assert [r["batchId"] for r in read_history(str(tmp_path), after=3)] == [4]


def test_history_is_bounded_like_the_offsets_log(tmp_path: Path) -> None:
    h = ProgressHistory(str(tmp_path), keep=3)
    h.start(id="i", run_id="r", name="n")
    for b in range(10):
        h.append({"batchId": b, "numInputRows": b})
    h.finish(run_id="r", exception=None, batch_id=9)
    assert [r["batchId"] for r in read_history(str(tmp_path))][-3:] == [7, 8, 9]
    lines = sum(len(p.read_text().splitlines()) for p in (tmp_path / "progress").glob("*.jsonl"))
    assert 3 <= lines <= 6
    # many short runs: still the last records, still bounded
    for run in range(5):
        h = ProgressHistory(str(tmp_path), keep=3)
        h.start(id="i", run_id=f"r{run}", name="n")
        h.append({"batchId": 10 + run})
        h.finish(run_id=f"r{run}", exception=None, batch_id=10 + run)
    assert [r["batchId"] for r in read_history(str(tmp_path))][-3:] == [12, 13, 14]
    assert len(list((tmp_path / "progress").glob("*.jsonl"))) <= 4


def test_a_batch_id_that_comes_again_replaces_the_records_from_it_on(tmp_path: Path) -> None:
    h = ProgressHistory(str(tmp_path))
    h.start(id="i", run_id="r", name="n")
    for b in range(6):
        h.append({"batchId": b, "run": 1})
    h.finish(run_id="r", exception=None, batch_id=5)
    h = ProgressHistory(str(tmp_path))  # after `checkpoint reset --to-batch 2`
    h.start(id="i", run_id="r2", name="n")
    h.append({"batchId": 3, "run": 2})
    h.finish(run_id="r2", exception=None, batch_id=3)
    assert [(r["batchId"], r["run"]) for r in read_history(str(tmp_path))] == [(0, 1), (1, 1), (2, 1), (3, 2)]


def test_failed_query_records_the_error_and_its_batch(tmp_path: Path) -> None:
    def boom(t: pa.Table) -> pa.Table:
        if t.column("value")[0].as_py() >= 20:
            raise ValueError("bad row in batch")
        return t

    q = _run(tmp_path, "failing", 50, fn=boom)
    with pytest.raises(StreamingQueryException):
        q.await_termination(30)
    state = query_state(str(tmp_path))
    assert state["status"] == "failed" and state["batchId"] == 2
    assert "bad row in batch" in state["exception"]
    assert [r["batchId"] for r in read_history(str(tmp_path))] == [0, 1]
    tb = state["traceback"]  # the dashboard shows it under the error
    assert tb.startswith("Traceback (most recent call last)") and ", in boom" in tb
    assert "ValueError: bad row in batch" in tb and "StreamingQueryException" in tb


def test_a_failures_traceback_is_redacted(tmp_path: Path) -> None:
    secret = "Zq7-history-tb-S3cret"
    register_secret(secret)

    def leak(t: pa.Table) -> pa.Table:
        raise ConnectionError(f"login refused for s3://user:{secret}@bucket/x with password={secret}")

    q = _run(tmp_path, "leaky", 20, fn=leak)
    with pytest.raises(StreamingQueryException):
        q.await_termination(30)
    state = query_state(str(tmp_path))
    assert "ConnectionError: login refused" in state["traceback"] and ", in leak" in state["traceback"]
    on_disk = (tmp_path / "progress" / "terminated.json").read_text()
    assert secret not in on_disk and "***" in on_disk


def test_a_killed_run_is_neither_running_nor_finished(tmp_path: Path) -> None:
    (tmp_path / "progress").mkdir()
    (tmp_path / "progress" / "run.json").write_text(json.dumps({"runId": "r", "pid": 2**22 + 1, "id": "x"}))
    assert query_state(str(tmp_path))["status"] == "killed"


def test_damaged_lines_are_skipped(tmp_path: Path) -> None:
    (tmp_path / "progress").mkdir()
    (tmp_path / "progress" / "1.jsonl").write_text('{"batchId": 0}\n{not json\n{"batchId": 1}\n{"batchId": 2, "cut sh')
    assert read_history(str(tmp_path)) == [{"batchId": 0}, {"batchId": 1}]


def test_secrets_never_reach_the_history() -> None:
    record: dict[str, Any] = {"batchId": 0, "sources": [{"metrics": {"sasl.password": "hunter2", "lag": 3}}],
              "sink": {"metrics": {"apiToken": "abc"}}}  # fmt: skip
    record["sources"][0]["description"] = "kafka[postgres://app:s3cr3t@db:5432/x]"
    out = json.dumps(redact(record))
    assert "hunter2" not in out and "abc" not in out and '"lag": 3' in out
    assert "s3cr3t" not in out and "postgres://***@db:5432/x" in out


def test_checkpoint_show_prints_the_history(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    q = _run(tmp_path, "shown", 20)
    assert q.await_termination(30)
    assert main(["checkpoint", "show", "--json", str(tmp_path)]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert [p["batchId"] for p in shown["recentProgress"]] == [0, 1]
    assert shown["lastRun"]["status"] == "finished"
    assert main(["checkpoint", "show", "--json", str(tmp_path), "--progress", "1"]) == 0
    assert [p["batchId"] for p in json.loads(capsys.readouterr().out)["recentProgress"]] == [1]
