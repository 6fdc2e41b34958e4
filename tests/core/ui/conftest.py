"""Fixtures of the dashboard tests: running queries and a headless Chromium (Debian's)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from typing import Any

import pytest

CHROMIUM = os.environ.get("HEADRACE_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("HEADRACE_CHROMEDRIVER", "/usr/bin/chromedriver")


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    """Selenium driving Debian's chromium + chromium-driver (scripts/services.sh installs them)."""
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not shutil.which(p)]
    try:
        from selenium import webdriver
    except ImportError:
        missing.append("the selenium package (requirements-dev.txt)")
    if missing:
        why = f"no headless browser: {', '.join(missing)} missing (scripts/services.sh installs chromium chromium-driver)"
        if os.environ.get("HEADRACE_REQUIRE_SERVICES") == "1":  # CI: every test must really run
            pytest.fail(f"{why} and HEADRACE_REQUIRE_SERVICES=1", pytrace=False)
        pytest.skip(why)
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,1000",
              "--hide-scrollbars", "--force-device-scale-factor=1"):  # fmt: skip
        opts.add_argument(a)
    driver = webdriver.Chrome(options=opts, service=Service(CHROMEDRIVER))
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()
