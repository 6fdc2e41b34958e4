"""The dashboard in a real headless Chromium: a running query live, a failed query's error."""

from __future__ import annotations

import datetime as dt
import itertools
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import headrace as hr
from headrace.errors import StreamingQueryException
from headrace.testing import wait_for

pytest.importorskip("starlette")
from headrace.ui import UIServer, start_ui


def _running(chk: Path) -> hr.StreamingQuery:
    return (hr.read_stream.format("rate-micro-batch").options(rowsPerBatch=2000, totalRows=400_000).load()
            .write_stream.format("noop").option("checkpointLocation", str(chk)).query_name("orders_live")
            .trigger(processing_time="250 milliseconds").start())  # fmt: skip


def _failing(chk: Path) -> None:
    def boom(t: pa.Table) -> pa.Table:
        if t.column("value")[0].as_py() >= 200:
            raise ValueError("column 'amount' has a non-numeric value 'abc'")
        return t

    q = (hr.read_stream.format("rate-micro-batch").options(rowsPerBatch=100, totalRows=1000).load().map_batches(boom)
         .write_stream.format("noop").option("checkpointLocation", str(chk)).query_name("payments_bad")
         .trigger(available_now=True).start())  # fmt: skip
    with pytest.raises(StreamingQueryException):
        q.await_termination(30)


@pytest.fixture
def ui(tmp_path: Path) -> Iterator[UIServer]:
    server = start_ui([str(tmp_path)], port=0, refresh_ms=300)
    yield server
    server.close()


def _fresh(read: Any) -> Any:
    """``read()`` again while the element it reads is redrawn under it (every poll redraws
    the page: an element found a moment ago may be stale by the time it is read)."""
    from selenium.common.exceptions import StaleElementReferenceException

    for _ in range(50):
        try:
            return read()
        except StaleElementReferenceException:
            continue
    return read()


def _attr(driver: Any, css: str, name: str) -> str:
    from selenium.webdriver.common.by import By

    def read() -> str:
        els = driver.find_elements(By.CSS_SELECTOR, css)
        return (els[0].get_attribute(name) or "") if els else ""

    return str(_fresh(read))


def _attrs(driver: Any, css: str, name: str) -> list[str]:
    """An attribute of every element ``css`` finds, read in one go in the page (a list read
    element by element is redrawn under the reader by the next poll)."""
    got = driver.execute_script(
        "return [...document.querySelectorAll(arguments[0])].map((e) => e.getAttribute(arguments[1]))", css, name)
    return [str(x) for x in got]


def _text(driver: Any, element_id: str) -> str:
    from selenium.webdriver.common.by import By

    return str(_fresh(lambda: driver.find_element(By.ID, element_id).text))


