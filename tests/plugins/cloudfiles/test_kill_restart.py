"""SIGKILL a cloudFiles -> files pipeline mid-batch (engine crash points and random times),
with several batches, cleanSource MOVE and files arriving between runs: every row exactly once,
every file moved once its batch committed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from headrace.testing import run_pipeline
from tests.plugins.cloudfiles.helpers import output, write_json

FILES = 12
ROWS = 4


def spec(tmp_path: Path) -> dict[str, Any]:
    return {
        "source": {"format": "cloudFiles", "path": str(tmp_path / "in"), "options": {
            "cloudFiles.format": "json", "cloudFiles.inferColumnTypes": "true",
            "cloudFiles.schemaLocation": str(tmp_path / "schema"), "cloudFiles.maxFilesPerTrigger": 3,
            "cloudFiles.cleanSource": "MOVE", "cloudFiles.cleanSource.moveDestination": str(tmp_path / "archive"),
            "cloudFiles.cleanSource.retentionDuration": "0s"}},
        "sink": {"format": "files", "options": {"path": str(tmp_path / "out"), "format": "arrow"}},
        "checkpoint": str(tmp_path / "chk"),
        "trigger": {"available_now": True},
    }  # fmt: skip


def seed(tmp_path: Path, lo: int, hi: int) -> None:
    for f in range(lo, hi):
        write_json(tmp_path / "in", f"f{f:04d}.json", [{"id": f * ROWS + k} for k in range(ROWS)])


def check(tmp_path: Path, files: int) -> None:
    got = output(tmp_path / "out").column("id").to_pylist()
    assert sorted(got) == list(range(files * ROWS)), f"{len(got) - len(set(got))} duplicates, {files * ROWS - len(set(got))} missing"
    assert sorted(p.name for p in (tmp_path / "archive").iterdir()) == [f"f{f:04d}.json" for f in range(files)]
    assert not list((tmp_path / "in").iterdir())


@pytest.mark.slow
@pytest.mark.parametrize("crash", ["mid_write:1", "after_sink_commit:2"])  # the contract suite covers every point at batch 0
def test_crash_point_then_restart(tmp_path: Path, crash: str) -> None:
    seed(tmp_path, 0, FILES)
    first = run_pipeline(spec(tmp_path), crash=crash, timeout=60)
    assert first.killed, f"crash point {crash} not reached:\n{first.stderr[-2000:]}"
    seed(tmp_path, FILES, FILES + 2)  # files arriving while the pipeline is down
    last = run_pipeline(spec(tmp_path), timeout=60).check()
    check(tmp_path, FILES + 2)
    progress = json.loads(last.stdout.strip().splitlines()[-1])["lastProgress"]
    assert progress["sources"][0]["metrics"]["numFilesOutstanding"] == 0


@pytest.mark.slow
def test_random_kills_then_restart(tmp_path: Path) -> None:
    seed(tmp_path, 0, FILES)
    for delay in (0.9, 1.3, 1.7):
        run_pipeline(spec(tmp_path), kill_after=delay, timeout=60)
    run_pipeline(spec(tmp_path), timeout=60).check()
    check(tmp_path, FILES)
