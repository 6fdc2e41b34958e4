"""Option declarations and rules of the delta connector; the plugin loads without deltalake."""

from __future__ import annotations

import subprocess
import sys

import pytest

from headrace.errors import OptionsError
from headrace.plugins import registry


def parse(role: str, **raw: object):  # type: ignore[no-untyped-def]
    spec = registry().get("delta")
    schema = spec.source_options if role == "source" else spec.sink_options
    return schema.parse(raw, connector="delta", role=role)


def test_defaults_and_case_insensitive_names() -> None:
    opts = parse("source", path="/t", MAXFILESPERTRIGGER="5", skipchangecommits="true")
    assert opts["maxFilesPerTrigger"] == 5 and opts["skipChangeCommits"] is True
    assert opts["failOnDataLoss"] is True and opts["readChangeFeed"] is False
    assert parse("source", path="/t")["maxFilesPerTrigger"] == 1000
    assert parse("source", path="/t", maxBytesPerTrigger="1g")["maxBytesPerTrigger"] == 1 << 30
    assert parse("source", path="/t", startingVersion="latest")["startingVersion"] == "latest"
    assert parse("source", path="/t", startingVersion="3")["startingVersion"] == 3


@pytest.mark.parametrize(
    ("role", "raw", "message"),
    [
        ("source", {"startingVersion": 1, "startingTimestamp": "2024-01-01"}, "cannot be used together"),
        ("source", {"skipChangeCommits": True, "ignoreChanges": True}, "cannot be used together"),
        ("source", {"withEventTimeOrder": True}, "needs eventTimeColumn"),
        ("source", {"eventTimeColumn": "ts"}, "eventTimeColumn: needs withEventTimeOrder"),
        ("source", {"startingVersion": "earliest"}, "startingVersion"),
        ("source", {"maxFilesPerTrigger": 0}, "less than the minimum 1"),
        ("source", {"tableName": "main.db.t"}, "Unity Catalog is Databricks-only"),
        ("source", {"maxFilesPerTriger": 3}, "did you mean 'maxFilesPerTrigger'"),
        ("sink", {"txnAppId": "a"}, "txnAppId / txnVersion: go together"),
        ("sink", {"txnVersion": 1}, "go together"),
        ("sink", {"mergeSchema": True, "overwriteSchema": True}, "cannot be used together"),
        ("sink", {"optimizeWrite": True}, "Databricks runtime feature"),
    ],
    ids=["starting-both", "skip-and-ignore-changes", "event-order-no-column", "column-no-event-order",
         "bad-starting-version", "zero-files", "unity-catalog", "typo", "txn-app-alone", "txn-version-alone",
         "merge-and-overwrite-schema", "optimize-write"],
)
def test_invalid_options_are_named(role: str, raw: dict, message: str) -> None:
    with pytest.raises(OptionsError) as e:
        parse(role, path="/t", **raw)
    assert message in str(e.value)


def test_path_is_required() -> None:
    with pytest.raises(OptionsError, match="path: is required"):
        parse("sink")


def test_storage_secrets_never_shown() -> None:
    opts = parse("source", path="s3://b/t", **{"storage.AWS_SECRET_ACCESS_KEY": "hunter2", "storage.AWS_REGION": "eu"})
    assert "hunter2" not in repr(opts)
    assert opts.passthrough("storage.") == {"AWS_SECRET_ACCESS_KEY": "hunter2", "AWS_REGION": "eu"}
    from headrace_delta._storage import TableLocation

    assert "hunter2" not in repr(TableLocation("s3://b/t", opts.passthrough("storage.")))


def test_plugin_loads_without_importing_deltalake() -> None:
    code = (
        "import sys; from headrace.plugins import registry; s = registry().get('delta'); "
        "s.source_options.parse({'path': '/t'}); import headrace_delta; "
        "assert 'deltalake' not in sys.modules, 'deltalake imported'; "
        "assert s.requires == ('deltalake',) and 'deltalake' in s.install_hint; print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "ok", out.stderr
