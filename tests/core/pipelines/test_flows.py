"""Flows: several append flows into one table, sinks, update flows, Auto CDC, failures."""

from __future__ import annotations

import json
import os

import pytest

from headrace.cli import main
from headrace.pipelines.graph import GraphError
from tests.core.pipelines.conftest import MakeProject


def _write_rows(folder: str, name: str, rows: list[dict]) -> None:
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, name), "w") as f:
        f.write("\n".join(json.dumps(r) for r in rows) + "\n")


def test_two_append_flows_into_one_table(make_project: MakeProject) -> None:
    p = make_project()
    p.write("transformations/union.py", """
        import headrace as hr
        import headrace.pipelines as dp

        dp.create_streaming_table("all_events", comment="events of both regions")

        def _files(folder):
            return (hr.read_stream.format("cloudFiles").option("cloudFiles.format", "json")
                    .option("cloudFiles.inferColumnTypes", "true").load(folder)
                    .map_batches(lambda t: t.select(["id", "region"])))

        @dp.append_flow(target="all_events")
        def from_eu():
            return _files(dp.configuration()["folders.eu"])

        @dp.append_flow(target="all_events", name="from_us")
        def us_flow():
            return _files("us")
        """)
    p.add_files(1)
    _write_rows(p.path("eu"), "a.json", [{"id": i, "region": "eu"} for i in range(5)])
    _write_rows(p.path("us"), "a.json", [{"id": 100 + i, "region": "us"} for i in range(3)])
    r = p.run()
    assert r.flows["from_eu"] == r.flows["from_us"] == "COMPLETED", r.errors
    assert sorted(x["id"] for x in p.table("all_events")) == [0, 1, 2, 3, 4, 100, 101, 102]
    chk = p.path("storage", "checkpoints", "all_events")
    assert sorted(os.listdir(chk)) == ["from_eu", "from_us"]  # one checkpoint per flow
    _write_rows(p.path("us"), "b.json", [{"id": 200, "region": "us"}])
    p.run()
    assert sorted(x["id"] for x in p.table("all_events")) == [0, 1, 2, 3, 4, 100, 101, 102, 200]
    r = p.run(full_refresh=["all_events"])
    assert sorted(x["id"] for x in p.table("all_events")) == [0, 1, 2, 3, 4, 100, 101, 102, 200]


def test_sink_and_update_flow(make_project: MakeProject) -> None:
    p = make_project()
    p.write("transformations/sink.py", """
        import headrace as hr
        import headrace.pipelines as dp

        dp.create_sink("export", "delta", {"path": "exported"})
        dp.create_sink("parts", "files", {"path": "parts_out", "format": "parquet"})

        @dp.append_flow(target="export")
        def export_silver():
            return hr.read_stream.table("silver")

        @dp.update_flow(target="parts", spark_conf={"pipelines.trigger": "RealTime"})
        def silver_parts():
            return hr.read_stream.table("silver")
        """)
    rows = p.add_files(2)
    r = p.run()
    assert r.flows["export_silver"] == r.flows["silver_parts"] == "COMPLETED", r.errors
    import pyarrow.dataset as ds
    from deltalake import DeltaTable

    want = sorted(x["id"] for x in rows if x["amount"] > 0)
    assert sorted(DeltaTable(p.path("exported")).to_pyarrow_table().column("id").to_pylist()) == want
    assert sorted(ds.dataset(p.path("parts_out"), format="parquet").to_table().column("id").to_pylist()) == want
    rows += p.add_files(1)
    p.run()
    want = sorted(x["id"] for x in rows if x["amount"] > 0)
    assert sorted(DeltaTable(p.path("exported")).to_pyarrow_table().column("id").to_pylist()) == want


