"""The dry run: every definition loaded and checked, every problem reported, no data read."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from headrace.cli import main
from headrace.pipelines.graph import GraphError
from tests.core.pipelines.conftest import MakeProject, Project


def _problems(p: Project) -> list[str]:
    pipeline = p.load()
    with pytest.raises(GraphError) as ei:
        pipeline.graph.analyze()
    return ei.value.problems


def test_clean_pipeline_passes_without_reading_data(
    make_project: MakeProject, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
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
def test_cycle(make_project: MakeProject, language: str) -> None:
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
def test_unknown_table(make_project: MakeProject, language: str) -> None:
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


def test_bad_options_all_reported(make_project: MakeProject, capsys: pytest.CaptureFixture[str]) -> None:
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

        @dp.materialized_view
        def bad_batch_read():
            return dp.read.format("json").option("multiline", True).load("dims.json")

        @dp.materialized_view
        def bad_connector_read():
            return dp.read.format("rate-micro-batch").option("rowsPerBatch", 0).load()
        """)
    problems = _problems(p)
    text = "\n".join(problems)
    assert "typo_source" in text and "cloudFiles.format" in text
    assert "sink 'out'" in text and "mergeSchema" in text
    assert "broken" in text and "amount >>> 0" in text
    assert "'nowhere', which is not a dataset" in text
    assert "into_view" in text and "materialized view" in text
    assert "bad_interval" in text and "pipelines.trigger.interval" in text
    assert "bad_batch_read" in text and "multiline: unknown option" in text  # dp.read checks options as hr.read
    assert "bad_connector_read" in text and "rowsPerBatch" in text
    assert main(["pipelines", "dry-run", "--spec", p.path("pipeline.yml")]) == 1
    err = capsys.readouterr().err
    assert "dry run failed" in err and "mergeSchema" in err


def test_stream_from_materialized_view_is_refused(make_project: MakeProject) -> None:
    p = make_project()
    p.write("transformations/x.py", """
        import headrace as hr
        import headrace.pipelines as dp

        @dp.table
        def from_gold():
            return hr.read_stream.table("gold")
        """)
    assert any("materialized view" in x and "cannot be read as a stream" in x for x in _problems(p))


def test_duplicate_names_and_bad_spec(make_project: MakeProject, tmp_path: Path) -> None:
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


def test_no_spec_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["pipelines", "dry-run"]) == 1
    assert "no pipeline spec" in capsys.readouterr().err


def test_definitions_import_helpers_next_to_the_spec(make_project: MakeProject) -> None:
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


def _with_conf(p: Project, key: str, value: str) -> None:
    with open(p.path("pipeline.yml")) as f:
        spec = f.read()
    lines = [ln for ln in spec.splitlines() if not ln.strip().startswith(key + ":")]
    at = lines.index("configuration:") + 1
    lines.insert(at, f"  {key}: {value}")
    with open(p.path("pipeline.yml"), "w") as f:
        f.write("\n".join(lines) + "\n")


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ('"1e400 seconds"', "is not a duration"),
        ('"-5 seconds"', "shorter than the minimum"),
        ('"nan seconds"', "is not a duration"),
        ('"1 second\\0"', "is not a duration"),
        ('"0 seconds"', "shorter than the minimum"),
    ],
    ids=["huge-exponent", "negative", "nan", "nul-byte", "zero"],
)
def test_a_bad_check_interval_is_refused_by_dry_run_and_run_alike(
    make_project: MakeProject, capsys: pytest.CaptureFixture[str], value: str, fragment: str
) -> None:
    p = make_project()
    _with_conf(p, "pipelines.continuous.checkInterval", value)
    (problem,) = [x for x in _problems(p) if "checkInterval" in x]
    assert fragment in problem and "pipelines.continuous.checkInterval" in problem
    assert "\x00" not in problem
    with pytest.raises(GraphError) as ei:  # the run refuses it before any flow runs, with the same words
        p.run(continuous=True)
    assert problem in ei.value.problems
    assert not os.path.exists(p.path("storage", "tables"))
    assert main(["pipelines", "dry-run", "--spec", p.path("pipeline.yml")]) == 1
    assert main(["pipelines", "run", "--continuous", "--spec", p.path("pipeline.yml")]) == 1
    err = capsys.readouterr().err
    assert err.count("pipelines.continuous.checkInterval") == 2 and "ValueError" not in err, err


@pytest.mark.parametrize(
    ("name", "fragment"),
    [("..", "'..' is not a name"), ("../../..", "contains '/'"), ("a\\nb", "contains '\\n'"),
     ("x\\x00y", "contains '\\x00'"), ("n" * 300, "longer than 255 bytes")],
    ids=["dot-dot", "parent-path", "newline", "nul", "too-long"],
)
def test_a_name_that_cannot_be_a_folder_is_refused_by_dry_run_and_run_alike(
    make_project: MakeProject, name: str, fragment: str
) -> None:
    p = make_project()
    p.write("transformations/bad_name.py", f"""
        import headrace as hr
        import headrace.pipelines as dp

        @dp.table(name="{name}")
        def evil():
            return hr.read_stream.table("bronze")
        """)
    (problem,) = [x for x in _problems(p) if "dataset name" in x]
    assert fragment in problem and "bad_name.py:5" in problem
    with pytest.raises(GraphError) as ei:
        p.run()
    assert problem in ei.value.problems
    assert not os.path.exists(p.path("storage", "tables"))


