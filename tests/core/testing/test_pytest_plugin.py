"""The kit's pytest plugin (entry point ``pytest11``) registers its markers: a project running
with ``--strict-markers`` and no marker configuration can select the kit's tests by them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_strict_markers_work_without_configuration(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text('[tool.pytest.ini_options]\naddopts = "--strict-markers"\n')
    (tmp_path / "test_x.py").write_text(
        "import pytest\n"
        "@pytest.mark.slow\n@pytest.mark.headrace_kill\ndef test_kill():\n    pass\n"
        "def test_fast():\n    pass\n"
    )
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 passed, 1 deselected" in run.stdout
    markers = subprocess.run([sys.executable, "-m", "pytest", "--markers"], cwd=tmp_path, capture_output=True,
                             text=True, timeout=120, check=False).stdout  # fmt: skip
    assert "@pytest.mark.headrace_kill:" in markers and "@pytest.mark.slow:" in markers
