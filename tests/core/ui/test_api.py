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
from tests.cli_runner import cli_env, run_cli, start_cli

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


def _request(port: int, path: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], str]:
    """A GET with exactly these headers (urllib would send its own Host)."""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.putrequest("GET", path, skip_host=True, skip_accept_encoding=True)
        for k, v in (headers or {}).items():
            conn.putheader(k, v)
        conn.endheaders()
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read().decode()
    finally:
        conn.close()


@pytest.mark.parametrize(
    ("host", "allowed"),
    [
        ("127.0.0.1:{port}", True),
        ("localhost:{port}", True),
        ("LOCALHOST.:{port}", True),
        ("[::1]:{port}", True),
        ("192.0.2.7:{port}", True),  # an IP address: a page can send it only from that very origin
        ("evil.example:{port}", False),  # DNS rebinding: a page of evil.example resolved to 127.0.0.1
        ("localhost.evil.example:{port}", False),
        ("localhost:{other}", False),
        ("localhost", False),  # port 80 implied
        ("", False),
        ("127.0.0.1:{port}:1", False),
        ("[::1", False),
    ],
    ids=["ipv4-loopback", "localhost", "localhost-case-dot", "ipv6-loopback", "ip-address", "foreign-name",
         "foreign-subdomain", "wrong-port", "no-port", "empty", "malformed", "unclosed-bracket"],
)
def test_only_the_dashboards_host_names_are_answered(tmp_path: Path, host: str, allowed: bool) -> None:
    _finished(tmp_path / "chk", "host_q")
    ui = start_ui([str(tmp_path)], port=0)
    try:
        header = host.format(port=ui.port, other=ui.port + 1 if ui.port < 65535 else 1)
        for path in ("/", "/api/queries", "/api/config", "/static/app.js"):
            status, _, body = _request(ui.port, path, {"Host": header})
            if allowed:
                assert status == 200, (path, status, body)
            else:
                assert status == 403, (path, status, body)
                assert "does not answer requests for this host name" in body and "host_q" not in body
    finally:
        ui.close()


def test_a_request_without_host_header_is_refused(tmp_path: Path) -> None:
    ui = start_ui([str(tmp_path)], port=0)
    try:
        assert _request(ui.port, "/api/queries")[0] in (400, 403)  # HTTP/1.1 needs a Host: the server refuses it first
    finally:
        ui.close()


def test_allowed_hosts_add_names_with_any_port(tmp_path: Path) -> None:
    ui = start_ui([str(tmp_path)], port=0, allowed_hosts=["dash.example.com"])
    try:
        assert _request(ui.port, "/api/queries", {"Host": "dash.example.com"})[0] == 200  # behind a proxy on :80
        assert _request(ui.port, "/api/queries", {"Host": "dash.example.com:8443"})[0] == 200
        assert _request(ui.port, "/api/queries", {"Host": "other.example.com"})[0] == 403
    finally:
        ui.close()
    ui = start_ui([str(tmp_path)], port=0, allowed_hosts=["*"])
    try:
        assert _request(ui.port, "/api/queries", {"Host": "anything.example"})[0] == 200
    finally:
        ui.close()
    with pytest.raises(hr.HeadraceError, match="allowed host 'a b' is not a host name"):
        start_ui([str(tmp_path)], port=0, allowed_hosts=["a b"])


TOKEN = "s3cr3t-Dashboard-Token-0123456789"


