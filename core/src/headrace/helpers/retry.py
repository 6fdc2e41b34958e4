"""Retry with exponential backoff and full jitter, for transient errors of a client library.

::

    from headrace.helpers.retry import retry

    resp = retry(lambda: client.put_records(...), is_transient=is_throttled, attempts=5, base=0.1,
                 what="kinesis put_records")
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import TypeVar

__all__ = ["backoff", "retry"]

log = logging.getLogger(__name__)

T = TypeVar("T")


def backoff(attempt: int, *, base: float = 0.05, cap: float = 5.0, rng: random.Random | None = None) -> float:
    """Seconds to wait before retry ``attempt`` (1, 2, ...): exponential with full jitter (AWS's
    "full jitter"), at least ``base / 2``, at most ``cap``."""
    r = rng or random
    ceiling = min(cap, base * (2 ** (attempt - 1)))
    return max(base / 2, r.uniform(0, ceiling))


def retry(
    fn: Callable[[], T],
    *,
    is_transient: Callable[[BaseException], bool],
    attempts: int = 5,
    base: float = 0.05,
    cap: float = 5.0,
    what: str = "call",
    on_retry: Callable[[BaseException], None] | None = None,
    stop: Callable[[], bool] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Call ``fn`` until it returns, retrying errors ``is_transient`` accepts, ``attempts`` calls
    in all, with :func:`backoff` between them. The last error is raised as it is (a permanent one
    at once); ``stop()`` true ends the retries early (a query stopping)."""
    if attempts < 1:
        raise ValueError(f"attempts must be at least 1, not {attempts}")
    for attempt in range(1, attempts + 1):
        try:
            return fn()
        except Exception as e:
            if attempt == attempts or not is_transient(e) or (stop is not None and stop()):
                raise
            delay = backoff(attempt, base=base, cap=cap)
            log.info("%s failed (%s: %s); retry %d of %d in %.2f s", what, type(e).__name__, e, attempt,
                     attempts - 1, delay)  # fmt: skip
            if on_retry is not None:
                on_retry(e)
            sleep(delay)
    raise AssertionError("unreachable")  # pragma: no cover
