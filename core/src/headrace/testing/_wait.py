"""Waiting on conditions in tests, instead of sleeping."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

__all__ = ["wait_for"]

T = TypeVar("T")


def wait_for(cond: Callable[[], T], timeout: float = 20.0, what: str = "condition", interval: float = 0.02) -> T:
    """Poll ``cond`` until it returns something truthy and return it, or raise AssertionError
    naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)
