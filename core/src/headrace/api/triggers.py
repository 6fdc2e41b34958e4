"""``trigger(...)`` keywords to a :class:`~headrace.query.Trigger`, checked (``make_trigger``).

Called once per ``DataStreamWriter.trigger(...)`` call (and by declarative pipelines), on the
caller's thread; no I/O. The result is a small frozen value.
"""

from __future__ import annotations

import logging
from typing import Any

from headrace.errors import HeadraceError
from headrace.options import Duration
from headrace.query import Trigger

__all__ = ["MAX_TRIGGER_INTERVAL", "TRIGGER_KINDS", "make_trigger"]

log = logging.getLogger(__name__)

# the longest trigger interval accepted: longer ones are surely a mistake ("99999999999 days")
MAX_TRIGGER_INTERVAL = 365 * 86400.0

_TRIGGER_ALIASES = {"processingtime": "processing_time", "availablenow": "available_now", "realtime": "real_time"}
TRIGGER_KINDS = ("processing_time", "once", "available_now", "real_time")


def make_trigger(**kwargs: Any) -> Trigger:
    """The :class:`Trigger` of ``trigger(...)`` keywords (snake_case or PySpark's camelCase),
    checked: exactly one given, intervals parse and lie within 0..365 days. Raises
    :class:`HeadraceError` naming the keyword, the value and what is accepted. No I/O."""
    given: dict[str, Any] = {}
    for key, value in kwargs.items():
        if value is None or value is False:
            continue
        kind = _TRIGGER_ALIASES.get(key.lower(), key)
        if kind not in TRIGGER_KINDS:
            raise HeadraceError(
                f"unknown trigger {key!r}; use one of processing_time (processingTime), once, "
                "available_now (availableNow), real_time (realTime)"
            )
        if kind in given:
            raise HeadraceError(f"trigger {kind} is given twice (as {key!r} too); give it once")
        given[kind] = value
    if len(given) != 1:
        raise HeadraceError(
            f"trigger() takes exactly one of processing_time, once, available_now, real_time; got {sorted(given) or 'none'}"
        )
    kind, value = next(iter(given.items()))
    interval = 0.0
    if kind in ("once", "available_now") and value is not True:
        raise HeadraceError(f"trigger {kind} must be true (or left out), not {value!r}")
    if kind in ("processing_time", "real_time"):
        try:
            interval = Duration().parse(value)
        except ValueError as e:
            raise HeadraceError(f"trigger({kind}=...): {e}") from None
        if interval > MAX_TRIGGER_INTERVAL:
            raise HeadraceError(
                f"trigger({kind}={value!r}): {interval:g} seconds is longer than the maximum of 365 days; "
                "give a shorter interval (e.g. '1 hour'), or run with available_now from a scheduler"
            )
        if kind == "real_time" and interval <= 0:
            raise HeadraceError("trigger(real_time=...) needs a positive interval, e.g. '5 minutes'")
    return Trigger(kind, interval)
