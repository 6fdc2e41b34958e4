"""``headrace validate`` rejects what ``run`` would; Spark-style triggers; the run summary;
a second Ctrl-C."""

from __future__ import annotations

import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from headrace.cli import main
from headrace.testing import wait_for
from tests.cli_runner import start_cli

SOURCE = '[source]\nformat = "rate-micro-batch"\noptions = { rowsPerBatch = 10, totalRows = 30 }\n'


def write(tmp_path: Path, text: str) -> str:
    p = tmp_path / "p.toml"
    p.write_text(text)
    return str(p)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        (f'checkpoint = "c"\n{SOURCE}[sink]\nformat = "noop"\n[trigger]\nprocessing_time = "soon"\n', "is not a duration"),
        (f'checkpoint = "c"\n{SOURCE}[sink]\nformat = "noop"\n[trigger]\nprocessing_time = "99999999999 days"\n',
         "longer than the maximum"),
        (f'checkpoint = "c"\n{SOURCE}[sink]\nformat = "noop"\n[trigger]\nevery = "5 seconds"\n', "unknown trigger 'every'"),
        (f'checkpoint = "c"\n{SOURCE}[sink]\nformat = "noop"\n[trigger]\nonce = true\navailable_now = true\n',
         "exactly one of"),
        (f'checkpoint = "c"\n{SOURCE}[sink]\nformat = "files"\npath = "o"\noutput_mode = "complete"\n',
         "does not support output_mode"),
        (f'checkpoint = "c"\n{SOURCE}[sink]\nformat = "noop"\noutput_mode = "sideways"\n', "does not support output_mode"),
        (f'{SOURCE}[sink]\nformat = "files"\npath = "out"\n', "a checkpoint is required for sink 'files'"),
        (f'checkpoint = "c"\n{SOURCE}[sink]\nformat = "files"\npath = "out"\n[trigger]\nreal_time = "1 minute"\n',
         "does not support the real-time trigger"),
        ('checkpoint = "c"\n[source]\nformat = "rate-micro-batch"\nrowsPerBatch = 10\n[sink]\nformat = "noop"\n',
         "unknown key 'rowsPerBatch' in [source]: connector options go in its options table"),
        (f'checkpoint = "c"\n{SOURCE}[sink]\nformat = "noop"\ncheckpoint = "x"\n', "unknown key 'checkpoint' in [sink] (it belongs at the top level"),
        (f'checkpoint = "c"\n{SOURCE}[sink]\nformat = "noop"\noutputMode = "append"\n', "did you mean 'output_mode'?"),
        (f'checkpoint = "c"\npath = "x"\n{SOURCE}[sink]\nformat = "noop"\n', "it belongs in [source] or [sink]"),
    ],
    ids=["bad-interval", "huge-interval", "unknown-trigger-key", "two-triggers", "unsupported-mode", "unknown-mode",
         "missing-checkpoint", "real-time-sink-cannot", "option-in-source", "checkpoint-in-sink", "camel-output-mode",
         "path-at-top"],
)  # fmt: skip
def test_validate_rejects_what_run_would(tmp_path: Path, text: str, fragment: str,
                                         capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    p = write(tmp_path, text)
    assert main(["validate", p]) == 1
    err = capsys.readouterr().err
    assert fragment in err, err
    assert not (tmp_path / "c").exists(), "validate does no I/O"
    assert main(["run", p]) == 1
    assert fragment in capsys.readouterr().err


@pytest.mark.parametrize(
    ("trigger", "shown"),
    [
        ('processingTime = "5 seconds"', "processing_time = '5 seconds'"),
        ("availableNow = true", "available_now = True"),
        ('realTime = "1 minute"', "real_time = '1 minute'"),
        ('processing_time = "5 seconds"', "processing_time = '5 seconds'"),
    ],
    ids=["processingTime", "availableNow", "realTime", "snake-case"],
)
def test_spark_style_trigger_keys(tmp_path: Path, trigger: str, shown: str, capsys: pytest.CaptureFixture[str]) -> None:
    src = '[source]\nformat = "rate"\n' if "realTime" in trigger else SOURCE
    p = write(tmp_path, f'checkpoint = "c"\n{src}[sink]\nformat = "noop"\n[trigger]\n{trigger}\n')
    assert main(["validate", p]) == 0, capsys.readouterr().err
    assert shown in capsys.readouterr().out


@pytest.mark.parametrize(
    ("kwargs", "kind", "interval"),
    [
        ({"processingTime": "5 seconds"}, "processing_time", 5.0),
        ({"availableNow": True}, "available_now", 0.0),
        ({"realTime": "1 minute"}, "real_time", 60.0),
    ],
    ids=["processingTime", "availableNow", "realTime"],
)
def test_spark_style_trigger_keywords(kwargs: dict, kind: str, interval: float) -> None:
    import headrace as hr

    w = hr.read_stream.format("rate").load().write_stream.format("noop").trigger(**kwargs)
    assert (w._trigger.kind, w._trigger.interval) == (kind, interval)


def test_a_missing_trigger_means_available_now(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = write(tmp_path, f'checkpoint = "c"\n{SOURCE}[sink]\nformat = "noop"\n')
    assert main(["validate", p]) == 0
    assert "available_now = True" in capsys.readouterr().out


def test_the_summary_counts_every_batch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = write(tmp_path, 'checkpoint = "c"\n[source]\nformat = "rate-micro-batch"\n'
                        'options = { rowsPerBatch = 1, totalRows = 130 }\n'
                        '[sink]\nformat = "noop"\noptions = { checkpointFsync = false }\n')  # fmt: skip
    assert main(["run", p]) == 0
    assert "finished: 130 batches, 130 rows" in capsys.readouterr().err


def test_a_second_ctrl_c_stops_at_once(tmp_path: Path) -> None:
    (tmp_path / "slow_transform.py").write_text("import time\ndef slow(t):\n    time.sleep(120)\n    return t\n")
    p = write(tmp_path, f'checkpoint = "c"\n{SOURCE}[transform]\nfunction = "slow_transform:slow"\n'
                        '[sink]\nformat = "noop"\n')  # fmt: skip
    with start_cli("run", p, stderr=subprocess.PIPE) as proc:
        assert proc.stderr is not None
        try:
            wait_for(lambda: (tmp_path / "c" / "offsets" / "0").exists(), timeout=30, what="batch 0 started")
            proc.send_signal(signal.SIGINT)
            time.sleep(0.3)  # a first Ctrl-C waits for the batch (120 s here)
            assert proc.poll() is None
            t0 = time.monotonic()
            proc.send_signal(signal.SIGINT)
            assert proc.wait(10) == 130
            assert time.monotonic() - t0 < 5
            err = proc.stderr.read()
        finally:
            if proc.poll() is None:
                proc.kill()
    assert "stopped at once" in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("misplaced", "options"),
    [
        ('cloudFiles.format = "json"\n', ""),  # unquoted: TOML reads a nested table
        ('"cloudFiles.format" = "json"\n', ""),
        ('"cloudFiles.format" = "json"\n', 'options = { "cloudFiles.inferColumnTypes" = true }\n'),
    ],
    ids=["dotted-bare-key", "quoted-key", "beside-an-options-table"],
)
def test_the_options_table_hint_works_when_applied(tmp_path: Path, misplaced: str, options: str,
                                                   capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    source = f'[source]\nformat = "cloudFiles"\npath = "in"\n{options}{misplaced}'
    rest = 'checkpoint = "c"\n{source}[sink]\nformat = "noop"\n'
    p = write(tmp_path, rest.format(source=source))
    assert main(["validate", p]) == 1
    err = capsys.readouterr().err
    m = re.search(r"fix: write them as (options = \{.*?\}) under \[source\]", err)
    assert m, err
    assert '"cloudFiles.format" = "json"' in m.group(1), "the key is quoted, the value kept"
    fixed = f'[source]\nformat = "cloudFiles"\npath = "in"\n{m.group(1)}\n'
    Path(p).write_text(rest.format(source=fixed).replace('"json"', '"text"'))  # text needs no schema location
    assert main(["validate", p]) == 0, capsys.readouterr().err


def test_validate_reports_structure_options_and_trigger_problems_at_once(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    p = write(tmp_path, 'checkpoint = "c"\n[source]\nformat = "rate-micro-batch"\noptions = { rowsPerBatc = 10 }\n'
                        '[sink]\nformat = "files"\npath = "o"\noutput_mode = "complete"\n'
                        'options = { format = "csv", stateSnapshotInterval = 0 }\n[trigger]\nprocessing_time = "soon"\n')  # fmt: skip
    for command in ("validate", "run"):
        assert main([command, p]) == 1
        err = capsys.readouterr().err
        for fragment in ("is not a duration", "source.rowsPerBatc: unknown option", "sink.format: 'csv' is not one of",
                         "sink.stateSnapshotInterval: 0 is less than the minimum 1", "does not support output_mode",
                         "(6 problems)", "headrace describe rate-micro-batch"):  # fmt: skip
            assert fragment in err, err
    assert not (tmp_path / "c").exists()
