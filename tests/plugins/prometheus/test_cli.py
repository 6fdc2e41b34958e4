"""``headrace run --metrics-port N``: the pipeline's metrics on an HTTP endpoint."""

from __future__ import annotations

import re
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from headrace.cli import main

PIPELINE = """
name = "prom_cli"
checkpoint = "chk"
[source]
format = "rate-micro-batch"
options = { rowsPerBatch = 100, totalRows = 250 }
[sink]
format = "files"
path = "out"
[trigger]
available_now = true
"""


def test_run_with_metrics_port_serves_the_pipelines_metrics(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = tmp_path / "pipeline.toml"
    p.write_text(PIPELINE)
    assert main(["run", str(p), "--metrics-port", "0"]) == 0
    url = re.search(r"serving metrics on (\S+)", capsys.readouterr().err)
    assert url is not None
    with urllib.request.urlopen(url.group(1), timeout=10) as r:
        text = r.read().decode()
    samples = {(s.name, s.labels.get("query")): s.value for f in text_string_to_metric_families(text) for s in f.samples}
    assert samples[("headrace_batches_total", "prom_cli")] == 3
    assert samples[("headrace_input_rows_total", "prom_cli")] == 250


def test_a_bad_metrics_port_is_refused_before_the_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = tmp_path / "pipeline.toml"
    p.write_text(PIPELINE)
    assert main(["run", str(p), "--metrics-port", "70000"]) == 1
    assert "70000 is not a TCP port" in capsys.readouterr().err
    assert not (tmp_path / "chk").exists()
