from __future__ import annotations

import json
from pathlib import Path

import pytest

from headrace.cli import main
from headrace.connectors.files import read_files

PIPELINE = """
name = "cli"
checkpoint = "chk"
[source]
format = "rate-micro-batch"
options = { rowsPerBatch = 100, totalRows = 250 }
[transform]
function = "cli_transform:double"
[sink]
format = "files"
path = "out"
[trigger]
available_now = true
"""


@pytest.fixture
def pipeline(tmp_path: Path) -> Path:
    (tmp_path / "cli_transform.py").write_text(
        "import pyarrow.compute as pc\n"
        "def double(t):\n    return t.set_column(1, 'value', pc.multiply(t.column('value'), 2))\n"
    )
    p = tmp_path / "pipeline.toml"
    p.write_text(PIPELINE)
    return p


def test_connectors_lists_builtins(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["connectors"]) == 0
    out = capsys.readouterr().out
    assert "rate-micro-batch" in out and "source" in out and "headrace" in out


def test_describe_prints_the_option_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["describe", "files"]) == 0
    out = capsys.readouterr().out
    assert "sink options:" in out and "partitionBy" in out and "parquet | arrow" in out


def test_describe_unknown_connector_suggests(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["describe", "fils"]) == 1
    assert "did you mean 'files'?" in capsys.readouterr().err


def test_run_prints_a_line_per_batch_and_writes(pipeline: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", str(pipeline)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert [ln.split(":")[0] for ln in lines] == ["[cli] batch 0", "[cli] batch 1", "[cli] batch 2"]
    assert "rows/s" in lines[0] and "backlog numRowsOutstanding=150" in lines[0]
    values = sorted(read_files(str(pipeline.parent / "out")).column("value").to_pylist())
    assert values == [2 * v for v in range(250)]


def test_run_json_prints_progress_reports(pipeline: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--json", str(pipeline)]) == 0
    reports = [json.loads(x) for x in capsys.readouterr().out.strip().splitlines()]
    assert [r["numInputRows"] for r in reports] == [100, 100, 50]


def test_validate_reports_every_problem(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = tmp_path / "bad.toml"
    p.write_text(PIPELINE.replace("rowsPerBatch = 100", "rowsPerBatc = 100").replace(
        'path = "out"', 'path = "out"\noptions = { format = "csv" }').replace("[transform]\nfunction = \"cli_transform:double\"\n", ""))  # fmt: skip
    assert main(["validate", str(p)]) == 1
    err = capsys.readouterr().err
    assert "source.rowsPerBatc: unknown option (did you mean 'rowsPerBatch'?)" in err
    assert "sink.format: 'csv' is not one of 'parquet', 'arrow'" in err
    assert "headrace describe rate-micro-batch" in err


def test_validate_ok(pipeline: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(pipeline)]) == 0
    assert "ok (rate-micro-batch -> files" in capsys.readouterr().out


def test_checkpoint_show_and_reset(pipeline: Path, capsys: pytest.CaptureFixture[str]) -> None:
    main(["run", str(pipeline)])
    capsys.readouterr()
    chk = str(pipeline.parent / "chk")
    assert main(["checkpoint", "show", "--json", chk]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["lastBatch"] == 2 and shown["lastCommitted"] == 2 and not shown["pendingReplay"]
    assert shown["metadata"]["name"] == "cli"
    assert main(["checkpoint", "reset", chk, "--to-batch", "0"]) == 0
    assert "rolled back batches 1..2" in capsys.readouterr().out
    assert main(["checkpoint", "show", str(pipeline.parent)]) == 1
    assert "not a headrace checkpoint" in capsys.readouterr().err
