"""Output sized for people: ``checkpoint show``'s summary (the JSON behind ``--json``),
``describe`` wrapped to the terminal, counts in the right number."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from headrace.cli import FIXED_WIDTH, main, terminal_width, wrap
from tests.cli_runner import run_cli


def _stateful_checkpoint(tmp_path: Path) -> str:
    import headrace as hr

    chk = str(tmp_path / "chk")
    q = (hr.read_stream.format("rate-micro-batch").options(rowsPerBatch=100, totalRows=300).load()
         .sql("SELECT value % 7 AS k FROM batch").group_by("k").agg("count(*) AS n")
         .write_stream.format("noop").output_mode("update").query_name("counts")
         .option("checkpointLocation", chk).trigger(available_now=True).start())  # fmt: skip
    assert q.await_termination(60)
    return chk


def test_checkpoint_show_is_a_summary_and_json_is_everything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    chk = _stateful_checkpoint(tmp_path)
    assert main(["checkpoint", "show", chk]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == f"checkpoint {chk}"
    assert lines[1].split(":", 1)[1].strip().startswith("counts (id ")
    assert "batches:        3 batches (0..2); last committed 2" in out
    assert "last run:       finished, started " in out
    assert "0: rate-micro-batch" in out and 'last batch {"rows":200} -> {"rows":300}' in out
    assert "0: stateStoreSave, 7 rows, " in out and " in memory" in out
    assert "    on disk: state/" in out
    assert "sink:           noop" in out
    assert len(lines) < 20 and all(len(x) <= FIXED_WIDTH for x in lines), out
    assert main(["checkpoint", "show", "--json", chk]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["lastCommitted"] == 2 and [p["batchId"] for p in shown["recentProgress"]] == [0, 1, 2]


def test_checkpoint_show_names_the_batches_to_replay(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    chk = _stateful_checkpoint(tmp_path)
    assert main(["checkpoint", "reset", chk, "--to-batch", "0"]) == 0
    capsys.readouterr()
    assert main(["checkpoint", "show", chk]) == 0
    assert "last committed 0; batches 1..2 replayed on the next run" in capsys.readouterr().out


def test_describe_fits_the_fixed_width_when_not_a_terminal() -> None:
    out = run_cli("describe", "cloudFiles", timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert (
        "  cloudFiles.format  (json | csv | parquet | text | binaryFile | avro | orc | xml; required)"
        in lines
    )
    too_long = [x for x in lines if len(x) > FIXED_WIDTH and " " in x.strip()]
    assert not too_long, too_long


def test_the_terminal_width_is_used_when_stdout_is_one(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setenv("COLUMNS", "60")
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True, raising=False)
    assert terminal_width() == 60
    assert all(len(x) <= 60 for x in wrap("word " * 40, indent="  "))
    monkeypatch.setattr(sys.stdout, "isatty", lambda: False, raising=False)
    assert terminal_width() == FIXED_WIDTH


@pytest.mark.parametrize(("n", "noun", "shown"), [(0, "row", "0 rows"), (1, "row", "1 row"), (2, "batch", "2 batches"),
                                                  (1, "batch", "1 batch"), (1000, "flow", "1,000 flows")],
                         ids=["zero", "one-row", "two-batches", "one-batch", "thousands"])  # fmt: skip
def test_counted(n: int, noun: str, shown: str) -> None:
    from headrace._words import counted

    assert counted(n, noun) == shown


def test_run_summary_and_progress_lines_say_one_batch_one_row(tmp_path: Path) -> None:
    p = tmp_path / "p.toml"
    p.write_text('checkpoint = "c"\n[source]\nformat = "rate-micro-batch"\noptions = { rowsPerBatch = 1, totalRows = 1 }\n'
                 '[sink]\nformat = "noop"\n')  # fmt: skip
    out = run_cli("run", p, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "batch 0: 1 row in " in out.stdout
    assert "finished: 1 batch, 1 row" in out.stderr
