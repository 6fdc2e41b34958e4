"""The dashboard's server: discovery of checkpoints, the JSON API, `headrace ui` / `run --ui`."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

import headrace as hr
from headrace.cli import main
from headrace.testing import wait_for
from headrace.ui.catalog import Catalog, find_checkpoints
from tests.cli_runner import cli_env, start_cli

pytest.importorskip("starlette")
from headrace.ui import start_ui


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def _finished(chk: Path, name: str, total: int = 30) -> hr.StreamingQuery:
    q = (hr.read_stream.format("rate-micro-batch").options(rowsPerBatch=10, totalRows=total).load()
         .write_stream.format("noop").option("checkpointLocation", str(chk)).query_name(name)
         .trigger(available_now=True).start())  # fmt: skip
    assert q.await_termination(30)
    return q


def test_checkpoints_are_found_under_folders(tmp_path: Path) -> None:
    _finished(tmp_path / "a" / "chk", "qa")
    _finished(tmp_path / "b" / "c" / "chk", "qb")
    (tmp_path / "not-a-checkpoint").mkdir()
    assert find_checkpoints(str(tmp_path)) == [str(tmp_path / "a" / "chk"), str(tmp_path / "b" / "c" / "chk")]
    assert find_checkpoints(str(tmp_path / "a" / "chk")) == [str(tmp_path / "a" / "chk")]
    assert find_checkpoints(str(tmp_path), max_depth=1) == []
    names = [q["name"] for q in Catalog([str(tmp_path)]).queries()]
    assert names == ["qa", "qb"]


def test_api_lists_queries_and_serves_progress_incrementally(tmp_path: Path) -> None:
    q = _finished(tmp_path / "chk", "api_q", total=50)
    ui = start_ui([str(tmp_path)], port=0)
    try:
        (listed,) = _get(ui.url + "api/queries")
        assert listed["name"] == "api_q" and listed["status"] == "finished" and listed["id"] == q.id
        assert listed["lastProgress"]["batchId"] == 4
        body = _get(ui.url + f"api/queries/{listed['key']}/progress")
        assert [p["batchId"] for p in body["progress"]] == [0, 1, 2, 3, 4]
        assert body["progress"] == json.loads(json.dumps(q.recent_progress))
        body = _get(ui.url + f"api/queries/{listed['key']}/progress?after=2")
        assert [p["batchId"] for p in body["progress"]] == [3, 4]
        for bad, code in (("nope/progress", 404), (f"{listed['key']}/progress?after=x", 400)):
            with pytest.raises(urllib.error.HTTPError) as e:
                _get(ui.url + "api/queries/" + bad)
            assert e.value.code == code
        with urllib.request.urlopen(ui.url, timeout=10) as r:
            assert b"<title>headrace" in r.read()
        for asset in ("app.js", "charts.js", "style.css"):
            with urllib.request.urlopen(ui.url + "static/" + asset, timeout=10) as r:
                assert r.status == 200
        _finished(tmp_path / "later" / "chk", "api_later")  # a new checkpoint appears without a restart
        assert {x["name"] for x in _get(ui.url + "api/queries")} == {"api_q", "api_later"}
    finally:
        ui.close()


def test_ui_command_refuses_a_missing_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ui", str(tmp_path / "missing")]) == 1
    assert "is not a folder" in capsys.readouterr().err


def test_ui_port_in_use_is_a_clear_error(tmp_path: Path) -> None:
    ui = start_ui([str(tmp_path)], port=0)
    try:
        with pytest.raises(hr.HeadraceError, match="cannot serve the dashboard on 127.0.0.1:.*--port"):
            start_ui([str(tmp_path)], port=ui.port)
    finally:
        ui.close()


PIPELINE = """
name = "with_ui"
checkpoint = "chk"
[source]
format = "rate-micro-batch"
options = { rowsPerBatch = 100 }
[sink]
format = "noop"
[trigger]
processing_time = "100 milliseconds"
"""


def test_run_with_ui_serves_the_running_pipeline(tmp_path: Path) -> None:
    (tmp_path / "p.toml").write_text(PIPELINE)
    proc = start_cli("run", tmp_path / "p.toml", "--ui", "--ui-port", "0", env=cli_env(os.getcwd()),
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        url = re.search(r"dashboard on (\S+)", line)
        assert url, line
        running = wait_for(lambda: [q for q in _get(url.group(1) + "api/queries")
                                    if q["status"] == "running" and (q["lastProgress"] or {}).get("batchId", -1) >= 1],
                           what="the pipeline, running, in the dashboard")  # fmt: skip
        assert running[0]["name"] == "with_ui"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    (state,) = Catalog([str(tmp_path)]).queries()
    assert state["status"] == "finished"
