"""Option declaration and validation of the cloudFiles source (no I/O)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import headrace as hr
from headrace.errors import OptionsError
from headrace.plugins import registry
from headrace_cloudfiles._options import SOURCE_OPTIONS


def parse(**raw: Any) -> Any:
    base = {"path": "/tmp/x", "cloudFiles.format": "json", "cloudFiles.schemaLocation": "/tmp/s"}
    return SOURCE_OPTIONS.parse({**base, **raw}, connector="cloudFiles", role="source")


def test_defaults_and_case_insensitive_names() -> None:
    opts = parse(**{"CLOUDFILES.MAXFILESPERTRIGGER": "7", "cloudfiles.inferColumnTypes": "true"})
    assert opts["cloudFiles.maxFilesPerTrigger"] == 7
    assert opts["cloudFiles.inferColumnTypes"] is True
    assert opts["cloudFiles.includeExistingFiles"] is True
    assert opts["rescuedDataColumn"] == "_rescued_data"
    assert opts["cloudFiles.cleanSource"] == "OFF"
    assert parse()["cloudFiles.maxFilesPerTrigger"] == 1000


def test_connector_found_by_name_and_alias() -> None:
    assert registry().get("cloudFiles") is registry().get("cloudfiles")
    assert registry().get("CLOUDFILES").name == "cloudFiles"


def test_plugin_module_does_not_import_readers() -> None:
    import subprocess
    import sys

    code = ("import sys, headrace_cloudfiles._plugin, headrace_cloudfiles._options;"
            "bad=[m for m in ('boto3','watchdog','fastavro','pyarrow.json','headrace_cloudfiles.source') if m in sys.modules];"
            "print(bad); sys.exit(1 if bad else 0)")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        pytest.param({"cloudFiles.maxFilesPerTriger": "3"}, "did you mean 'cloudFiles.maxFilesPerTrigger'", id="typo"),
        pytest.param({"cloudFiles.format": "jsonl"}, "is not one of", id="bad-format"),
        pytest.param({"cloudFiles.format": "orc"}, "'orc' is not supported by headrace yet", id="orc"),
        pytest.param({"cloudFiles.maxFilesPerTrigger": "0"}, "less than the minimum 1", id="zero-files"),
        pytest.param({"cloudFiles.cleanSource": "MOVE"}, "moveDestination: is required with cloudFiles.cleanSource=MOVE", id="move-no-dest"),
        pytest.param({"cloudFiles.cleanSource.moveDestination": "/a"}, "only applies with cloudFiles.cleanSource=MOVE", id="dest-no-move"),
        pytest.param({"modifiedAfter": "2024-02-01", "modifiedBefore": "2024-01-01"}, "must be earlier than", id="time-window"),
        pytest.param({"cloudFiles.queueUrl": "https://sqs"}, "not supported by headrace: sets up an SQS queue", id="sqs"),
        pytest.param({"cloudFiles.useManagedFileEvents": "true"}, "Unity Catalog", id="managed-events"),
        pytest.param({"cloudFiles.useNotifications": "true", "cloudFiles.useIncrementalListing": "true"},
                     "applies to directory listing mode only", id="notifications-and-listing"),
        pytest.param({"cloudFiles.schemaEvolutionMode": "evolve"}, "is not one of", id="bad-mode"),
        pytest.param({"cloudFiles.maxBytesPerTrigger": "lots"}, "is not a size", id="bad-size"),
    ],
)
def test_invalid_options_are_rejected(raw: dict[str, Any], expected: str) -> None:
    with pytest.raises(OptionsError) as e:
        parse(**raw)
    assert expected in str(e.value)


def test_every_problem_reported_at_once() -> None:
    with pytest.raises(OptionsError) as e:
        parse(**{"cloudFiles.maxFilesPerTrigger": "-1", "cloudFiles.queueUrl": "x", "bogus": 1})
    assert len(e.value.problems) == 3


def test_secrets_never_shown() -> None:
    opts = parse(**{"s3.secretAccessKey": "hunter2-secret", "s3.accessKeyId": "AKIA-visible?"})
    assert "hunter2" not in repr(opts) and "AKIA" not in repr(opts)
    assert opts.reveal("s3.secretAccessKey") == "hunter2-secret"


def test_describe_lists_options_and_unsupported_ones() -> None:
    text = SOURCE_OPTIONS.render("cloudFiles source")
    for name in ("cloudFiles.schemaLocation", "cloudFiles.useNotifications", "pathGlobFilter", "cloudFiles.cleanSource"):
        assert name in text
    assert "UNSUPPORTED" in text and "cloudFiles.queueUrl" in text


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        pytest.param({}, "cloudFiles.schemaLocation: is required", id="no-schema-location"),
        pytest.param({"cloudFiles.schemaLocation": "S", "cloudFiles.useNotifications": "true", "path": "s3://b/p"},
                     "watches local folders only", id="notifications-on-s3"),
        pytest.param({"cloudFiles.schemaLocation": "S", "cloudFiles.cleanSource": "MOVE",
                      "cloudFiles.cleanSource.moveDestination": "IN/archive"}, "is inside path", id="move-inside-path"),
    ],
)  # fmt: skip
def test_source_level_checks_fail_at_start(tmp_path: Path, options: dict[str, Any], expected: str) -> None:
    fixed = {k: str(tmp_path / "in" / v[3:]) if isinstance(v, str) and v.startswith("IN/") else v
             for k, v in options.items()}  # fmt: skip
    if fixed.get("cloudFiles.schemaLocation") == "S":
        fixed["cloudFiles.schemaLocation"] = str(tmp_path / "s")
    path = fixed.pop("path", None)
    reader = hr.read_stream.format("cloudFiles").options({"cloudFiles.format": "json", **fixed})
    with pytest.raises(OptionsError) as e:
        reader.load(path or str(tmp_path / "in")).write_stream.format("memory").query_name("x").start()
    assert expected in str(e.value)


def test_addnewcolumns_rejected_with_user_schema(tmp_path: Path) -> None:
    reader = (hr.read_stream.format("cloudFiles").option("cloudFiles.format", "json").schema("a INT")
              .option("cloudFiles.schemaEvolutionMode", "addNewColumns"))  # fmt: skip
    with pytest.raises(OptionsError, match="addNewColumns needs an inferred schema"):
        reader.load(str(tmp_path)).write_stream.format("memory").query_name("y").start()