def test_token_flows(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from headrace.ui.app import cookie_name

    _finished(tmp_path / "chk", "token_q")
    caplog.set_level("DEBUG")
    ui = start_ui([str(tmp_path)], port=0, token=TOKEN)
    host = {"Host": f"127.0.0.1:{ui.port}"}
    try:
        seen: list[str] = []
        for path in ("/", "/api/queries", "/api/config", "/static/app.js"):  # no token: refused
            status, headers, body = _request(ui.port, path, host)
            assert status == 403 and "needs its access token" in body and "token_q" not in body
            seen.append(body + str(headers))
        status, headers, body = _request(ui.port, "/?token=wrong-token-wrong-token", host)
        assert status == 403 and "not this dashboard's access token" in body
        seen.append(body + str(headers))
        # ?token= once: a cookie, and the same URL without the token
        status, headers, body = _request(ui.port, f"/?token={TOKEN}&x=1", host)
        assert status == 303 and headers["location"] == "/?x=1"
        cookie = headers["set-cookie"]
        assert cookie.startswith(cookie_name(ui.port) + "=") and "HttpOnly" in cookie and "SameSite=Strict" in cookie
        assert TOKEN not in cookie  # the cookie holds a keyed hash, not the token
        jar = {"Cookie": "other=1; " + cookie.split(";")[0], **host}
        for path in ("/", "/api/config", "/static/app.js"):
            assert _request(ui.port, path, jar)[0] == 200
        status, _, body = _request(ui.port, "/api/queries", jar)
        assert status == 200 and json.loads(body)[0]["name"] == "token_q"
        # scripts: the Authorization header
        for scheme in ("Bearer", "token"):
            assert _request(ui.port, "/api/queries", {"Authorization": f"{scheme} {TOKEN}", **host})[0] == 200
        assert _request(ui.port, "/api/queries", {"Authorization": "Bearer nope", **host})[0] == 403
        # a cookie of another dashboard (another port) or a forged one does not open this one
        forged = {"Cookie": f"{cookie_name(ui.port + 1)}={cookie.split(';')[0].split('=', 1)[1]}", **host}
        assert _request(ui.port, "/api/queries", forged)[0] == 403
        assert _request(ui.port, "/api/queries", {"Cookie": f"{cookie_name(ui.port)}={TOKEN}", **host})[0] == 403
        # the token and the Host check together: a rebinding page has neither the name nor the cookie
        assert _request(ui.port, "/api/queries", {"Host": f"evil.example:{ui.port}", "Cookie": jar["Cookie"]})[0] == 403
        assert TOKEN not in repr(ui) and TOKEN not in ui.url
    finally:
        ui.close()
    assert all(TOKEN not in s for s in seen)
    assert TOKEN not in caplog.text


@pytest.mark.parametrize("bad", ["short", "x" * 15, "has space in it here", "semi;colon-token-0123"],
                         ids=["short", "fifteen-chars", "space", "semicolon"])  # fmt: skip
def test_a_weak_token_is_refused_without_showing_it(tmp_path: Path, bad: str) -> None:
    with pytest.raises(hr.HeadraceError, match="at least 16 characters") as e:
        start_ui([str(tmp_path)], port=0, token=bad)
    assert bad not in str(e.value)


def test_a_bind_beyond_loopback_needs_a_token_or_the_explicit_force(tmp_path: Path) -> None:
    with pytest.raises(hr.HeadraceError, match="other machines can reach, without an access token.*HEADRACE_UI_TOKEN"):
        start_ui([str(tmp_path)], port=0, host="0.0.0.0")
    for kwargs in ({"token": TOKEN}, {"allow_insecure_bind": True}):
        ui = start_ui([str(tmp_path)], port=0, host="0.0.0.0", **kwargs)
        try:
            headers = {"Host": f"127.0.0.1:{ui.port}"} | ({"Authorization": f"Bearer {TOKEN}"} if kwargs.get("token") else {})
            assert _request(ui.port, "/api/queries", headers)[0] == 200
            assert _request(ui.port, "/api/queries", {**headers, "Host": f"evil.example:{ui.port}"})[0] == 403
        finally:
            ui.close()


@pytest.mark.parametrize("value", [-1, 0, 99, 3_600_001, "soon"], ids=["negative", "zero", "too-fast", "too-slow", "text"])
def test_a_bad_refresh_interval_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str], value: Any) -> None:
    with pytest.raises(hr.HeadraceError, match=r"refresh interval .* out of range; give 100\.\.3600000 milliseconds"):
        start_ui([str(tmp_path)], port=0, refresh_ms=value)
    if isinstance(value, int):
        assert main(["ui", str(tmp_path), "--port", "0", "--refresh-ms", str(value)]) == 1
        err = capsys.readouterr().err
        assert err.startswith("headrace: error: dashboard refresh interval") and len(err.splitlines()) == 1, err


def test_ui_command_refuses_what_is_not_a_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "file").write_text("x")
    (tmp_path / "dangling").symlink_to(tmp_path / "gone")
    for arg, words in ((tmp_path / "missing", "does not exist"), (tmp_path / "missing" / "deeper", "does not exist"),
                       (tmp_path / "file", "is not a folder"), (tmp_path / "dangling", "is not a folder")):  # fmt: skip
        assert main(["ui", str(arg), "--port", "0"]) == 1
        err = capsys.readouterr().err
        assert f"{arg} {words}" in err and "checkpoint found" not in err, err


