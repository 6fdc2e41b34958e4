"""Logs: ``--log-format json`` (one JSON object per line) and one logger per module."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
from pathlib import Path

import pytest

from headrace.logs import JsonFormatter, headrace_loggers
from tests.cli_runner import cli_env, run_cli

PIPELINE = """
name = "logs"
checkpoint = "chk"
[source]
format = "rate-micro-batch"
options = { rowsPerBatch = 10, totalRows = 25 }
[transform]
function = "logs_transform:fn"
[sink]
format = "noop"
"""


def _run(tmp_path: Path, body: str, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "logs_transform.py").write_text(body)
    (tmp_path / "p.toml").write_text(PIPELINE)
    return run_cli(*args, "run", tmp_path / "p.toml", env=cli_env(os.getcwd()))


def test_json_log_format_writes_one_object_per_line(tmp_path: Path) -> None:
    done = _run(tmp_path, "def fn(t):\n    return t\n", "--log-format", "json", "-v")
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in done.stderr.splitlines()]
    assert records and all({"ts", "level", "logger", "message"} <= r.keys() for r in records)
    assert any(r["logger"] == "headrace.engine.query" and "starting" in r["message"] for r in records)
    assert any(r["logger"] == "headrace.cli" and "finished: 3 batches" in r["message"] for r in records)
    progress = [json.loads(line) for line in done.stdout.splitlines()]
    assert [p["batchId"] for p in progress] == [0, 1, 2]


def test_json_log_format_carries_the_failure_and_its_traceback(tmp_path: Path) -> None:
    done = _run(tmp_path, "def fn(t):\n    raise ValueError('broken transform')\n", "--log-format", "json")
    records = [json.loads(line) for line in done.stderr.splitlines()]
    failed = [r for r in records if r["logger"] == "headrace.engine.query" and r["level"] == "ERROR"]
    assert failed and "broken transform" in failed[0]["exception"]


def test_text_is_the_default(tmp_path: Path) -> None:
    done = _run(tmp_path, "def fn(t):\n    return t\n", "-v")
    assert done.returncode == 0
    assert re.search(r"^INFO headrace\.engine\.query: query 'logs'", done.stderr, re.M)


def test_extra_fields_and_odd_values_are_kept() -> None:
    rec = logging.getLogger("headrace.x").makeRecord("headrace.x", logging.WARNING, "f", 1, "hi %s", ("there",), None,
                                                     extra={"batchId": 3, "obj": object()})  # fmt: skip
    doc = json.loads(JsonFormatter().format(rec))
    assert doc["message"] == "hi there" and doc["batchId"] == 3 and doc["obj"].startswith("<object")


@pytest.mark.parametrize("root", ["core/src", "plugins"])
def test_every_module_logs_through_its_own_name(root: str) -> None:
    hard_coded = []
    for path in Path(root).rglob("*.py"):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"getLogger\(\s*['\"]", line):
                hard_coded.append(f"{path}:{n}: {line.strip()}")
    assert not hard_coded, "use logging.getLogger(__name__):\n" + "\n".join(hard_coded)


def test_the_logger_trees_include_the_plugins() -> None:
    names = headrace_loggers()
    assert "headrace" in names and "headrace_prometheus" in names
