"""A headrace pipeline run by Spark Declarative Pipelines (``headrace pipelines run --engine
spark``): the Spark project written for it, what is refused by name, and (HEADRACE_DEEP=1, a
``spark-pipelines`` run takes minutes here) one project run both ways with every table's rows
compared."""

from __future__ import annotations

import datetime as dt
import os
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from headrace.errors import UnsupportedError
from headrace.pipelines.spec import load_pipeline
from headrace.spark.pipelines import DEFINITION_FILE, project_of, refusals, write_project
from tests.spark._pipeline_project import DATASETS, SQL
from tests.spark._pipeline_project import write_project as write_pipeline


def test_the_spark_project_holds_the_spec_the_definitions_and_the_sql_files(tmp_path: Path) -> None:
    p = load_pipeline(str(write_pipeline(tmp_path / "shop")))
    project = write_project(p)
    spec = yaml.safe_load(Path(project.spec_path).read_text())
    assert spec["name"] == "shop"
    assert spec["storage"] == "file://" + str(tmp_path / "shop" / "storage" / "spark" / "storage")
    assert spec["libraries"] == [{"glob": {"include": "transformations/**"}},
                                 {"glob": {"include": "sql/transformations/totals.sql"}}]  # fmt: skip
    assert spec["configuration"]["spark.sql.session.timeZone"] == "UTC"  # headrace's default, unless set
    assert spec["configuration"]["spark.sql.shuffle.partitions"] == "2"  # the pipeline's configuration
    definitions = (Path(project.root) / "transformations" / DEFINITION_FILE).read_text()
    assert f"define(spark, {str(tmp_path / 'shop' / 'pipeline.yml')!r}" in definitions
    assert (
        Path(project.root) / "sql" / "transformations" / "totals.sql"
    ).read_text() == SQL  # Spark SQL as written
    assert project.table_path("events") == str(Path(project.root) / "spark-warehouse" / "events")


_EVENTS = """
import headrace as hr
import headrace.pipelines as dp

@dp.table
def events():
    return hr.read_stream.format("rate").load()
"""


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        pytest.param({"checks.py": "import headrace.pipelines as dp\n\n@dp.table\n@dp.expect('positive', 'value > 0')\n"
                                   "def checked():\n    return dp.read.table('events')\n"},
                     "flow 'checked': expectations ('positive')", id="expectation"),
        pytest.param({"out.py": "import headrace.pipelines as dp\nimport headrace as hr\n\n"
                                "dp.create_sink('out', 'console')\n\n@dp.append_flow(target='out')\n"
                                "def to_out():\n    return hr.read_stream.table('events')\n"},
                     "sink 'out': dp.create_sink is not mapped", id="sink"),
        pytest.param({"files.sql": "CREATE STREAMING TABLE raw AS SELECT * FROM STREAM read_files('landing', "
                                   "format => 'json');\n"},
                     "files.sql:1: read_files(...) is Databricks'", id="sql-read_files"),
        pytest.param({"fn.py": "import headrace as hr\nimport headrace.pipelines as dp\n\n@dp.table\n"
                               "def kept():\n    return hr.read_stream.table('events').filter(lambda t: t['value'])\n"},
                     "flow 'kept': step filter", id="filter-function"),
        pytest.param({"mapped.py": "import headrace as hr\nimport headrace.pipelines as dp\n\n@dp.table\n"
                                   "def mapped():\n    return hr.read_stream.table('events').map_batches(lambda t: t)\n"},
                     "flow 'mapped': step map_batches", id="map_batches-without-schema"),
    ],
)  # fmt: skip
def test_what_spark_pipelines_lack_is_refused_by_name(
    tmp_path: Path, extra: dict[str, str], named: str
) -> None:
    root = tmp_path / "p"
    (root / "transformations").mkdir(parents=True)
    (root / "pipeline.yml").write_text("name: p\nlibraries:\n  - glob:\n      include: transformations/**\n")
    (root / "transformations" / "events.py").write_text(_EVENTS)
    for name, text in extra.items():
        (root / "transformations" / name).write_text(text)
    p = load_pipeline(str(root / "pipeline.yml"))
    found = refusals(p)
    assert any(named in r for r in found), found
    with pytest.raises(UnsupportedError, match="cannot run on Spark Declarative Pipelines"):
        write_project(p)
    assert not os.path.exists(project_of(p).spec_path)  # nothing written


def test_continuous_is_refused_by_the_cli(tmp_path: Path, capsys: Any) -> None:
    from headrace.cli import main

    spec = write_pipeline(tmp_path / "shop")
    assert main(["pipelines", "run", "--spec", str(spec), "--engine", "spark", "--continuous"]) == 2
    assert "--continuous with --engine spark" in capsys.readouterr().err


def _normal(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return (value if value.tzinfo else value.replace(tzinfo=dt.UTC)).astimezone(dt.UTC).isoformat()
    if isinstance(value, dict):
        return tuple(sorted((k, _normal(v)) for k, v in value.items()))
    return value


def _rows(table: pa.Table) -> list[tuple[Any, ...]]:
    return sorted((tuple(sorted((k, _normal(v)) for k, v in r.items())) for r in table.to_pylist()), key=repr)


@pytest.mark.deep
@pytest.mark.timeout(1800)  # spark-pipelines starts a Spark Connect server: minutes under load
def test_one_pipeline_gives_the_same_tables_on_headrace_and_on_spark(tmp_path: Path) -> None:
    from headrace.cli import main
    from tests.spark._spark_home import worker_friendly_spark_home
    from tests.spark.conftest import _java_home

    spec = write_pipeline(tmp_path / "shop")
    assert main(["pipelines", "run", "--spec", str(spec)]) == 0
    env = {
        "JAVA_HOME": _java_home(),
        "SPARK_HOME": worker_friendly_spark_home(),
        "PYSPARK_PYTHON": sys.executable,
    }
    old = {k: os.environ.get(k) for k in env}
    os.environ.update({k: v for k, v in env.items() if v})
    try:
        assert main(["pipelines", "run", "--spec", str(spec), "--engine", "spark"]) == 0
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    p = load_pipeline(str(spec))
    project = project_of(p)
    for name in DATASETS:
        ours = _rows(p.storage.read(name))
        theirs = _rows(pq.read_table(project.table_path(name)))
        assert ours == theirs and ours, name


@pytest.mark.parametrize(
    ("query", "template"),
    [
        pytest.param("SELECT id FROM batch WHERE amount > 0", "SELECT id FROM {batch} AS batch WHERE amount > 0", id="plain"),
        pytest.param("SELECT '{x}' AS s FROM batch b", "SELECT '{{x}}' AS s FROM {batch} AS b", id="braces-doubled"),
        pytest.param("WITH batch AS (SELECT 1 AS one) SELECT * FROM batch", "WITH batch AS (SELECT 1 AS one) SELECT * FROM batch",
                     id="cte-named-batch-kept"),
    ],
)  # fmt: skip
def test_a_sql_step_is_a_spark_sql_template_over_its_input(query: str, template: str) -> None:
    """The SQL step's Spark form (no temporary view, which a pipeline definition cannot make):
    ``spark.sql(template, batch=df)``."""
    from headrace.spark.engine import _batch_template

    assert _batch_template(query) == template
