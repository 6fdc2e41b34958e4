"""Secrets never appear in reprs, errors, tracebacks, logs, progress or the checkpoint.

A canary value is set on every secret option of every installed connector (walking the
registry's option schemas, and the credential-like keys of every pass-through prefix); then
reprs are taken, failures provoked, and everything a user or an operator can see is searched
for the canary.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import traceback
from typing import Any

import pytest

import headrace as hr
from headrace.errors import OptionsError, redact, redact_url, register_secret, scrub_exception
from headrace.options import Option, OptionSchema, Secret
from headrace.plugins import registry

CANARY = "cAnArY-7f3a9e"
# keys under a pass-through prefix that hold credentials in the client libraries behind them
SECRET_PASSTHROUGH_KEYS = ("sasl.password", "ssl.key.password", "sasl.jaas.config", "AWS_SECRET_ACCESS_KEY",
                           "azure_storage_account_key", "sasl.oauthbearer.client.secret")  # fmt: skip


def _canary_for(opt: Option) -> Any:
    """A value of ``opt``'s type holding the canary (a URL with it as password if need be)."""
    for value in (CANARY, f"postgresql://user:{CANARY}@127.0.0.1:1/db", f"https://user:{CANARY}@127.0.0.1:1/x",
                  json.dumps({"kafka.sasl.password": CANARY})):
        try:
            opt.type.parse(value)
            return value
        except ValueError:
            continue
    raise AssertionError(f"option {opt.name} accepts no canary value")


def _secret_options(schema: OptionSchema) -> dict[str, Any]:
    out = {o.name: _canary_for(o) for o in schema.options if o.secret and not o.unsupported}
    for p in schema.passthrough:
        for key in SECRET_PASSTHROUGH_KEYS:
            out[p.prefix + key] = CANARY
    return out


def _cases() -> list[Any]:
    cases = []
    for spec in registry().specs():
        for role, schema in (("source", spec.source_options), ("sink", spec.sink_options)):
            if (spec.source if role == "source" else spec.sink) and _secret_options(schema):
                cases.append(pytest.param(spec.name, role, id=f"{spec.name}-{role}"))
    return cases


def assert_clean(*texts: object) -> None:
    for t in texts:
        assert CANARY not in str(t), f"the canary leaked: {str(t)[:2000]}"
        assert CANARY.lower() not in str(t).lower()


def test_every_connector_with_secrets_is_covered() -> None:
    names = {c.values[0] for c in _cases()}
    # the connectors this repository ships with secret options (more may be installed)
    for expected in ("kafka", "lakebase", "cloudFiles", "kinesis", "delta", "pubsub"):
        if expected in registry().names():
            assert expected in names, f"{expected} declares no secret option"


@pytest.mark.parametrize(("connector", "role"), _cases())
def test_reprs_and_option_errors_hide_secret_options(connector: str, role: str) -> None:
    spec = registry().get(connector)
    schema = spec.source_options if role == "source" else spec.sink_options
    secrets = _secret_options(schema)
    bad = {**secrets, "noSuchOption": 1}
    if role == "source":
        reader = hr.read_stream.format(connector).options(secrets)
        assert_clean(repr(reader), str(reader))
        with pytest.raises(OptionsError) as e:  # an unknown option next to the secrets
            hr.read_stream.format(connector).options(bad).load()
        assert_clean(str(e.value), "".join(traceback.format_exception(e.value)))
        try:
            frame = reader.load()
        except OptionsError as e2:  # required options missing: the error still hides the secrets
            assert_clean(str(e2))
        else:
            assert_clean(repr(frame), repr(frame.write_stream))
    else:
        frame = hr.read_stream.format("rate-micro-batch").option("rowsPerBatch", 1).load()
        writer = frame.write_stream.format(connector).options(secrets).option("checkpointLocation", "/nonexistent")
        assert_clean(repr(writer), str(writer))
        with pytest.raises(OptionsError) as e:
            frame.write_stream.format(connector).options(bad).option("checkpointLocation", "/x")._build(None)
        assert_clean(str(e.value), "".join(traceback.format_exception(e.value)))
    # the parsed options hide them too
    try:
        opts = schema.parse(secrets, connector=connector, role=role)
    except OptionsError as e3:
        assert_clean(str(e3))
    else:
        assert_clean(repr(opts), opts.redacted())


