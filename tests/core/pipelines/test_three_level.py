"""The three-level pipeline, in Python and in SQL: run, new files, run again, full refresh."""

from __future__ import annotations

import pytest

from headrace.pipelines.events import read_events
from tests.core.pipelines.conftest import MakeProject, Project, actual, expected

LANGUAGES = pytest.mark.parametrize("language", ["python", "sql"])


def _batch_rows(p: Project, update_id: str, flow: str) -> int:
    events = read_events(p.path("storage", "event_log", "events.jsonl"))
    return sum(
        e["details"]["flow_progress"]["metrics"]["num_input_rows"]
        for e in events
        if e["origin"].get("update_id") == update_id and e["origin"].get("flow_name") == flow
        and e["event_type"] == "flow_progress" and e["details"]["flow_progress"].get("status") == "RUNNING"
    )  # fmt: skip


@LANGUAGES
def test_run_then_only_new_data(make_project: MakeProject, language: str) -> None:
    p = make_project(language)
    rows = p.add_files(3)
    r1 = p.run()
    assert r1.state == "COMPLETED", r1.errors
    assert set(r1.flows.values()) == {"COMPLETED"}
    assert actual(p) == expected(rows)
    assert _batch_rows(p, r1.update_id, "bronze") == 60

    rows += p.add_files(2)
    r2 = p.run()
    assert r2.state == "COMPLETED", r2.errors
    assert actual(p) == expected(rows)
    # only the two new files went through the streaming tables
    assert _batch_rows(p, r2.update_id, "bronze") == 40
    assert _batch_rows(p, r2.update_id, "silver") == 40

    r3 = p.run()  # nothing new: streaming tables untouched, views recomputed to the same
    assert _batch_rows(p, r3.update_id, "bronze") == 0
    assert actual(p) == expected(rows)


@LANGUAGES
def test_expectation_metrics_in_event_log(make_project: MakeProject, language: str) -> None:
    p = make_project(language)
    rows = p.add_files(2)
    r = p.run()
    events = [e for e in read_events(p.path("storage", "event_log", "events.jsonl"))
              if e["origin"].get("flow_name") == "silver" and e["details"]["flow_progress"].get("data_quality")]  # fmt: skip
    per: dict[str, list[int]] = {}
    for e in events:
        for x in e["details"]["flow_progress"]["data_quality"]["expectations"]:
            c = per.setdefault(x["name"], [0, 0])
            c[0] += x["passed_records"]
            c[1] += x["failed_records"]
    bad = sum(1 for x in rows if x["amount"] <= 0)
    assert per["positive"] == [len(rows) - bad, bad]
    assert per["small"] == [len(rows), 0]
    dropped = sum(e["details"]["flow_progress"]["data_quality"]["dropped_records"] for e in events)
    assert dropped == bad
    assert any("expectations failed: positive=" in line for line in r.lines)


@LANGUAGES
def test_full_refresh_of_one_table(make_project: MakeProject, language: str) -> None:
    p = make_project(language)
    rows = p.add_files(3)
    p.run()
    rows += p.add_files(1)
    p.run()
    r = p.run(full_refresh=["silver"])
    # as in Spark, --full-refresh selects the datasets the run updates
    assert r.flows == {"silver": "COMPLETED"}, r.errors
    assert actual(p) == expected(rows)
    # silver was recomputed from all of bronze: its flow read all 80 rows again
    assert _batch_rows(p, r.update_id, "silver") == 80
    from deltalake import DeltaTable

    ops = [h["operation"] for h in DeltaTable(p.path("storage", "tables", "silver")).history()]
    assert "DELETE" in ops  # truncated (history kept), not dropped
    assert not p.load().storage.pending_full_refreshes()
    r = p.run(full_refresh=["bronze", "silver"], refresh=["gold"])
    assert not any(line.startswith("warning:") for line in r.lines)
    assert actual(p) == expected(rows)
    r = p.run(full_refresh=["bronze"])
    assert any("silver read bronze as a stream" in line for line in r.lines)
    r = p.run(full_refresh_all=True)
    assert set(r.flows.values()) == {"COMPLETED"}
    assert _batch_rows(p, r.update_id, "bronze") == 80
    assert actual(p) == expected(rows)


def test_refresh_selects_datasets(make_project: MakeProject) -> None:
    p = make_project()
    p.add_files(2)
    r = p.run(refresh=["bronze"])
    assert r.flows == {"bronze": "COMPLETED"}
    assert len(p.table("bronze")) == 40
    r = p.run()
    assert set(r.flows) == {"bronze", "silver", "dims", "gold"}
