"""The kit's pytest plugin (entry point ``pytest11``) registers its markers: a project running
with ``--strict-markers`` and no marker configuration can select the kit's tests by them."""

from __future__ import annotations

import os
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


def test_the_random_kill_seed_is_printed_and_can_be_fixed(tmp_path: Path) -> None:
    (tmp_path / "test_x.py").write_text(
        "from headrace.testing._kills import kit_seed\n"
        "def test_seed():\n    print('SEED', kit_seed())\n"
    )

    def run(*args: str, env: dict[str, str] | None = None) -> str:
        proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-s", *args], cwd=tmp_path,
                              capture_output=True, text=True, timeout=120, check=False,
                              env={**os.environ, **(env or {})})  # fmt: skip
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc.stdout

    fixed = run("--headrace-seed=4242")
    assert "random-kill seed 4242 (reproduce with --headrace-seed=4242" in fixed and "SEED 4242" in fixed
    assert "SEED 77" in run(env={"HEADRACE_KIT_SEED": "77"})
    drawn = run(env={"HEADRACE_KIT_SEED": ""})
    seed = drawn.split("random-kill seed ", 1)[1].split(" ", 1)[0]
    assert f"SEED {seed}" in drawn  # the one printed is the one the kills use


def test_every_xdist_worker_uses_the_seed_the_header_prints(tmp_path: Path) -> None:
    (tmp_path / "test_x.py").write_text(
        "import os\nimport pytest\nfrom headrace.testing._kills import kit_seed\n"
        "@pytest.mark.parametrize('i', range(8))\n"
        "def test_seed(i):\n"
        "    with open(f'seed-{os.environ[\"PYTEST_XDIST_WORKER\"]}', 'w') as f:\n"
        "        f.write(str(kit_seed()))\n"
    )
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2", "--dist", "load"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
                          env={**os.environ, "HEADRACE_KIT_SEED": ""})  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    printed = proc.stdout.split("random-kill seed ", 1)[1].split(" ", 1)[0]
    used = {f.name: f.read_text() for f in tmp_path.glob("seed-gw*")}
    assert len(used) == 2 and set(used.values()) == {printed}, (printed, used)
