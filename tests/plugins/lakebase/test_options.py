"""Options of the lakebase sink: parsing, validation, secrets, lazy loading (no server)."""

from __future__ import annotations

import subprocess
import sys

import pytest

import headrace as hr
from headrace.errors import OptionsError
from headrace_lakebase import SINK_OPTIONS, TableName, parse_dbtable


def parse(**raw: object) -> object:
    return SINK_OPTIONS.parse(raw, connector="lakebase", role="sink")


def test_defaults_follow_the_reference() -> None:
    opts = parse(dbtable="events")
    assert opts["dbtable"] == TableName("public", "events")
    assert opts["batchsize"] == 1000
    assert opts["batchinterval"] == pytest.approx(0.1)
    assert opts["database"] == "databricks_postgres"
    assert opts["upsertkey"] is None
    assert opts["maxRetries"] == 10


def test_names_match_case_insensitively() -> None:
    opts = parse(DBTABLE="s.t", UpsertKey="a, b", BatchSize="50", batchInterval="2 seconds")
    assert opts["dbtable"] == TableName("s", "t")
    assert opts["upsertkey"] == ["a", "b"]
    assert opts["batchsize"] == 50
    assert opts["batchinterval"] == 2.0


@pytest.mark.parametrize(
    "text, expected",
    [("events", ("public", "events")), ("Sales.Orders_2024", ("sales", "orders_2024")), ("_a._b9", ("_a", "_b9"))],
    ids=["default-schema", "folded-to-lower-case", "underscores"],
)
def test_dbtable_plain_identifiers(text: str, expected: tuple[str, str]) -> None:
    assert parse_dbtable(text) == TableName(*expected)


@pytest.mark.parametrize(
    "bad",
    ['public."events"', "events; DROP TABLE x", "my-table", "a.b.c", "1table", "sch ema.t", "", "t'x", "s.t--"],
    ids=["quotes", "semicolon", "hyphen", "three-parts", "leading-digit", "space", "empty", "single-quote", "comment"],
)
def test_dbtable_rejects_anything_but_plain_identifiers(bad: str) -> None:
    with pytest.raises(OptionsError) as e:
        parse(dbtable=bad)
    msg = str(e.value)
    assert "dbtable" in msg and "plain identifiers" in msg


def test_unknown_options_are_all_listed_with_suggestions() -> None:
    with pytest.raises(OptionsError) as e:
        parse(dbtable="t", upsertkeys="a", batchsiz="3", bogus="1")
    msg = str(e.value)
    assert "upsertkeys" in msg and "did you mean 'upsertkey'" in msg
    assert "batchsiz" in msg and "did you mean 'batchsize'" in msg
    assert "bogus" in msg
    assert "3 problems" in msg


@pytest.mark.parametrize(
    "raw, fragment",
    [
        ({"batchsize": 0}, "batchsize"),
        ({"batchinterval": "soon"}, "not a duration"),
        ({"port": 70000}, "maximum"),
        ({"sslmode": "sometimes"}, "sslmode"),
        ({"endpoint": "just-a-project"}, "project_id.branch_id"),
        ({"url": "mysql://x"}, "postgresql://"),
        ({"upsertkey": "a, a"}, "more than once"),
        ({"url": "postgresql://h/db", "host": "h"}, "cannot be used together"),
        ({"endpoint": "p.b", "host": "h"}, "cannot be used together"),
    ],
    ids=["batchsize-zero", "bad-interval", "bad-port", "bad-sslmode", "bad-endpoint", "bad-url", "dup-key",
         "url-and-host", "endpoint-and-host"],
)  # fmt: skip
def test_invalid_values(raw: dict[str, object], fragment: str) -> None:
    with pytest.raises(OptionsError) as e:
        parse(dbtable="t", **raw)
    assert fragment in str(e.value)


def test_dbtable_is_required() -> None:
    with pytest.raises(OptionsError, match="dbtable: is required"):
        parse()


def test_secrets_never_shown() -> None:
    opts = parse(dbtable="t", password="hunter2-secret", url="postgresql://u:pw-in-url@h/db")
    assert "hunter2-secret" not in repr(opts) and "pw-in-url" not in repr(opts)
    assert opts.reveal("password") == "hunter2-secret"
    with pytest.raises(OptionsError) as e:
        parse(dbtable="t", url="mysql://u:pw-in-url@h/db")
    assert "pw-in-url" not in str(e.value)


def test_connector_and_alias_are_discovered() -> None:
    spec = hr.registry().get("lakebase")
    assert spec.distribution == "headrace-lakebase"
    assert hr.registry().get("PostgreSQL") is spec
    assert spec.sink == "headrace_lakebase.sink:LakebaseSink"
    assert spec.source == "headrace_lakebase.cdc_source:LakebaseChangeSource"
    assert "batchinterval" in SINK_OPTIONS.render("lakebase")


def test_complete_output_mode_is_rejected(tmp_path: object) -> None:
    writer = (hr.read_stream.format("rate-micro-batch").option("rowsPerBatch", 1).load()
              .write_stream.format("lakebase").option("dbtable", "t").option("url", "postgresql://127.0.0.1:1/x")
              .option("checkpointLocation", str(tmp_path)).output_mode("complete"))  # fmt: skip
    with pytest.raises(hr.UnsupportedError, match="output mode 'complete'"):
        writer.start()


def test_plugin_does_not_import_psycopg() -> None:
    code = (
        "import sys, headrace as hr\n"
        "spec = hr.registry().get('lakebase')\n"
        "spec.sink_options.parse({'dbtable': 't'})\n"
        "assert 'psycopg' not in sys.modules, 'psycopg imported by the plugin module'\n"
        "spec.load_sink()\n"
        "assert 'psycopg' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