def test_auto_cdc_flow_maps_to_delta_cdc_options(make_project: MakeProject) -> None:
    p = make_project()
    p.write("transformations/cdc.py", """
        import headrace as hr
        import headrace.pipelines as dp

        @dp.table
        def changes():
            return (hr.read_stream.format("cloudFiles").option("cloudFiles.format", "json")
                    .option("cloudFiles.inferColumnTypes", "true").load("changes")
                    .map_batches(lambda t: t.select(["id", "v", "seq", "op"])))

        dp.create_streaming_table("users")
        dp.create_auto_cdc_flow(
            target="users", source="changes", keys=["id"], sequence_by="seq",
            apply_as_deletes="op = 'DELETE'", except_column_list=["op"], stored_as_scd_type=1,
        )
        """)
    pipeline = p.load()
    flow = pipeline.graph.registry.flows["users"]
    assert flow.kind == "auto_cdc"
    assert flow.auto_cdc.sink_options() == {
        "keys": "id", "sequenceBy": "seq", "applyAsDeletes": "op = 'DELETE'",
        "exceptColumnList": "op", "storedAsScdType": "1",
    }  # fmt: skip
    from headrace.plugins import registry

    if registry().get("delta").sink_options.get("sequenceBy") is None:
        # the delta sink's CDC options are not installed yet: the dry run says so, nothing runs
        with pytest.raises(GraphError, match="CDC options"):
            pipeline.graph.analyze()
        return
    p.add_files(1)  # the three-level tables run alongside
    _write_rows(p.path("changes"), "1.json", [{"id": 1, "v": "a", "seq": 1, "op": "UPSERT"},
                                              {"id": 2, "v": "b", "seq": 1, "op": "UPSERT"},
                                              {"id": 3, "v": "c", "seq": 1, "op": "UPSERT"}])  # fmt: skip
    r = p.run()
    assert r.flows["users"] == "COMPLETED", r.errors
    assert sorted((x["id"], x["v"]) for x in p.table("users")) == [(1, "a"), (2, "b"), (3, "c")]
    _write_rows(p.path("changes"), "2.json", [{"id": 1, "v": "a2", "seq": 2, "op": "UPSERT"},
                                              {"id": 2, "v": None, "seq": 2, "op": "DELETE"},
                                              {"id": 3, "v": "stale", "seq": 0, "op": "UPSERT"}])  # fmt: skip
    r = p.run()
    assert r.flows["users"] == "COMPLETED", r.errors
    assert sorted((x["id"], x["v"]) for x in p.table("users")) == [(1, "a2"), (3, "c")]
    assert "op" not in p.table("users")[0]


def test_auto_cdc_flow_tracks_history_on_some_columns(make_project: MakeProject) -> None:
    """track_history_except_column_list: the dry run accepts it (the installed headrace-delta has
    trackHistoryExceptColumnList) and a change to an untracked column updates the current version in place."""
    p = make_project()
    p.write("transformations/cdc.py", """
        import headrace as hr
        import headrace.pipelines as dp

        @dp.table
        def changes():
            return (hr.read_stream.format("cloudFiles").option("cloudFiles.format", "json")
                    .option("cloudFiles.inferColumnTypes", "true").load("changes")
                    .map_batches(lambda t: t.select(["id", "v", "note", "seq", "op"])))

        dp.create_streaming_table("users")
        dp.create_auto_cdc_flow(
            target="users", source="changes", keys=["id"], sequence_by="seq",
            apply_as_deletes="op = 'DELETE'", except_column_list=["op", "seq"], stored_as_scd_type=2,
            track_history_except_column_list=["note"],
        )
        """)
    pipeline = p.load()
    assert pipeline.graph.registry.flows["users"].auto_cdc.sink_options()["trackHistoryExceptColumnList"] == "note"
    pipeline.graph.analyze()  # no problem reported
    p.add_files(1)
    _write_rows(p.path("changes"), "1.json", [{"id": 1, "v": "a", "note": "x", "seq": 1, "op": "UPSERT"},
                                              {"id": 1, "v": "a", "note": "y", "seq": 2, "op": "UPSERT"},
                                              {"id": 1, "v": "b", "note": "y", "seq": 3, "op": "UPSERT"}])  # fmt: skip
    r = p.run()
    assert r.flows["users"] == "COMPLETED", r.errors
    got = sorted((x["id"], x["v"], x["note"], x["__START_AT"], x["__END_AT"]) for x in p.table("users"))
    assert got == [(1, "a", "y", 1, 3), (1, "b", "y", 3, None)]


def test_auto_cdc_arguments_checked() -> None:
    import headrace.pipelines as dp
    from headrace.pipelines._context import registering
    from headrace.pipelines.elements import GraphRegistry, PipelineDefinitionError

    with registering(GraphRegistry()):
        with pytest.raises(PipelineDefinitionError, match="not both"):
            dp.create_auto_cdc_flow("t", "s", ["id"], "ts", column_list=["a"], except_column_list=["b"])
        with pytest.raises(PipelineDefinitionError, match="stored_as_scd_type=2"):
            dp.create_auto_cdc_flow("t", "s", ["id"], "ts", track_history_column_list=["a"])
        with pytest.raises(PipelineDefinitionError, match="at least one column"):
            dp.create_auto_cdc_flow("t", "s", [], "ts")