def test_reprs_of_unknown_connectors_hide_credential_like_keys() -> None:
    r = hr.read_stream.format("no-such-connector").options({"my.password": CANARY, "url": f"pg://u:{CANARY}@h/db"})
    assert_clean(repr(r))


def test_redact_removes_url_credentials_and_registered_secrets() -> None:
    assert redact_url(f"postgresql://bob:{CANARY}@db:5432/x") == "postgresql://bob:***@db:5432/x"
    assert CANARY not in redact(f"connect postgresql://bob:{CANARY}%zz@db/x failed")
    assert CANARY not in redact(f"host=db password={CANARY} user=bob")
    register_secret(f"postgresql://bob:{CANARY}%41bc@db/x")  # bad and good escapes
    assert_clean(redact(f'invalid percent-encoded token: "{CANARY}%41bc"'), redact(f"{CANARY}Abc"))
    assert repr(Secret(CANARY)) == "Secret('***')"


def test_scrub_exception_cleans_the_whole_chain() -> None:
    Secret(CANARY)

    class Weird(Exception):
        def __str__(self) -> str:
            return f"weird {CANARY}"

    try:
        try:
            raise Weird()
        except Weird as inner:
            raise RuntimeError(f"outer {CANARY}") from inner
    except RuntimeError as e:
        clean = scrub_exception(e)
    assert_clean("".join(traceback.format_exception(clean)))
    assert "outer ***" in str(clean)


def _search_folder(folder: str) -> None:
    for root, _dirs, files in os.walk(folder):
        for f in files:
            with open(os.path.join(root, f), "rb") as fh:
                assert CANARY.encode() not in fh.read(), f"canary in {os.path.join(root, f)}"


@pytest.mark.parametrize(
    "url",
    [
        pytest.param(f"postgresql://user:{CANARY}%zz@127.0.0.1:1/db", id="bad-percent-escape"),
        pytest.param(f"postgresql://user:{CANARY}@127.0.0.1:1/db", id="nothing-listening"),
        pytest.param(f"postgresql://user:{CANARY}@127.0.0.1:notaport/db", id="bad-port"),
    ],
)
def test_lakebase_failures_never_show_the_password(url: str, tmp_path: Any, caplog: pytest.LogCaptureFixture) -> None:
    if "lakebase" not in registry().names():
        pytest.skip("headrace-lakebase is not installed")
    caplog.set_level(logging.DEBUG)
    chk = str(tmp_path / "chk")
    frame = hr.read_stream.format("rate-micro-batch").options(rowsPerBatch=5, totalRows=5).load()
    writer = (frame.write_stream.format("lakebase").options(url=url, dbtable="t", maxRetries=0, connectTimeout="1 second")
              .option("checkpointLocation", chk).trigger(available_now=True))  # fmt: skip
    assert_clean(repr(writer))
    texts: list[str] = []
    try:
        q = writer.start()
    except Exception as e:  # failing at start is fine, as long as it is clean
        texts += [str(e), "".join(traceback.format_exception(e))]
    else:
        assert_clean(repr(q))
        with pytest.raises(hr.StreamingQueryException) as ei:
            q.await_termination(30)
        texts += [str(ei.value), "".join(traceback.format_exception(ei.value)), str(q.exception()),
                  "".join(traceback.format_exception(q.exception())), repr(q), str(q.recent_progress)]  # fmt: skip
    assert texts, "the query should have failed"
    texts.append(caplog.text)
    texts += [r.getMessage() for r in caplog.records]
    assert_clean(*texts)
    _search_folder(chk)