def _click(driver: Any, css: str) -> bool:
    """Click the element (the list is redrawn on every poll, so an element may go stale)."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By

    try:
        driver.find_element(By.CSS_SELECTOR, css).click()
        return True
    except StaleElementReferenceException:
        return False


def test_running_query_charts_advance_and_failed_query_shows_its_error(browser: Any, ui: UIServer, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    _failing(tmp_path / "payments")
    q = _running(tmp_path / "orders")
    try:
        wait_for(lambda: len(q.recent_progress) >= 3, what="3 batches")
        browser.get(ui.url)
        wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, 'li.query[data-name="orders_live"][data-status="running"]'),
                 what="the running query in the list")  # fmt: skip
        failed_css = 'li.query[data-name="payments_bad"][data-status="failed"]'
        wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, failed_css), what="the failed query in the list")
        # running queries are listed first and selected by default
        wait_for(lambda: int(_attr(browser, "#chart-rates", "data-points") or 0) >= 3, what="rate chart points")
        first = browser.get_screenshot_as_png()
        batch1 = int(_attr(browser, "#latest", "data-batch"))
        points1 = {c: int(_attr(browser, f"#chart-{c}", "data-points")) for c in ("rates", "phases", "rows", "backlog")}
        assert all(n >= 3 for n in points1.values()), points1
        wait_for(lambda: int(_attr(browser, "#latest", "data-batch") or 0) >= batch1 + 2, what="the page to advance")
        # the page re-renders every chart on each poll: the counts read one by one above may
        # straddle a re-render, so each chart must pass the highest of them
        most = max(points1.values())
        wait_for(lambda: all(int(_attr(browser, f"#chart-{c}", "data-points") or 0) > most for c in points1),
                 what="every chart to gain points")  # fmt: skip
        second = browser.get_screenshot_as_png()
        assert first != second
        assert browser.find_elements(By.CSS_SELECTOR, "#chart-rates polyline")
        assert browser.find_elements(By.CSS_SELECTOR, "#chart-phases rect")
        table = _text(browser, "latest")
        assert "numInputRows" in table and "2000" in table

        wait_for(lambda: _click(browser, failed_css), what="a click on the failed query")
        wait_for(lambda: browser.find_elements(By.ID, "error"), what="the error box")
        error = _text(browser, "error")
        assert "Batch 2 failed" in error
        assert "non-numeric value 'abc'" in error
        assert "payments_bad" in _text(browser, "qtitle")
    finally:
        q.stop()


def test_the_page_works_with_an_access_token(browser: Any, tmp_path: Path) -> None:
    """``?token=`` once: the page loads without the token in its address, and keeps polling."""
    from selenium.webdriver.common.by import By

    token = "browser-Token-0123456789abcdef"
    q = _running(tmp_path / "orders")
    server = start_ui([str(tmp_path)], port=0, refresh_ms=300, token=token)
    try:
        browser.get(server.url)
        wait_for(lambda: "needs its access token" in browser.find_element(By.TAG_NAME, "body").text,
                 what="the refusal without the token")  # fmt: skip
        browser.get(server.url + "?token=" + token)
        wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, 'li.query[data-name="orders_live"][data-status="running"]'),
                 what="the running query in the list")  # fmt: skip
        assert token not in browser.current_url
        batch = wait_for(lambda: int(_attr(browser, "#latest", "data-batch") or 0), what="a batch on the page")
        wait_for(lambda: int(_attr(browser, "#latest", "data-batch") or 0) >= batch + 2, what="the page to keep polling")
        assert token not in browser.page_source
    finally:
        q.stop()
        server.close()


def _stateful(chk: Path) -> hr.StreamingQuery:
    """rate-micro-batch -> watermark -> windowed count: one stateful operator, a watermark."""
    return (hr.read_stream.format("rate-micro-batch")
            .options(rowsPerBatch=2000, totalRows=400_000, advanceMillisPerBatch=1000,
                     startTimestamp=int(time.time()) * 1000).load()
            .with_watermark("timestamp", "2 seconds").with_column("k", "value % 5")
            .group_by(hr.window("timestamp", "5 seconds"), "k").count()
            .write_stream.format("noop").output_mode("append").option("checkpointLocation", str(chk))
            .query_name("orders_by_window").trigger(processing_time="500 milliseconds").start())  # fmt: skip


def _points(driver: Any, css: str) -> list[tuple[float, float]]:
    raw = _attr(driver, css, "points")
    return [(float(x), float(y)) for x, y in (p.split(",") for p in raw.split())] if raw else []


def test_stateful_query_state_watermark_batches_and_rates(browser: Any, ui: UIServer, tmp_path: Path) -> None:
    """State per operator and the watermark over time; the recent batches table, a click
    opening a batch's whole record; no latency panel outside real-time mode; the input rate
    (8k rows/s) not flattened to the bottom by a processing rate 100 times higher."""
    import json

    from selenium.webdriver.common.by import By

    q = _stateful(tmp_path / "windows")
    try:
        wait_for(lambda: len(q.recent_progress) >= 4, what="4 batches")
        browser.get(ui.url)
        wait_for(lambda: int(_attr(browser, "#chart-state-rows-0", "data-points") or 0) >= 4, what="the state chart")
        assert _fresh(lambda: browser.find_element(By.ID, "state").is_displayed())
        for chart in ("state-memory-0", "state-dropped-0", "watermark"):
            assert int(_attr(browser, f"#chart-{chart}", "data-points") or 0) >= 4, chart
            assert browser.find_elements(By.CSS_SELECTOR, f"#chart-{chart} polyline"), chart
        assert "rows in state" in _text(browser, "card-state-rows-0")
        assert "rows dropped by the watermark" in _text(browser, "card-state-dropped-0")
        # the latency panel exists for real-time queries only
        assert not _fresh(lambda: browser.find_element(By.ID, "card-latency").is_displayed())

        # the rates are Spark's: input = rows / time since the previous trigger's start,
        # processed = rows / the batch's duration
        recs = q.recent_progress
        for prev, r in itertools.pairwise(recs):
            gap = (dt.datetime.fromisoformat(r["timestamp"]) - dt.datetime.fromisoformat(prev["timestamp"])).total_seconds()
            assert r["inputRowsPerSecond"] == pytest.approx(r["numInputRows"] / gap, rel=0.05), (prev, r)
            assert r["processedRowsPerSecond"] == pytest.approx(
                r["numInputRows"] / (r["durationMs"]["triggerExecution"] / 1000), rel=0.1, abs=1000), r
        # on a log axis: 2,000 rows every 500 ms is 4k rows/s in, while a batch takes some
        # 50 ms (40k rows/s processed; 1M for a noop sink, and more in a first batch): a
        # linear axis would draw the input at input / max rate of the height, near the bottom
        assert _attr(browser, "#chart-rates", "data-scale") == "log"
        inputs = sorted(r["inputRowsPerSecond"] for r in recs)
        linear = inputs[len(inputs) // 2] / max(r["processedRowsPerSecond"] for r in recs)
        top, bottom = 8, 180 - 22  # the plot area (charts.js: T, H - B)
        ys = sorted(y for _, y in _points(browser, "#chart-rates polyline:nth-of-type(1)"))
        height = (bottom - ys[len(ys) // 2]) / (bottom - top)
        # (a machine so loaded that processing is barely faster than input has no flattening)
        assert height >= 0.12 and (linear > 0.3 or height > 1.5 * linear), (ys, linear)

        # recent batches, newest first; a click shows that batch's full progress record
        rows_css = "table.batches tbody tr"
        wait_for(lambda: len(browser.find_elements(By.CSS_SELECTOR, rows_css)) >= 4, what="the batches table")
        ids = [int(x) for x in _attrs(browser, rows_css, "data-batch")]
        assert ids == sorted(ids, reverse=True)
        pick = ids[1]  # a recent one: it stays in the table for the next 19 batches
        cells = _fresh(lambda: browser.find_element(By.CSS_SELECTOR, f'{rows_css}[data-batch="{pick}"]').text)
        assert "2000" in cells and "addBatch" in cells
        wait_for(lambda: _click(browser, f'{rows_css}[data-batch="{pick}"]'), what="a click on a batch")
        wait_for(lambda: browser.find_elements(By.ID, "batch-json"), what="the batch's record")
        record = json.loads(_text(browser, "batch-json"))
        assert record["batchId"] == pick and record["numInputRows"] == 2000
        assert record["stateOperators"][0]["numRowsTotal"] >= 0 and "watermark" in record["eventTime"]
        # the record stays open while the page keeps polling
        batch = int(_attr(browser, "#latest", "data-batch"))
        wait_for(lambda: int(_attr(browser, "#latest", "data-batch") or 0) >= batch + 2, what="the page to advance")
        assert json.loads(_text(browser, "batch-json"))["batchId"] == pick
        if os.environ.get("HEADRACE_UI_SCREENSHOT"):  # docs/img/dashboard.png is made this way
            wait_for(lambda: _click(browser, "#batch-close"), what="closing the record")
            wait_for(lambda: int(_attr(browser, "#latest", "data-batch") or 0) >= 30, timeout=60, what="30 batches")
            browser.set_window_size(1400, 1640)
            browser.execute_script("window.scrollTo(0, 0)")
            wait_for(lambda: browser.execute_script("return window.scrollY") == 0, what="the top of the page")
            Path(os.environ["HEADRACE_UI_SCREENSHOT"]).write_bytes(browser.get_screenshot_as_png())
            browser.set_window_size(1400, 1000)
    finally:
        q.stop()


def test_failed_query_shows_its_traceback_redacted(browser: Any, ui: UIServer, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    from headrace.errors import register_secret

    secret = "Xk9-tr4ceback-S3cret-value"
    register_secret(secret)

    def leaky(t: pa.Table) -> pa.Table:
        raise ConnectionError(f"broker refused the login with password {secret}")

    q = (hr.read_stream.format("rate-micro-batch").options(rowsPerBatch=10, totalRows=100).load().map_batches(leaky)
         .write_stream.format("noop").option("checkpointLocation", str(tmp_path / "leaky")).query_name("leaky")
         .trigger(available_now=True).start())  # fmt: skip
    with pytest.raises(StreamingQueryException):
        q.await_termination(30)
    browser.get(ui.url)
    wait_for(lambda: browser.find_elements(By.ID, "traceback"), what="the traceback")
    tb = _text(browser, "traceback")
    assert "Traceback (most recent call last)" in tb
    assert "in leaky" in tb and "ConnectionError: broker refused the login" in tb
    assert "StreamingQueryException" in tb
    assert secret not in tb and secret not in browser.page_source
    assert "broker refused" in _text(browser, "error")


def _pipeline_project(root: Path) -> Any:
    """The three-level pipeline of the pipelines tests (expectations on silver), run once."""
    import json as _json

    from tests.core.pipelines.conftest import DIMS, PYTHON, SPEC, Project

    p = Project(str(root))
    os.makedirs(p.path("landing"))
    p.write("pipeline.yml", SPEC.format(name="orders_pipeline"))
    p.write("transformations/defs.py", PYTHON)
    with open(p.path("dims.json"), "w") as f:
        f.write("\n".join(_json.dumps(d) for d in DIMS) + "\n")
    rows = p.add_files(3)
    assert p.run().state == "COMPLETED"
    return p, rows


def test_pipeline_flows_grouped_with_graph_status_and_expectations(browser: Any, ui: UIServer, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    _, rows = _pipeline_project(tmp_path / "proj")
    browser.get(ui.url)
    css = 'li.pipeline[data-name="orders_pipeline"]'
    wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, css), what="the pipeline in the list")
    flows = _attrs(browser, f"{css} li.flow", "data-flow")
    assert sorted(flows) == ["bronze", "dims", "gold", "silver"]
    wait_for(lambda: _click(browser, f"{css} .qname"), what="a click on the pipeline")
    wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, '#pipeline-flows tr[data-flow="silver"]'), what="the flows")
    assert "orders_pipeline" in _text(browser, "ptitle") and "completed" in _text(browser, "ptitle")
    silver = _fresh(lambda: browser.find_element(By.CSS_SELECTOR, '#pipeline-flows tr[data-flow="silver"]').text)
    bad = sum(1 for r in rows if r["amount"] <= 0)
    big = sum(1 for r in rows if not r["amount"] < 1000)
    assert f"positive: {len(rows) - bad} passed, {bad} failed" in silver, silver
    assert f"small: {len(rows) - big} passed, {big} failed" in silver, silver
    assert "completed" in silver
    # the flow graph `headrace pipelines graph` draws, as an image the browser loaded
    wait_for(lambda: browser.execute_script(
        "const i = document.getElementById('pipeline-svg'); return i && i.complete && i.naturalWidth > 0"),
        what="the flow graph drawn")  # fmt: skip
    # a flow with a query links to it
    wait_for(lambda: _click(browser, '#pipeline-flows tr[data-flow="silver"] a'), what="a click on the silver flow")
    wait_for(lambda: browser.find_elements(By.ID, "qtitle") and "silver" in _text(browser, "qtitle"), what="its query")


def test_real_time_query_shows_its_latency_panel(browser: Any, ui: UIServer, tmp_path: Path) -> None:
    """The latency panel hidden for micro-batch queries is there for a real-time one."""
    from selenium.webdriver.common.by import By

    q = (hr.read_stream.format("rate").option("rowsPerSecond", 200).load().write_stream.format("noop")
         .query_name("rt_live").option("checkpointLocation", str(tmp_path / "rt"))
         .trigger(real_time="500 milliseconds").start())  # fmt: skip
    try:
        wait_for(lambda: len(q.recent_progress) >= 2, what="2 real-time batches")
        browser.get(ui.url)
        wait_for(lambda: int(_attr(browser, "#chart-latency", "data-points") or 0) >= 2, what="the latency chart")
        assert _fresh(lambda: browser.find_element(By.ID, "card-latency").is_displayed())
        assert browser.find_elements(By.CSS_SELECTOR, "#chart-latency polyline")
    finally:
        q.stop()
