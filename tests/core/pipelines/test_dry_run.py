"""The dry run: every definition loaded and checked, every problem reported, no data read."""

from __future__ import annotations

import os

import pytest

from headrace.cli import main
from headrace.pipelines.graph import GraphError


def _problems(p) -> list[str]:
    pipeline = p.load()
    with pytest.raises(GraphError) as ei:
        pipeline.graph.analyze()
    return ei.value.problems


def test_clean_pipeline_passes_without_reading_data(make_project, capsys, monkeypatch) -> None:
    p = make_project()
    p.add_files(1)
    monkeypatch.chdir(p.path("landing"))  # the spec is found in a parent folder
    assert main(["pipelines", "dry-run"]) == 0
    out = capsys.readouterr().out
    assert "silver  (streaming table" in out and "gold  (materialized view" in out
    assert "<- bronze (stream)" in out and "<- dims (batch)" in out
    assert not os.path.exists(p.path("storage", "tables"))  # nothing written
    assert not os.path.exists(p.path("storage", "checkpoints"))


@pytest.mark.parametrize("language", ["python", "sql"])
def test_cycle(make_project, language: str) -> None:
    p = make_project(language)
    if language == "python":
        p.write("transformations/cycle.py", """
            import headrace as hr
            import headrace.pipelines as dp

            @dp.table
            def a():
                return hr.read_stream.table("b")

            @dp.table
            def b():
                return hr.read_stream.table("a")
            """)
    else:
        p.write("transformations/cycle.sql", """
            CREATE STREAMING TABLE a AS SELECT * FROM STREAM(b);
            CREATE STREAMING TABLE b AS SELECT * FROM STREAM(a);
            """)
    problems = _problems(p)
    assert any("cycle" in x and ("a -> b -> a" in x or "b -> a -> b" in x) for x in problems), problems


@pytest.mark.parametrize("language", ["python", "sql"])
def test_unknown_table(make_project, language: str) -> None:
    p = make_project(language)
    if language == "python":
        p.write("transformations/more.py", """
            import headrace as hr
            import headrace.pipelines as dp

            @dp.table
            def platinum():
                return hr.read_stream.table("silvr")

            @dp.materialized_view
            def report():
                return dp.read.table("gld")
            """)
    else:
        p.write("transformations/more.sql", """
            CREATE STREAMING TABLE platinum AS SELECT * FROM STREAM(silvr);
            CREATE MATERIALIZED VIEW report AS SELECT * FROM gld;
            """)
    problems = _problems(p)
    assert any("platinum" in x and "no dataset 'silvr'" in x and "bronze" in x for x in problems), problems
    assert any("report" in x and "no dataset 'gld'" in x for x in problems), problems


def test_bad_options_all_reported(make_project, capsys) -> None:
    p = make_project()
    p.write("transformations/bad.py", """
        import headrace as hr
        import headrace.pipelines as dp

        @dp.table
        def typo_source():
            return hr.read_stream.format("cloudFiles").option("cloudFiles.format", "jsn").load("landing")

        dp.create_sink("out", "delta", {"path": "out_table", "mergeSchema": "maybe"})

        @dp.append_flow(target="out")
        def to_out():
            return hr.read_stream.table("bronze")

        @dp.table
        @dp.expect("broken", "amount >>> 0")
        def broken_expectation():
            return hr.read_stream.table("bronze")

        @dp.append_flow(target="nowhere")
        def lost():
            return hr.read_stream.table("bronze")

        @dp.append_flow(target="gold")
        def into_view():
            return hr.read_stream.table("bronze")

        @dp.append_flow(target="out", spark_conf={"pipelines.trigger.interval": "soon"})
        def bad_interval():
            return hr.read_stream.table("bronze")
        """)
    problems = _problems(p)
    text = "\n".join(problems)
    assert "typo_source" in text and "cloudFiles.format" in text
    assert "sink 'out'" in text and "mergeSchema" in text
    assert "broken" in text and "amount >>> 0" in text
    assert "'nowhere', which is not a dataset" in text
    assert "into_view" in text and "materialized view" in text
    assert "bad_interval" in text and "pipelines.trigger.interval" in text
    assert main(["pipelines", "dry-run", "--spec", p.path("pipeline.yml")]) == 1
    err = capsys.readouterr().err
    assert "dry run failed" in err and "mergeSchema" in err


def test_stream_from_materialized_view_is_refused(make_project) -> None:
    p = make_project()
    p.write("transformations/x.py", """
        import headrace as hr
        import headrace.pipelines as dp

        @dp.table
        def from_gold():
            return hr.read_stream.table("gold")
        """)
    assert any("materialized view" in x and "cannot be read as a stream" in x for x in _problems(p))


def test_duplicate_names_and_bad_spec(make_project, tmp_path) -> None:
    from headrace.errors import HeadraceError

    p = make_project()
    p.write("transformations/dup.py", """
        import headrace.pipelines as dp

        @dp.materialized_view(name="gold")
        def again():
            return dp.read.table("silver")
        """)
    with pytest.raises(HeadraceError, match="'gold' is defined twice"):
        p.load()
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "pipeline.yml").write_text("name: x\nstorage: s\nlibrarys: []\n")
    from headrace.pipelines.spec import load_spec

    with pytest.raises(HeadraceError, match="unknown field 'librarys'"):
        load_spec(str(tmp_path / "bad" / "pipeline.yml"))


def test_no_spec_found(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["pipelines", "dry-run"]) == 1
    assert "no pipeline spec" in capsys.readouterr().err


def test_definitions_import_helpers_next_to_the_spec(make_project) -> None:
    p = make_project()
    p.write("pipeline_helpers_xyz.py", "SOURCE = 'silver'\n")
    p.write("transformations/uses_helper.py", """
        import headrace as hr
        import headrace.pipelines as dp
        from pipeline_helpers_xyz import SOURCE

        @dp.table
        def copy_of_silver():
            return hr.read_stream.table(SOURCE)
        """)
    g = p.load().graph.analyze()
    assert g.upstream(g.registry.flows["copy_of_silver"]) == {"silver"}
