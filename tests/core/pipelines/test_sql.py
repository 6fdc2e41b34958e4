"""SQL definitions: statements, sources with Databricks' argument names, constraints."""

from __future__ import annotations

from pathlib import Path

import pytest

from headrace.engine.source_plan import SourcePlan
from headrace.pipelines.elements import GraphRegistry, PipelineDefinitionError
from headrace.pipelines.sql import register_sql


def _register(text: str, configuration: dict | None = None) -> GraphRegistry:
    reg = GraphRegistry()
    register_sql(text, reg, configuration or {}, filename="t.sql")
    return reg


def _source_plan(reg: GraphRegistry, flow: str, tmp_path: Path) -> SourcePlan:
    from headrace.pipelines.graph import DataflowGraph
    from headrace.pipelines.resolver import Resolver
    from headrace.pipelines.storage import PipelineStorage

    g = DataflowGraph(reg, PipelineStorage(str(tmp_path), str(tmp_path)), base_dir=str(tmp_path))
    frame = Resolver(g, analysis=True).call(reg.flows[flow])
    return frame._sources[0]


def test_read_kafka_pubsub_kinesis_argument_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in (("PRIVATEKEY", "-----BEGIN PRIVATE KEY-----"), ("CLIENTEMAIL", "a@b.c"), ("CLIENTID", "1"),
                       ("PRIVATEKEYID", "k1")):
        monkeypatch.setenv(f"HEADRACE_SECRET_PUBSUB_SCOPE_{key}", value)
    reg = _register("""
        CREATE OR REFRESH STREAMING TABLE k AS SELECT CAST(value AS STRING) AS v
        FROM STREAM read_kafka(bootstrapServers => '127.0.0.1:9092', subscribe => 'events', startingOffsets => 'earliest');
        CREATE OR REFRESH STREAMING TABLE p AS SELECT * FROM STREAM read_pubsub(
          subscriptionId => 'my-subscription', projectId => 'my-project', topicId => 'my-topic',
          clientEmail => secret('pubsub-scope', 'clientEmail'), clientId => secret('pubsub-scope', 'clientId'),
          privateKeyId => secret('pubsub-scope', 'privateKeyId'), privateKey => secret('pubsub-scope', 'privateKey'));
        CREATE OR REFRESH STREAMING TABLE n AS SELECT * FROM STREAM read_kinesis(streamName => 's', initialPosition => 'earliest');
        """)
    from headrace.plugins import registry

    names = registry().names()
    if "kafka" in names:
        plan = _source_plan(reg, "k", tmp_path)
        assert plan.connector == "kafka"
        assert plan.options.redacted()["kafka.bootstrap.servers"] == "127.0.0.1:9092"
        assert plan.options["subscribe"] == ["events"]
    if "pubsub" in names:
        plan = _source_plan(reg, "p", tmp_path)
        assert plan.connector == "pubsub" and plan.options["subscriptionId"] == "my-subscription"
        assert "BEGIN PRIVATE KEY" not in repr(plan.options)  # the secret stays secret
    if "kinesis" in names:
        plan = _source_plan(reg, "n", tmp_path)
        assert plan.connector == "kinesis" and plan.options["streamName"] == "s"


def test_read_files_options_map_to_cloudfiles(tmp_path: Path) -> None:
    reg = _register("""CREATE STREAMING TABLE b AS SELECT * FROM STREAM read_files('${landing}', format => 'csv',
                       header => true, schemaHints => 'id BIGINT', maxFilesPerTrigger => 3)""",
                    {"landing": "in"})  # fmt: skip
    plan = _source_plan(reg, "b", tmp_path)
    assert plan.connector == "cloudFiles"
    assert plan.options["cloudFiles.format"] == "csv"
    assert plan.options["cloudFiles.schemaHints"] == "id BIGINT"
    assert plan.options["cloudFiles.maxFilesPerTrigger"] == 3
    assert plan.path == str(tmp_path / "in")


def test_constraints_views_and_flows() -> None:
    reg = _register("""
        CREATE STREAMING TABLE s (
          id BIGINT,
          CONSTRAINT ok EXPECT (id > 0),
          CONSTRAINT drop_it EXPECT (name IS NOT NULL) ON VIOLATION DROP ROW,
          CONSTRAINT `stop` EXPECT (id < 10) ON VIOLATION FAIL UPDATE
        ) COMMENT 'it''s s' PARTITIONED BY (id) TBLPROPERTIES ('pipelines.reset.allowed' = 'false', 'a.b' = 'c')
        AS SELECT * FROM STREAM(src);
        CREATE TEMPORARY VIEW v AS SELECT * FROM STREAM(s);
        CREATE STREAMING TABLE target;
        CREATE FLOW f1 AS INSERT INTO target BY NAME SELECT * FROM STREAM(v);
        """)
    s = reg.datasets["s"]
    assert s.comment == "it's s" and s.partition_cols == ["id"] and s.schema == "id BIGINT"
    assert s.table_properties == {"pipelines.reset.allowed": "false", "a.b": "c"}
    assert [(e.name, e.action) for e in reg.flows["s"].expectations] == [("ok", "warn"), ("drop_it", "drop"), ("stop", "fail")]
    assert reg.datasets["v"].kind == "temporary_view"
    assert reg.flows["f1"].target == "target" and reg.flows["f1"].kind == "append"
    assert "target" not in reg.flows  # a bare CREATE STREAMING TABLE has no flow of its own