def test_failing_flow_stops_downstream_only(
    make_project: MakeProject, capsys: pytest.CaptureFixture[str]
) -> None:
    p = make_project()
    p.write("transformations/strict.py", """
        import headrace as hr
        import headrace.pipelines as dp

        @dp.table
        @dp.expect_or_fail("no_negatives", "amount >= 0")
        def strict():
            return hr.read_stream.table("bronze")

        @dp.table
        def after_strict():
            return hr.read_stream.table("strict")

        @dp.materialized_view
        def strict_report():
            return dp.read.table("after_strict")
        """)
    p.add_files(1)
    r = p.run()
    assert r.state == "FAILED"
    assert r.flows["strict"] == "FAILED"
    assert "no_negatives" in r.errors["strict"] and "e.g. {" in r.errors["strict"]
    assert r.flows["after_strict"] == r.flows["strict_report"] == "SKIPPED"
    assert r.flows["silver"] == r.flows["gold"] == "COMPLETED"  # unrelated flows ran
    assert not os.path.exists(p.path("storage", "tables", "strict"))  # nothing of the batch written
    assert main(["pipelines", "run", "--spec", p.path("pipeline.yml")]) == 1
    assert main(["pipelines", "events", "--spec", p.path("pipeline.yml"), "--last", "--flow", "strict"]) == 0
    out = capsys.readouterr().out
    assert "ERROR" in out and "no_negatives" in out


def test_reset_not_allowed(make_project: MakeProject) -> None:
    """pipelines.reset.allowed = false: a full refresh leaves the table and its progress alone."""
    from tests.core.pipelines.conftest import PYTHON, actual, expected

    p = make_project()
    p.write("transformations/defs.py", PYTHON.replace(
        "@dp.table\ndef bronze():", '@dp.table(table_properties={"pipelines.reset.allowed": "false"})\ndef bronze():'))
    rows = p.add_files(2)
    p.run()
    r = p.run(full_refresh_all=True)
    assert any("bronze: not fully refreshed (pipelines.reset.allowed = false)" in line for line in r.lines)
    assert not any(line.startswith("[bronze] batch") for line in r.lines)  # nothing read again
    assert any(line.startswith("[silver] batch") for line in r.lines)  # silver recomputed from bronze
    assert actual(p) == expected(rows)


def test_once_flow_and_table_expectations(make_project: MakeProject) -> None:
    """append_flow(once=True) backfills once; create_streaming_table(expect_all_or_drop=...)
    applies to every flow into the table (Databricks)."""
    p = make_project()
    p.write("transformations/once.py", """
        import headrace as hr
        import headrace.pipelines as dp

        dp.create_streaming_table("events", expect_all_or_drop={"has_id": "id IS NOT NULL"})

        def _files(folder):
            return (hr.read_stream.format("cloudFiles").option("cloudFiles.format", "json")
                    .option("cloudFiles.inferColumnTypes", "true").load(folder)
                    .map_batches(lambda t: t.select(["id"])))

        @dp.append_flow(target="events", once=True)
        def backfill():
            return _files("history")

        @dp.append_flow(target="events")
        def live():
            return _files("live")
        """)
    _write_rows(p.path("history"), "h.json", [{"id": 1}, {"id": None}, {"id": 2}])
    _write_rows(p.path("live"), "a.json", [{"id": 10}])
    r = p.run()
    assert r.flows["backfill"] == r.flows["live"] == "COMPLETED", r.errors
    assert sorted(x["id"] for x in p.table("events")) == [1, 2, 10]
    _write_rows(p.path("history"), "h2.json", [{"id": 3}])  # not read: the backfill ran once
    _write_rows(p.path("live"), "b.json", [{"id": 11}])
    p.run()
    assert sorted(x["id"] for x in p.table("events")) == [1, 2, 10, 11]
    p.run(full_refresh=["events"])  # runs the backfill again
    assert sorted(x["id"] for x in p.table("events")) == [1, 2, 3, 10, 11]