# Per connector role: options that make a query with the canary secrets start and fail fast
# (nothing listens on 127.0.0.1:1), next to the base options of the hostile-options test.
UNREACHABLE: dict[tuple[str, str], dict[str, Any]] = {
    ("cloudFiles", "source"): {"path": "s3://bucket/in", "s3.endpointUrl": "http://127.0.0.1:1"},
    ("delta", "source"): {"path": "s3://bucket/t", "storage.AWS_ENDPOINT_URL": "http://127.0.0.1:1",
                          "storage.AWS_REGION": "us-east-1"},
    ("delta", "sink"): {"path": "s3://bucket/t", "storage.AWS_ENDPOINT_URL": "http://127.0.0.1:1",
                        "storage.AWS_REGION": "us-east-1"},
    ("kafka", "source"): {"kafka.bootstrap.servers": "127.0.0.1:1"},
    ("kafka", "sink"): {"kafka.bootstrap.servers": "127.0.0.1:1"},
    ("kinesis", "source"): {"endpoint": "http://127.0.0.1:1"},
    ("kinesis", "sink"): {"endpoint": "http://127.0.0.1:1", "maxRetries": 0},
    ("lakebase", "sink"): {"host": None, "maxRetries": 0},
}  # fmt: skip


@pytest.mark.parametrize(("connector", "role"), _cases())
def test_a_failing_query_never_shows_a_secret(connector: str, role: str, tmp_path: Any,
                                              caplog: pytest.LogCaptureFixture) -> None:  # fmt: skip
    """Start a query with a canary on every secret option against nothing, let it fail (or stop
    it after a few seconds), and search everything a user or operator sees for the canary."""
    from tests.core.test_hostile_options import BASE

    caplog.set_level(logging.DEBUG)  # client libraries' debug logs too (botocore dumps signed requests)
    spec = registry().get(connector)
    schema = spec.source_options if role == "source" else spec.sink_options
    base = {k: (tempfile.mkdtemp(dir=tmp_path) if isinstance(v, str) and v.startswith("/tmp/") else v)
            for k, v in BASE.get((connector, role), {}).items()}  # fmt: skip
    opts = {**base, **_secret_options(schema), **UNREACHABLE.get((connector, role), {})}
    if schema.get("cloudFiles.schemaLocation") is not None:
        opts["cloudFiles.schemaLocation"] = str(tmp_path / "schema")
    opts = {k: v for k, v in opts.items() if v is not None and "jaas" not in k.lower()}  # jaas: refused by kafka
    chk = str(tmp_path / "chk")
    texts: list[str] = []
    try:
        if role == "source":
            w = hr.read_stream.format(connector).options(opts).load().write_stream.format("noop")
        else:
            w = (hr.read_stream.format("rate-micro-batch").options(rowsPerBatch=5, totalRows=5).load()
                 .write_stream.format(connector).options(opts))  # fmt: skip
        q = w.option("checkpointLocation", chk).trigger(available_now=True).start()
        try:
            if not q.await_termination(4):
                q.stop(10)
        except hr.StreamingQueryException as e:
            texts += [str(e), "".join(traceback.format_exception(e))]
        texts += [repr(q), str(q.recent_progress), str(q.exception()), str(q.status)]
    except Exception as e:  # refused at start: the error is clean too
        texts += [str(e), "".join(traceback.format_exception(e))]
    texts += [caplog.text, *(r.getMessage() for r in caplog.records)]
    assert_clean(*texts)
    if os.path.isdir(chk):
        _search_folder(chk)


def test_dictionary_word_secrets_do_not_garble_messages() -> None:
    """A test password such as "headrace" or "testing" is removed where it is quoted as a
    password (URLs, password=...), not from every message (paths, names, `headrace: error`)."""
    Secret("headrace")
    Secret("testing")
    assert redact("headrace: error: /tmp/testing/headrace-checkpoint") == "headrace: error: /tmp/testing/headrace-checkpoint"
    assert redact("postgresql://headrace:headrace@127.0.0.1/db") == "postgresql://headrace:***@127.0.0.1/db"
    assert redact("host=h password=headrace") == "host=h password=***"
    Secret("Tr0ub4dor&3")
    assert redact("auth failed for Tr0ub4dor&3") == "auth failed for ***"
