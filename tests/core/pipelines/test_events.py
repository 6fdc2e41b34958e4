"""The event log: appended per event, torn lines skipped, Databricks' field names."""

from __future__ import annotations

from pathlib import Path

from headrace.pipelines.events import EventLog, format_event, read_events


def test_append_read_and_torn_line(tmp_path: Path) -> None:
    path = str(tmp_path / "log" / "events.jsonl")
    log = EventLog(path, "p", "u1")
    log.emit("create_update", "run started", details={"mode": "triggered"})
    log.emit("flow_progress", "batch 0", flow="silver", dataset="silver", details={
        "status": "RUNNING", "data_quality": {"dropped_records": 2, "expectations": [
            {"name": "positive", "dataset": "silver", "passed_records": 8, "failed_records": 2}]}})  # fmt: skip
    with open(path, "a") as f:
        f.write('{"id": "cut by a crash", "timest')  # a SIGKILL mid-line
    events = list(read_events(path))
    assert [e["event_type"] for e in events] == ["create_update", "flow_progress"]
    e = events[1]
    assert e["origin"] == {"pipeline_name": "p", "update_id": "u1", "flow_name": "silver", "dataset_name": "silver"}
    assert e["sequence"] == {"update_id": "u1", "seq": 2} and e["level"] == "INFO"
    line = format_event(e)
    assert "positive passed=8 failed=2" in line and "dropped=2" in line
    # the next run appends after the torn line; readers still get every whole event
    EventLog(path, "p", "u2").emit("create_update", "again")
    assert [e["origin"]["update_id"] for e in read_events(path)] == ["u1", "u1", "u2"]
    assert list(read_events(str(tmp_path / "missing.jsonl"))) == []
