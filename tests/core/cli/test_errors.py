"""No traceback ever reaches a user of the ``headrace`` command."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from headrace.cli import main
from tests.cli_runner import cli_shell, run_cli, start_cli


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, cwd=cwd, timeout=60)


def assert_one_line_error(out: subprocess.CompletedProcess[str], fragment: str) -> None:
    assert out.returncode != 0
    assert "Traceback" not in out.stderr, out.stderr
    lines = [ln for ln in out.stderr.splitlines() if ln.startswith("headrace: error:")]
    assert lines, out.stderr
    assert fragment in out.stderr, out.stderr


def test_run_of_a_folder(tmp_path: Path) -> None:
    assert_one_line_error(run("run", str(tmp_path)), "is a folder; give the pipeline's TOML file")


def test_a_non_utf8_pipeline(tmp_path: Path) -> None:
    p = tmp_path / "p.toml"
    p.write_bytes(b'name = "caf\xe9"\n')
    assert_one_line_error(run("validate", str(p)), "is not UTF-8")


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ('source = "rate"\n[sink]\nformat = "noop"\n', "'source' in top level must be a table"),
        ('[source]\nformat = "rate"\noptions = "rowsPerSecond=5"\n[sink]\nformat = "noop"\n', "'options' in [source] must be a table"),
        ('[source]\nformat = 5\n[sink]\nformat = "noop"\n', "'format' in [source] must be a string"),
        ('name = ["x"]\n[source]\nformat = "rate"\n[sink]\nformat = "noop"\n', "'name' in top level must be a string"),
        ('[source]\nformat = "rate"\n[sink]\nformat = "noop"\n[transform]\nfunction = 3\n', "'function' in [transform]"),
        ("[source\n", "is not valid TOML"),
    ],
    ids=["source-not-a-table", "options-not-a-table", "format-not-a-string", "name-a-list", "function-an-int", "bad-toml"],
)
def test_mistyped_toml_is_one_line(tmp_path: Path, text: str, fragment: str) -> None:
    p = tmp_path / "p.toml"
    p.write_text(text)
    for cmd in ("validate", "run"):
        assert_one_line_error(run(cmd, str(p)), fragment)


def test_a_closed_stdout_ends_quietly() -> None:
    with start_cli("describe", "rate", stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=False) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()  # like `| head -0`: the reader is gone before anything is written
        err = proc.stderr.read().decode()
        proc.wait(30)
    assert "Traceback" not in err and "BrokenPipeError" not in err and "Exception ignored" not in err, err


def test_describe_piped_into_head() -> None:
    out = subprocess.run(cli_shell("describe", "rate", pipe="head -1"), shell=True, capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    assert out.stdout.startswith("rate")
    assert "Traceback" not in out.stderr and "Exception ignored" not in out.stderr, out.stderr


def test_an_unexpected_exception_is_one_line_and_debug_shows_it(monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    import headrace.cli.connectors as mod

    def boom(args: object) -> int:
        raise ZeroDivisionError("division by zero somewhere deep")

    monkeypatch.setattr(mod, "_connectors", boom)
    assert main(["connectors"]) == 1
    err = capsys.readouterr().err
    assert err.strip() == "headrace: error: ZeroDivisionError: division by zero somewhere deep (run with --debug for the traceback)"
    assert main(["--debug", "connectors"]) == 1
    assert "Traceback" in capsys.readouterr().err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib.metadata import version

    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"headrace {version('headrace')}"


@pytest.mark.parametrize(
    ("name", "expected", "not_expected"),
    [
        ("kafak", "did you mean 'kafka'?", "pip install headrace-kafak"),
        ("my-own-thing", "install the one that provides it", "pip install headrace-my-own-thing"),
    ],
    ids=["typo", "unknown"],
)
def test_unknown_connector_hint_invents_no_package(capsys: pytest.CaptureFixture[str], name: str, expected: str,
                                                   not_expected: str) -> None:  # fmt: skip
    assert main(["describe", name]) == 1
    err = capsys.readouterr().err
    assert expected in err and not_expected not in err
    assert "pip install headrace-" not in err


def test_a_first_party_connector_not_installed_names_its_distribution() -> None:
    from headrace.errors import ConnectorNotFoundError
    from headrace.plugins import Registry

    with pytest.raises(ConnectorNotFoundError, match="pip install headrace-kafka"):
        Registry(load_entry_points=False).get("kafka")


def test_run_piped_into_head_stops_cleanly(tmp_path: Path) -> None:
    p = tmp_path / "p.toml"
    p.write_text('checkpoint = "c"\n[source]\nformat = "rate-micro-batch"\noptions = { rowsPerBatch = 1 }\n'
                 '[sink]\nformat = "noop"\noptions = { checkpointFsync = false }\n[trigger]\nprocessing_time = "10 ms"\n')  # fmt: skip
    out = subprocess.run(cli_shell("run", p, pipe="head -2"), shell=True, capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    assert len(out.stdout.splitlines()) == 2
    assert "Traceback" not in out.stderr and "error" not in out.stderr, out.stderr


@pytest.mark.parametrize("cmd", ["run", "validate"])
def test_a_device_is_not_read_as_a_pipeline(cmd: str) -> None:
    # /dev/zero never ends: it is refused before a byte is read (a timeout here means it was read)
    out = run_cli(cmd, "/dev/zero", timeout=30)
    assert_one_line_error(out, "pipeline file '/dev/zero' is not a regular file")


def test_a_fifo_is_not_opened_as_a_pipeline(tmp_path: Path) -> None:
    import os

    os.mkfifo(tmp_path / "p.toml")  # nobody writes to it: opening it to read would block
    assert_one_line_error(run_cli("run", str(tmp_path / "p.toml"), timeout=30), "is not a regular file")


def test_a_pipeline_file_too_large_is_refused(tmp_path: Path) -> None:
    from headrace._textfile import MAX_DEFINITION_BYTES

    p = tmp_path / "p.toml"
    with open(p, "wb") as f:
        f.write(b"#" * (MAX_DEFINITION_BYTES + 1))
    assert_one_line_error(run("validate", str(p)), "is larger than 8 MiB")


def test_a_deeply_nested_pipeline_file_is_a_clear_error(tmp_path: Path) -> None:
    p = tmp_path / "p.toml"
    p.write_text("name = " + "[" * 100_000 + "]" * 100_000 + "\n")
    out = run("validate", str(p))
    assert_one_line_error(out, "nests arrays or tables too deeply")
    assert "RecursionError" not in out.stderr