def test_every_cycle_is_reported(make_project: MakeProject) -> None:
    p = make_project("sql")
    p.write("transformations/cycles.sql", """
        CREATE STREAMING TABLE a AS SELECT * FROM STREAM(b);
        CREATE STREAMING TABLE b AS SELECT * FROM STREAM(a);
        CREATE STREAMING TABLE c AS SELECT * FROM STREAM(d);
        CREATE STREAMING TABLE d AS SELECT * FROM STREAM(c);
        CREATE FLOW e_into_d AS INSERT INTO d BY NAME SELECT * FROM STREAM(e);
        CREATE STREAMING TABLE e AS SELECT * FROM STREAM(d);
        CREATE STREAMING TABLE f AS SELECT * FROM STREAM(f);
        """)
    cycles = sorted(x.split(": ")[1].split(";")[0] for x in _problems(p) if "cycle" in x)
    assert cycles == ["a -> b -> a", "c -> d -> c", "d -> e -> d", "f -> f"], cycles


def test_a_non_utf8_spec_is_named(make_project: MakeProject) -> None:
    from headrace.errors import HeadraceError

    p = make_project()
    with open(p.path("pipeline.yml"), "ab") as f:
        f.write(b"# caf\xe9\n")
    with pytest.raises(HeadraceError, match=r"pipeline spec '.*pipeline\.yml' is not UTF-8 text \(byte \d+ is b'\\xe9'\)"):
        p.load()


def test_a_non_utf8_sql_library_is_named(
    make_project: MakeProject, capsys: pytest.CaptureFixture[str]
) -> None:
    from headrace.errors import HeadraceError

    p = make_project("sql")
    with open(p.path("transformations", "latin1.sql"), "wb") as f:
        f.write(b"-- caf\xe9\nCREATE MATERIALIZED VIEW m AS SELECT 1 AS x;\n")
    with pytest.raises(HeadraceError, match=r"SQL library '.*latin1\.sql' is not UTF-8 text"):
        p.load()
    assert main(["pipelines", "dry-run", "--spec", p.path("pipeline.yml")]) == 1
    err = capsys.readouterr().err
    assert "latin1.sql" in err and "UnicodeDecodeError" not in err, err


@pytest.mark.parametrize("opening", ["[", "- "], ids=["flow-list", "block-list"])
def test_a_deeply_nested_spec_is_a_clear_error(
    make_project: MakeProject, capsys: pytest.CaptureFixture[str], opening: str
) -> None:
    p = make_project()
    depth = 100_000
    text = ("name: deep\nlibraries: " + "[" * depth + "]" * depth + "\n") if opening == "[" else \
        ("name: deep\nlibraries:\n" + "".join("  " * i + "-\n" for i in range(2000)))  # fmt: skip
    with open(p.path("pipeline.yml"), "w") as f:
        f.write(text)
    assert main(["pipelines", "dry-run", "--spec", p.path("pipeline.yml")]) == 1
    err = capsys.readouterr().err
    assert "pipeline.yml' nests lists or mappings too deeply" in err, err
    assert "RecursionError" not in err and "Traceback" not in err, err


@pytest.mark.parametrize("target", ["/dev/zero", "fifo"], ids=["device", "fifo"])
def test_a_spec_that_is_not_a_regular_file_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], target: str
) -> None:
    if target == "fifo":
        os.mkfifo(tmp_path / "pipeline.yml")  # nobody writes to it: opening it to read would block
        target = str(tmp_path / "pipeline.yml")
    assert main(["pipelines", "dry-run", "--spec", target]) == 1
    assert "is not a regular file" in capsys.readouterr().err


def test_a_flow_name_that_cannot_be_a_folder_is_refused(make_project: MakeProject) -> None:
    p = make_project()
    p.write("transformations/bad_flow.py", """
        import headrace as hr
        import headrace.pipelines as dp

        @dp.append_flow(target="silver", name="../escape")
        def more():
            return hr.read_stream.table("bronze")
        """)
    (problem,) = [x for x in _problems(p) if "flow name" in x]
    assert "'../escape' contains '/'" in problem and "bad_flow.py" in problem


def test_the_dry_run_shows_what_exists_and_what_the_run_would_do(
    make_project: MakeProject, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    p = make_project()
    p.add_files(1)
    monkeypatch.chdir(p.root)
    assert main(["pipelines", "dry-run"]) == 0
    before = capsys.readouterr().out
    assert "silver  (streaming table, not materialized yet)\n  run: create it" in before
    assert "gold  (materialized view, not materialized yet)\n  run: create it" in before
    p.run()
    assert main(["pipelines", "dry-run"]) == 0
    after = capsys.readouterr().out
    assert "not materialized yet" not in after
    assert "silver  (streaming table, " in after and "version 0" in after
    lines = after.splitlines()
    assert lines[lines.index(next(x for x in lines if x.startswith("silver  ("))) + 1] == "  run: append new data"
    assert lines[lines.index(next(x for x in lines if x.startswith("gold  ("))) + 1] == "  run: full recompute"


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ({"stateSnapshotInterval": 0}, "stateSnapshotInterval: 0 is less than the minimum 1"),
        ({"checkpointFsync": "sometimes"}, "checkpointFsync"),
        ({"stateStore": "floppy"}, "stateStore"),
    ],
    ids=["snapshot-interval-0", "bad-fsync", "bad-state-store"],
)
def test_the_dry_run_checks_engine_options_of_sinks(
    make_project: MakeProject, options: dict, fragment: str
) -> None:
    p = make_project()
    p.write("transformations/sink.py", f"""
        import headrace as hr
        import headrace.pipelines as dp

        dp.create_sink("out", "delta", {{"path": "out_table", **{options!r}}})

        @dp.append_flow(target="out")
        def to_out():
            return hr.read_stream.table("bronze")
        """)
    problems = _problems(p)
    assert any("sink 'out'" in x and fragment in x for x in problems), problems
