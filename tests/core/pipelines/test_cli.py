"""`headrace pipelines init demo && cd demo && headrace pipelines run`, graph and events."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from headrace.cli import main
from tests.cli_runner import run_cli
from tests.core.pipelines.conftest import MakeProject


def test_init_run_graph_events(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["pipelines", "init", "demo"]) == 0
    assert main(["pipelines", "init", "demo"]) == 1  # never overwrites
    monkeypatch.chdir(tmp_path / "demo")
    capsys.readouterr()
    assert main(["pipelines", "run"]) == 0
    out = capsys.readouterr().out
    # one progress line per flow per batch, a line per materialized view
    assert out.count("[orders_bronze] batch 0: 200 rows") == 1
    assert "[orders_silver] batch 0" in out and "positive_amount=" in out
    assert "revenue_by_region: materialized view recomputed, 3 rows" in out

    subprocess.run([sys.executable, "add_orders.py"], check=True, capture_output=True)
    assert main(["pipelines", "run"]) == 0
    out = capsys.readouterr().out
    assert "[orders_bronze] batch 1: 100 rows" in out and "batch 0" not in out

    assert main(["pipelines", "graph", "-o", "g.svg"]) == 0
    cap = capsys.readouterr()
    assert "orders_bronze  (streaming table, 300 rows, version 1, updated " in cap.out
    assert "<- orders_bronze (stream)" in cap.out and "<- regions (batch)" in cap.out
    dot = (tmp_path / "demo" / "g.dot").read_text()
    assert '"orders_silver" -> "revenue_by_region" [style=dashed];' in dot and "300 rows" in dot
    if shutil.which("dot"):
        assert (tmp_path / "demo" / "g.svg").read_text().lstrip().startswith(("<?xml", "<svg"))
    else:
        assert "graphviz's `dot` is not installed" in cap.err and not (tmp_path / "demo" / "g.svg").exists()

    assert main(["pipelines", "events", "--last", "--json"]) == 0
    events = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    types = [e["event_type"] for e in events]
    assert types[0] == "create_update" and types[-1] == "update_progress"
    assert events[-1]["details"]["update_progress"]["state"] == "COMPLETED"
    assert len({e["origin"]["update_id"] for e in events}) == 1
    assert main(["pipelines", "events", "--type", "create_update"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2  # two runs


def test_fresh_project_in_subprocess(tmp_path: Path) -> None:
    """The documented commands, as a user types them (the `headrace` entry point)."""
    init = run_cli("pipelines", "init", "demo", cwd=tmp_path, script=True)
    assert init.returncode == 0, init.stderr
    res = run_cli("pipelines", "run", cwd=tmp_path / "demo", script=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert "completed (6 flows: 6 completed)" in res.stderr
    assert os.path.isdir(tmp_path / "demo" / "storage" / "tables" / "big_orders_by_region" / "_delta_log")


def test_refresh_selection_errors(make_project: MakeProject, capsys: pytest.CaptureFixture[str]) -> None:
    p = make_project()
    spec = ["--spec", p.path("pipeline.yml")]
    with pytest.raises(SystemExit):
        main(["pipelines", "run", *spec, "--full-refresh", "silver", "--full-refresh-all"])
    assert main(["pipelines", "run", *spec, "--refresh", "silvr"]) == 1
    err = capsys.readouterr().err
    assert "unknown dataset ['silvr']" in err and "bronze, dims, gold, silver" in err
    assert main(["pipelines", "run", *spec, "--full-refresh-all", "--refresh", "gold"]) == 1
    assert "--full-refresh-all refreshes everything" in capsys.readouterr().err