def test_ui_command_bind_beyond_loopback(tmp_path: Path) -> None:
    env = {k: v for k, v in cli_env(os.getcwd()).items() if k != "HEADRACE_UI_TOKEN"}
    out = run_cli("ui", tmp_path, "--host", "0.0.0.0", "--port", "0", env=env, timeout=60)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert out.stderr.startswith("headrace: error: the dashboard would serve 0.0.0.0:0") and "--allow-insecure-bind" in out.stderr
    proc = start_cli("ui", tmp_path, "--host", "0.0.0.0", "--port", "0", env={**env, "HEADRACE_UI_TOKEN": TOKEN},
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        assert "access token required" in line and TOKEN not in line, line
        port = int(re.search(r":(\d+)/", line).group(1))  # type: ignore[union-attr]
        assert _request(port, "/api/queries", {"Host": f"localhost:{port}"})[0] == 403
        assert _request(port, "/api/queries", {"Host": f"localhost:{port}", "Authorization": f"Bearer {TOKEN}"})[0] == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        assert TOKEN not in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_run_with_ui_beyond_loopback_needs_the_token(tmp_path: Path) -> None:
    (tmp_path / "p.toml").write_text(PIPELINE)
    env = {k: v for k, v in cli_env(os.getcwd()).items() if k != "HEADRACE_UI_TOKEN"}
    out = run_cli("run", tmp_path / "p.toml", "--ui", "--ui-host", "0.0.0.0", "--ui-port", "0", env=env, cwd=tmp_path,
                  timeout=60)  # fmt: skip
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "headrace: error: the dashboard would serve 0.0.0.0:0" in out.stderr and "HEADRACE_UI_TOKEN" in out.stderr
    assert not (tmp_path / "chk").exists()  # refused before the query started


def test_pipelines_api_summarises_the_event_log_and_draws_the_graph(tmp_path: Path) -> None:
    import shutil

    from headrace.pipelines.events import EventLog

    storage = tmp_path / "pipe" / "storage"
    old = EventLog(str(storage / "event_log" / "events.jsonl"), "sales", "u1")
    old.emit("create_update", "run started")
    old.emit("flow_progress", "batch 0", flow="silver", dataset="silver", details={"status": "FAILED", "error": "boom"})
    log = EventLog(str(storage / "event_log" / "events.jsonl"), "sales", "u2")
    log.emit("create_update", "run started")
    log.emit("update_progress", "running", details={"state": "RUNNING", "graph_dot": 'digraph pipeline { "a" -> "b"; }'})
    for n in (0, 1):
        log.emit("flow_progress", f"batch {n}", flow="silver", dataset="silver", details={
            "status": "RUNNING", "metrics": {"batch_id": n, "num_output_rows": 8},
            "data_quality": {"dropped_records": 2, "expectations": [
                {"name": "positive", "dataset": "silver", "passed_records": 8, "failed_records": 2}]}})  # fmt: skip
    log.emit("flow_progress", "done", flow="silver", dataset="silver", details={"status": "COMPLETED"})
    log.emit("update_progress", "completed", details={"state": "COMPLETED"})
    ui = start_ui([str(tmp_path)], port=0)
    try:
        [p] = _get(ui.url + "api/pipelines")
        svg = _fetch(ui.url + f"api/pipelines/{p['key']}/graph.svg")
        missing = _fetch(ui.url + "api/pipelines/nope/graph.svg")
    finally:
        ui.close()
    assert p["name"] == "sales" and p["updateId"] == "u2" and p["state"] == "COMPLETED" and p["hasGraph"]
    [f] = p["flows"]  # the last run's: the failure of u1 is history
    assert f["status"] == "COMPLETED" and f["error"] is None and f["batches"] == 2 and f["outputRows"] == 16
    assert f["expectations"] == [{"name": "positive", "passed": 16, "failed": 4}] and f["droppedRecords"] == 4
    if shutil.which("dot"):
        assert svg[0] == 200 and svg[1].startswith("image/svg+xml") and b"<svg" in svg[2]
    else:
        assert svg[0] == 503 and b"graphviz" in svg[2]
    assert missing[0] == 404


def _fetch(url: str) -> tuple[int, str, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.headers.get("content-type", ""), r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("content-type", ""), e.read()