@pytest.mark.parametrize(
    ("sql", "message"),
    [
        ("CREATE STREAMING TABLE a AS SELECT * FROM STREAM(x) JOIN STREAM(y) USING (k)", "exactly one STREAM"),
        ("CREATE STREAMING TABLE a AS SELECT * FROM x", "exactly one STREAM"),
        ("CREATE MATERIALIZED VIEW a AS SELECT * FROM STREAM(x)", "batch inputs"),
        ("DROP TABLE a", "only CREATE"),
        ("CREATE STREAMING TABLE a AS SELECT * FROM STREAM read_csv('x')", "not a source"),
        ("CREATE STREAMING TABLE a AS SELECT * FROM STREAM read_files('x', format => 'json', k => v)", "must be a literal"),
        ("CREATE STREAMING TABLE a AS SELECT * FROM STREAM read_files('${nope}')", "not in the spec's configuration"),
        ("CREATE STREAMING TABLE a AS SELECT * FROM STREAM read_kafka(x => secret('s', 'k'))", "HEADRACE_SECRET_S_K"),
        ("CREATE STREAMING TABLE a AS SELEC * FROM STREAM(x)", "SQL syntax error"),
        ("CREATE STREAMING TABLE a AS SELECT k, count(*) FROM STREAM(x) GROUP BY k", "MATERIALIZED VIEW over"),
    ],
    ids=["two-streams", "no-stream", "mv-with-stream", "not-create", "unknown-source", "non-literal-arg",
         "unknown-conf", "missing-secret", "syntax", "stream-aggregate"],
)
def test_errors(sql: str, message: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HEADRACE_SECRET_S_K", raising=False)
    with pytest.raises(PipelineDefinitionError, match=message):
        _register(sql)


@pytest.mark.parametrize(
    ("text", "head", "shown"),
    [
        ("-- orders\nCREATE OR REFRESH MATERIALIZED VIEW v AS\nSELEC * FROM x;\n",
         "t.sql:3:9: v: SQL syntax error: unexpected 'FROM': the expression before it is incomplete",
         ["    SELEC * FROM x", "            ^"]),
        ("CREATE OR REFRESH MATERIALIZED VIEW v AS SELECT a\n  FROM x WHERE a = = 1;",
         "t.sql:2:20: v: SQL syntax error: unexpected '=': the expression before it is incomplete",
         ["      FROM x WHERE a = = 1", "                       ^"]),
        ("CREATE MATERIALIZED VIEW v AS SELECT (a FROM x;", "t.sql:1:41: v: SQL syntax error: expected ')' at 'FROM'",
         ["    CREATE MATERIALIZED VIEW v AS SELECT (a FROM x", "                                            ^"]),
        ("CREATE MATERIALIZED VIEW v AS SELECT a FROM x WHERE;",
         "t.sql:1:47: v: SQL syntax error: the WHERE clause is incomplete at 'WHERE'", []),
        ("\n\nCREATE FLOW f AS INSERT INTO t BY NAME SELECT a + FROM STREAM(x);",
         "t.sql:3:51: flow f: SQL syntax error: unexpected 'FROM'",
         ["    CREATE FLOW f AS INSERT INTO t BY NAME SELECT a + FROM STREAM(x)"]),
        ("CREATE MATERIALIZED VIEW v AS SELECT 'abc FROM x;", "t.sql:1: v: SQL syntax error: the query cannot be read "
         "into tokens (an unclosed quote, comment or bracket?)", []),
    ],
    ids=["misspelled-select", "second-line", "unclosed-paren", "empty-where", "flow", "unclosed-quote"],
)
def test_syntax_errors_name_file_line_column_plainly(text: str, head: str, shown: list[str]) -> None:
    with pytest.raises(PipelineDefinitionError) as info:
        _register(text)
    message = str(info.value)
    lines = message.splitlines()
    assert lines[0].startswith(head), message
    assert lines[1:1 + len(shown)] == shown, message
    for leak in ("sqlglot", "<class", "\x1b", "Line ", "Col:", "Token"):
        assert leak not in message, message
