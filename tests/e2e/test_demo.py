"""The README's demo pipeline, end to end: JSON files -> cloudFiles -> transform -> Delta,
run by `headrace run`, twice (the second run picks up only new files), and killed at every
engine crash point on the way: every order lands in the table exactly once."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("deltalake", reason="the demo needs headrace-delta: pip install -e plugins/delta")
pytest.importorskip("headrace_cloudfiles", reason="the demo needs headrace-cloudfiles: pip install -e plugins/cloudfiles")

from deltalake import DeltaTable

from headrace.testing import CRASH_POINTS
from tests.cli_runner import cli_env, run_cli

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "examples" / "demo"


@pytest.fixture
def demo(tmp_path: Path) -> Path:
    for name in ("pipeline.toml", "transform.py", "make_data.py"):
        shutil.copy(DEMO / name, tmp_path / name)
    text = (tmp_path / "pipeline.toml").read_text().replace("../../.demo/", "./")
    (tmp_path / "pipeline.toml").write_text(text)
    return tmp_path


def make_data(demo: Path, files: int, start: int = 0) -> None:
    subprocess.run([sys.executable, str(demo / "make_data.py"), str(demo / "input"), "--files", str(files),
                    "--rows", "50", "--start", str(start)], check=True, capture_output=True)  # fmt: skip


def run(demo: Path, crash: str | None = None) -> subprocess.CompletedProcess[str]:
    return run_cli("run", demo / "pipeline.toml", env=cli_env(crash=crash), timeout=180, script=True)


def order_ids(demo: Path) -> list[int]:
    return DeltaTable(str(demo / "orders")).to_pyarrow_table(columns=["order_id"]).column("order_id").to_pylist()


def test_demo_ingests_incrementally(demo: Path) -> None:
    make_data(demo, files=20)
    first = run(demo)
    assert first.returncode == 0, first.stderr
    assert first.stdout.count("[orders-demo] batch") == 3  # 20 files, 8 per trigger
    assert "numFilesOutstanding=0" in first.stdout.splitlines()[-1]
    assert sorted(order_ids(demo)) == list(range(1000))
    make_data(demo, files=5, start=20)
    second = run(demo)
    assert second.returncode == 0, second.stderr
    assert second.stdout.count("[orders-demo] batch") == 1
    assert sorted(order_ids(demo)) == list(range(1250))
    table = DeltaTable(str(demo / "orders")).to_pyarrow_table()
    assert {"amount_gross", "size"} <= set(table.column_names)


@pytest.mark.slow
def test_demo_survives_a_kill_at_every_crash_point(demo: Path) -> None:
    make_data(demo, files=24)
    kills = 0
    for batch, point in enumerate(CRASH_POINTS):
        result = run(demo, crash=f"{point}:{batch % 3}")
        assert result.returncode in (0, -9), result.stderr
        kills += result.returncode == -9
    assert kills >= 3, "the crash points were not reached"
    final = run(demo)
    assert final.returncode == 0, final.stderr
    ids = order_ids(demo)
    assert len(ids) == len(set(ids)) == 1200, f"{len(ids)} rows, {len(set(ids))} distinct"
