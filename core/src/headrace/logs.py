"""Logging set-up for the ``headrace`` command: text or JSON lines, and the logger hierarchy.

Every module logs through ``logging.getLogger(__name__)``: the core's loggers are
``headrace.<module>`` (``headrace.engine.query``, ``headrace.checkpoint``, ``headrace.history``,
``headrace.spark.source``, ...) and each plugin's are ``<its package>.<module>``
(``headrace_kafka.source``, ``headrace_delta.sink``, ``headrace_prometheus.server``, ...).
``HEADRACE_LOGGERS`` names the top of each tree, so an application can set levels on them::

    for name in headrace.logs.HEADRACE_LOGGERS:   # ("headrace", "headrace_*" packages installed)
        logging.getLogger(name).setLevel(logging.DEBUG)

The library never configures handlers itself; ``configure_logging`` is for the CLI (and for
programs that want its JSON format).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import sys
from typing import IO, Any

__all__ = ["JsonFormatter", "configure_logging", "headrace_loggers"]

TEXT_FORMAT = "%(levelname)s %(name)s: %(message)s"
# attributes every LogRecord has; anything else was passed with extra={...} and is kept
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "taskName"}


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line: ``ts`` (UTC, ISO 8601), ``level``, ``logger``,
    ``message``, ``thread``; ``exception`` (the formatted traceback) when there is one, and every
    ``extra={...}`` field. Values that are not JSON are written as strings."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": dt.datetime.fromtimestamp(record.created, tz=dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "thread": record.threadName,
        }
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            doc["exception"] = record.exc_text
        for k, v in vars(record).items():
            if k not in _STANDARD and k not in doc:
                doc[k] = v
        return json.dumps(doc, default=str, ensure_ascii=False)


def headrace_loggers() -> list[str]:
    """``headrace`` and the top-level package of every installed plugin (``headrace_*``)."""
    import importlib.metadata

    names = {"headrace"}
    for ep in importlib.metadata.entry_points(group="headrace"):
        names.add(ep.value.split(":", 1)[0].split(".", 1)[0])
    return sorted(names)


def configure_logging(level: int = logging.WARNING, fmt: str = "text", stream: IO[str] | None = None) -> None:
    """Send log records at ``level`` and above to ``stream`` (stderr) as text or JSON lines
    (``fmt``: ``"text"`` or ``"json"``), through a handler on the root logger (replacing the
    one an earlier call added; other handlers are kept). For the CLI."""
    if fmt not in ("text", "json"):
        raise ValueError(f"log format {fmt!r} is not one of: text, json")
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    handler._headrace = True  # type: ignore[attr-defined]
    root = logging.getLogger()
    for h in list(root.handlers):
        if getattr(h, "_headrace", False):  # a previous call's; other handlers are left alone
            root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(level)
