"""SIGKILL of `headrace pipelines run` at random moments: after a final run every table holds
exactly what a clean run gives."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import time

import pytest

from tests.cli_runner import cli_command, cli_env
from tests.core.pipelines.conftest import MakeProject, Project, actual, expected


def _cmd(p: Project, *extra: str) -> list[str]:
    return cli_command("pipelines", "run", "--spec", p.path("pipeline.yml"), *extra)


def _env(crash: str | None = None) -> dict[str, str]:
    return cli_env(crash=crash)


def _run_to_end(p: Project, *extra: str) -> None:
    res = subprocess.run(_cmd(p, *extra), capture_output=True, text=True, env=_env(), timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]


def _killed_run(p: Project, delay: float, *extra: str) -> int:
    proc = subprocess.Popen(_cmd(p, *extra), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=_env())
    try:
        proc.wait(timeout=delay)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    return proc.returncode


@pytest.mark.parametrize("language", ["python", "sql"])
def test_sigkill_at_random_moments(make_project: MakeProject, language: str) -> None:
    rng = random.Random(14)
    p = make_project(language)
    rows = p.add_files(12, rows=30)  # 6 batches per streaming table (maxFilesPerTrigger 2)
    # how long a clean run takes here, to spread the kills over it
    clean = make_project(language, name="clean")
    for name in os.listdir(p.path("landing")):
        shutil.copy(p.path("landing", name), clean.path("landing", name))
    t0 = time.monotonic()
    _run_to_end(clean)
    took = time.monotonic() - t0
    want = actual(clean)
    assert want == expected(rows)

    kills = 0
    for i in range(8):  # until 4 runs died by SIGKILL (a short rerun may finish before its kill)
        rc = _killed_run(p, rng.uniform(0.3, took), *(("--full-refresh-all",) if i == 3 else ()))
        kills += rc == -9
        if kills >= 4:
            break
        if i == 2:  # new data between crashes
            new = p.add_files(2, rows=30)
            rows += new
            for name in sorted(os.listdir(p.path("landing")))[-2:]:
                shutil.copy(p.path("landing", name), clean.path("landing", name))
    assert kills >= 3, f"only {kills} runs were killed mid-way"
    _run_to_end(p)
    _run_to_end(clean)
    assert actual(p) == actual(clean) == expected(rows)


@pytest.mark.parametrize("point", ["after_offsets:1", "before_sink_commit:2", "after_sink_commit:1", "after_commit:0"])
def test_crash_points_in_flows(make_project: MakeProject, point: str) -> None:
    p = make_project()
    rows = p.add_files(8, rows=10)
    res = subprocess.run(_cmd(p), capture_output=True, text=True, env=_env(point), timeout=300)
    assert res.returncode == -9, res.stderr[-2000:]
    _run_to_end(p)
    assert actual(p) == expected(rows)
