"""The dashboard in a real headless Chromium: a running query live, a failed query's error."""

from __future__ import annotations

import os
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
        second = browser.get_screenshot_as_png()
        points2 = {c: int(_attr(browser, f"#chart-{c}", "data-points")) for c in points1}
        assert all(points2[c] > points1[c] for c in points1), (points1, points2)
        assert first != second
        assert browser.find_elements(By.CSS_SELECTOR, "#chart-rates polyline")
        assert browser.find_elements(By.CSS_SELECTOR, "#chart-phases rect")
        table = _text(browser, "latest")
        assert "numInputRows" in table and "2000" in table
        if os.environ.get("HEADRACE_UI_SCREENSHOT"):  # docs/img/dashboard.png is made this way
            wait_for(lambda: int(_attr(browser, "#latest", "data-batch") or 0) >= 30, timeout=60, what="30 batches")
            Path(os.environ["HEADRACE_UI_SCREENSHOT"]).write_bytes(browser.get_screenshot_as_png())

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
