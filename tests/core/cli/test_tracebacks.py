"""Without ``--debug`` no failure prints a traceback, also failures inside queries and pipeline
flows; with ``--debug`` the traceback is there. Every hint the command prints is applied."""

from __future__ import annotations

import re
import subprocess
import textwrap
from pathlib import Path

import pytest

from tests.cli_runner import cli_env, run_cli


def _both(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess[str], ...]:
    """The command as typed, then with --debug (each on the same state)."""
    return run_cli(*args, cwd=cwd, env=env, timeout=120), run_cli(
        "--debug", *args, cwd=cwd, env=env, timeout=120
    )


def _no_traceback(out: subprocess.CompletedProcess[str], fragment: str) -> None:
    assert out.returncode != 0, out.stderr
    assert "Traceback" not in out.stderr and "Traceback" not in out.stdout, out.stderr
    assert fragment in out.stderr + out.stdout, out.stderr


JSON_TO_DELTA = """\
name = "events"
checkpoint = "cp"
[source]
format = "cloudFiles"
path = "in"
options = { "cloudFiles.format" = "json", "cloudFiles.schemaLocation" = "schema" }
[sink]
format = "delta"
path = "out"
"""


def test_a_bad_option(tmp_path: Path) -> None:
    p = tmp_path / "p.toml"
    p.write_text(JSON_TO_DELTA.replace('"cloudFiles.format" = "json"', '"cloudFiles.format" = "jsn"'))
    plain, debug = _both("run", str(p), cwd=tmp_path)
    _no_traceback(plain, "cloudFiles.format")
    assert "Traceback" in debug.stderr


def test_a_failing_query(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "1.json").write_text('{"a": 1}\n')
    (tmp_path / "broken_step.py").write_text("def step(t):\n    raise ValueError('the step broke')\n")
    p = tmp_path / "p.toml"
    p.write_text(JSON_TO_DELTA + '[transform]\nfunction = "broken_step:step"\n')
    plain = run_cli("run", str(p), cwd=tmp_path, timeout=120)
    _no_traceback(plain, "headrace: error: query 'events' failed in batch 0: ValueError: the step broke")
    assert plain.stderr.count("the step broke") == 1, "one error line, not the log record too"
    debug = run_cli("--debug", "run", str(p), cwd=tmp_path, timeout=120)
    assert "Traceback" in debug.stderr and "raise ValueError('the step broke')" in debug.stderr


def test_a_schema_change_into_delta_and_its_hint_applied(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "1.json").write_text('{"a": 1, "b": "x"}\n')
    p = tmp_path / "p.toml"
    p.write_text(JSON_TO_DELTA)
    first = run_cli("run", str(p), cwd=tmp_path, timeout=120)
    assert first.returncode == 0, first.stderr
    (tmp_path / "in" / "2.json").write_text('{"a": 2, "b": "y", "c": 3}\n')
    # cloudFiles stops the stream at the new column (documented), the restart meets the table
    _no_traceback(run_cli("run", str(p), cwd=tmp_path, timeout=120), "new column(s) 'c'")
    plain, debug = _both("run", str(p), cwd=tmp_path)
    _no_traceback(plain, "mergeSchema")
    assert "Traceback" in debug.stderr
    m = re.search(r"in a pipeline file: (options = \{.*?\}) under \[sink\]", plain.stderr)
    assert m, plain.stderr
    p.write_text(JSON_TO_DELTA + m.group(1) + "\n")  # the hint as printed, under [sink]
    fixed = run_cli("run", str(p), cwd=tmp_path, timeout=120)
    assert fixed.returncode == 0, fixed.stderr
    assert "finished: 1 batch, 1 row" in fixed.stderr


def _pipeline(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "proj"
    (root / "transformations").mkdir(parents=True)
    (root / "landing").mkdir()
    (root / "landing" / "a.json").write_text('{"x": 1}\n')
    (root / "pipeline.yml").write_text(
        "name: t\nstorage: storage\nlibraries:\n  - glob:\n      include: transformations/**\n"
    )
    for name, text in files.items():
        (root / "transformations" / name).write_text(textwrap.dedent(text))
    return root


def test_a_failing_pipeline_flow(tmp_path: Path) -> None:
    root = _pipeline(
        tmp_path,
        {
            "f.py": """\
        import headrace as hr
        import headrace.pipelines as dp

        def boom(t):
            raise ValueError("the flow broke")

        @dp.table
        def bronze():
            return hr.read_stream.format("cloudFiles").option("cloudFiles.format", "json").load("landing").map_batches(boom)
        """
        },
    )
    plain = run_cli("pipelines", "run", cwd=root, timeout=120)
    _no_traceback(plain, "bronze: FAILED: ValueError: the flow broke")
    assert "failed (1 flow: 1 failed; failed: bronze)" in plain.stderr
    debug = run_cli("--debug", "pipelines", "run", cwd=root, timeout=120)
    assert debug.returncode == 1 and "Traceback" in debug.stderr


@pytest.mark.parametrize("command", ["dry-run", "run"])
def test_a_bad_sql_file(tmp_path: Path, command: str) -> None:
    root = _pipeline(
        tmp_path, {"q.sql": "-- orders\nCREATE OR REFRESH MATERIALIZED VIEW v AS\nSELEC * FROM x;\n"}
    )
    plain, debug = _both("pipelines", command, cwd=root)
    _no_traceback(plain, "q.sql:3:9: v: SQL syntax error: unexpected 'FROM'")
    assert "\x1b" not in plain.stderr and "sqlglot" not in plain.stderr
    assert "Traceback" in debug.stderr


_THREAD_FAILS = """
import sys, threading
import headrace.cli.connectors as mod
from headrace.cli import main

def fail():
    raise RuntimeError("a helper thread broke")

def command(args):
    t = threading.Thread(target=fail, name="helper")
    t.start()
    t.join()
    return 0

mod._connectors = command
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("debug", [False, True], ids=["plain", "debug"])
def test_an_exception_in_a_thread_is_one_line(debug: bool) -> None:
    import sys

    args = [sys.executable, "-c", _THREAD_FAILS, *(["--debug"] if debug else []), "connectors"]
    out = subprocess.run(args, capture_output=True, text=True, env=cli_env(), timeout=60, check=False)
    assert "thread helper failed: RuntimeError: a helper thread broke" in out.stderr, out.stderr
    assert ("Traceback" in out.stderr) is debug, out.stderr
