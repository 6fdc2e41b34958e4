"""Options of the lakebase sink: parsing, validation, secrets, lazy loading (no server)."""

from __future__ import annotations

import subprocess
import sys

import pytest

import headrace as hr
from headrace.errors import OptionsError
from headrace.options import Options
from headrace_lakebase import SINK_OPTIONS, TableName, parse_dbtable


def parse(**raw: object) -> Options:
    return SINK_OPTIONS.parse(raw, connector="lakebase", role="sink")


def test_defaults_follow_the_reference() -> None:
    opts = parse(dbtable="events")
    assert opts["dbtable"] == TableName("public", "events")
    assert opts["batchsize"] == 100000
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


def test_each_query_start_imports_only_what_it_needs() -> None:
    """Every query start loads every plugin's module (connector discovery): for lakebase that is
    the options, without psycopg, pyarrow.compute or the sink's and the change source's modules;
    a lakebase sink then loads its own modules, not the change source's nor the AUTO CDC ones."""
    code = (
        "import sys, headrace as hr\n"
        "hr.registry().get('lakebase')\n"
        "loaded = {m for m in sys.modules if m.startswith(('psycopg', 'pyarrow.compute', 'headrace_lakebase'))}\n"
        "assert loaded <= {'headrace_lakebase', 'headrace_lakebase._plugin', 'headrace_lakebase._options',\n"
        "                  'headrace_lakebase.cdc_options', 'headrace_lakebase.hookspecs', 'headrace_lakebase.params'}, loaded\n"
        "hr.registry().get('lakebase').load_sink()\n"
        "late = {'headrace_lakebase.autocdc', 'headrace_lakebase.cdc_source', 'headrace_lakebase.cdc_decode',\n"
        "        'headrace_lakebase.pgoutput', 'headrace_lakebase.cdc_snapshot'}\n"
        "assert not late & set(sys.modules), late & set(sys.modules)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize(
    "dbtable, fragment",
    [
        ("t" * 64, "the table name"),
        ("s" * 64 + ".t", "the schema name"),
        ("", "plain identifiers"),
        (".t", "plain identifiers"),
    ],
    ids=["table-64-bytes", "schema-64-bytes", "empty", "empty-schema"],
)
def test_identifiers_too_long_or_empty_are_rejected(dbtable: str, fragment: str) -> None:
    with pytest.raises(OptionsError) as e:
        parse(dbtable=dbtable)
    assert "dbtable" in str(e.value) and fragment in str(e.value)
    if "64" in fragment or len(dbtable) > 63:
        assert "at most 63 bytes" in str(e.value)


def test_identifiers_of_63_bytes_are_fine() -> None:
    assert parse_dbtable("s" * 63 + "." + "t" * 63) == TableName("s" * 63, "t" * 63)
    assert parse(dbtable="t", upsertkey="k" * 63)["upsertkey"] == ["k" * 63]


@pytest.mark.parametrize("key", ["k" * 64, "é" * 32], ids=["64-ascii", "64-bytes-utf8"])
def test_upsertkey_longer_than_63_bytes_is_rejected(key: str) -> None:
    with pytest.raises(OptionsError, match=r"upsertkey: the key column name .* 64 bytes long; .* at most 63 bytes"):
        parse(dbtable="t", upsertkey=f"id, {key}")


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://u:pw-in-url@127.0.0.1:abc/db",
        "postgresql://u:pw-in-url@127.0.0.1:70000/db",
        "postgresql://u:pw-in-url/db",  # an unencoded '/' cut the password: 'pw-in-url' looks like the port
        "postgresql://127.0.0.1/db?port=x&password=pw-in-url",
        "postgresql://h1:5432,h2:x/db?password=pw-in-url",
    ],
    ids=["letters", "too-large", "password-as-port", "query-port", "second-host"],
)
def test_url_with_a_bad_port_is_an_options_error(url: str) -> None:
    with pytest.raises(OptionsError) as e:
        parse(dbtable="t", url=url)
    assert "url: the port in the URL is not a number" in str(e.value)
    assert "pw-in-url" not in str(e.value)


@pytest.mark.parametrize(
    "url",
    ["postgresql://u:pw@h:5432/db", "postgresql://h1:5432,h2:5433/db", "postgresql://[::1]:5432/db",
     "postgres://h/db", "postgresql:///db?host=/tmp&port=5433", "postgresql://u:p%40s%3As@h/db"],
    ids=["plain", "multi-host", "ipv6", "no-port", "socket-query-port", "encoded-password"],
)  # fmt: skip
def test_good_urls_pass(url: str) -> None:
    assert parse(dbtable="t", url=url).reveal("url") == url


def test_bad_port_from_the_server_side_is_not_retried() -> None:
    """A bad port that reaches libpq (e.g. through an endpoint plugin) is permanent, not transient."""
    import psycopg

    from headrace_lakebase.retry import is_transient

    with pytest.raises(psycopg.OperationalError) as e:
        psycopg.connect("postgresql://127.0.0.1:abc/db", connect_timeout=1)
    assert not is_transient(e.value)


def test_bad_url_port_fails_at_start_before_io(tmp_path: object) -> None:
    writer = (hr.read_stream.format("rate-micro-batch").option("rowsPerBatch", 1).load()
              .write_stream.format("lakebase").option("dbtable", "t").option("url", "postgresql://u:pw@127.0.0.1:x/db")
              .option("checkpointLocation", str(tmp_path)))  # fmt: skip
    with pytest.raises(OptionsError, match="port in the URL"):
        writer.start()
