"""``headrace new-plugin``: the files it writes, for a source, a sink or both. (The generated
plugin is installed in a fresh venv and passes the contract kit in scripts/check_wheels.sh; the
example plugin examples/headrace-sqlite is its output, tested in the main suite.)"""

from __future__ import annotations

import filecmp
import py_compile
from pathlib import Path

import pytest

from headrace.cli import main
from headrace.errors import HeadraceError
from headrace.scaffold import new_plugin, render

ROOT = Path(__file__).resolve().parents[2]


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def test_both_roles(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["new-plugin", "my-db", "--dir", str(tmp_path / "p")]) == 0
    assert "pip install -e" in capsys.readouterr().out
    out = tmp_path / "p"
    assert _files(out) == {
        "README.md", "pyproject.toml", "tests/test_contract.py",
        *(f"src/headrace_my_db/{f}" for f in ("__init__.py", "_options.py", "_plugin.py", "py.typed", "source.py", "sink.py")),
    }  # fmt: skip
    pyproject = (out / "pyproject.toml").read_text()
    assert 'name = "headrace-my-db"' in pyproject
    assert '[project.entry-points.headrace]\nmy-db = "headrace_my_db._plugin"' in pyproject
    plugin = (out / "src/headrace_my_db/_plugin.py").read_text()
    assert 'source="headrace_my_db.source:MyDbSource"' in plugin and 'sink="headrace_my_db.sink:MyDbSink"' in plugin
    for f in out.rglob("*.py"):
        py_compile.compile(str(f), doraise=True)


@pytest.mark.parametrize("role", ["--source", "--sink"])
def test_one_role(tmp_path: Path, role: str) -> None:
    assert main(["new-plugin", "acme", role, "--dir", str(tmp_path)]) == 0
    files = _files(tmp_path)
    other = "sink" if role == "--source" else "source"
    assert f"src/headrace_acme/{role[2:]}.py" in files and f"src/headrace_acme/{other}.py" not in files
    for name in ("_plugin.py", "_options.py"):
        assert other.upper() + "_OPTIONS" not in (tmp_path / "src/headrace_acme" / name).read_text()
    tests = (tmp_path / "tests/test_contract.py").read_text()
    assert ("SourceContract" in tests) == (role == "--source") and ("SinkContract" in tests) == (role == "--sink")
    for f in tmp_path.rglob("*.py"):
        py_compile.compile(str(f), doraise=True)


def test_bad_name_and_existing_folder_are_refused(tmp_path: Path) -> None:
    with pytest.raises(HeadraceError, match="plugin name 'My DB' is not valid"):
        new_plugin("My DB", directory=tmp_path / "x")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    with pytest.raises(HeadraceError, match="exists and is not empty"):
        new_plugin("acme", directory=tmp_path / "full")


def test_render_blocks() -> None:
    text = "a{{#source}}S{{/source}}{{#sink}}K{{/sink}}\n{{#both}}\nboth\n{{/both}}\n{{name}}"
    assert render(text, {"name": "n"}, {"source": True, "sink": False, "both": False}) == "aS\nn"
    with pytest.raises(AssertionError, match="left unfilled"):
        render("{{nope}}", {}, {})


def test_the_example_plugin_is_the_scaffolds_output(tmp_path: Path) -> None:
    new_plugin("sqlite", directory=tmp_path / "gen")
    example = ROOT / "examples" / "headrace-sqlite"
    gen = tmp_path / "gen"
    assert _files(gen) <= _files(example)
    differ = [f for f in sorted(_files(gen)) if not filecmp.cmp(gen / f, example / f, shallow=False)]
    assert not differ, f"examples/headrace-sqlite differs from `headrace new-plugin sqlite` in {differ}; regenerate it"
