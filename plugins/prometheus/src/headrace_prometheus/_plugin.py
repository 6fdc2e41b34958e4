"""The plugin module behind the ``headrace`` entry point ``prometheus``.

Registered by headrace's plugin registry like any connector plugin; it provides no connector,
only the three listener hooks. It imports nothing heavy: the listener keeps plain numbers and
``prometheus_client`` is imported only when metrics are exposed (``serve()``,
``$HEADRACE_METRICS_PORT``, or the application importing it for its own ``/metrics``);
OpenTelemetry only when an OTLP endpoint is configured.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
import threading
from typing import TYPE_CHECKING, Any

from headrace.plugins import hookimpl

if TYPE_CHECKING:
    from headrace_prometheus.metrics import PrometheusListener

__all__ = ["default_listener", "headrace_query_progress", "headrace_query_started", "headrace_query_terminated"]

log = logging.getLogger(__name__)

_lock = threading.Lock()
_default: PrometheusListener | None = None
_otel: Any = None
_otel_checked = False


def default_listener() -> PrometheusListener:
    """The process-wide listener, recording for ``prometheus_client``'s global ``REGISTRY`` (which
    it joins once ``prometheus_client`` is imported; see :class:`PrometheusListener`)."""
    global _default
    with _lock:
        if _default is None:
            from headrace_prometheus.metrics import PrometheusListener

            _default = PrometheusListener()
        return _default


def _otel_listener() -> Any:
    """The OpenTelemetry listener when the ``otel`` extra is installed and the OTLP exporter is
    configured through the standard environment variables; else None. Decided once."""
    global _otel, _otel_checked
    with _lock:
        if not _otel_checked:
            _otel_checked = True
            if not _otel_wanted():
                return None
            try:
                from headrace_prometheus.otel import listener_from_env

                _otel = listener_from_env()
            except Exception as e:  # never fail a query for its telemetry
                log.warning("OpenTelemetry export disabled: %s", e)
        return _otel


def _otel_wanted() -> bool:
    """Worth importing OpenTelemetry at all: an OTLP endpoint is configured, or the application
    already imported the SDK (it may have installed providers). Keeps the import cost (~0.1 s)
    out of every other process."""
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    endpoints = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")
    if any(os.environ.get(v) for v in endpoints):
        return importlib.util.find_spec("opentelemetry.sdk") is not None
    return "opentelemetry.sdk.trace" in sys.modules or "opentelemetry.sdk.metrics" in sys.modules


_active: list[Any] | None = None  # the listeners, decided at the first event (read once per batch)


def _listeners() -> list[Any]:
    global _active
    if _active is None:
        out: list[Any] = [default_listener()]
        otel = _otel_listener()
        if otel is not None:
            out.append(otel)
        _active = out
    return _active


@hookimpl
def headrace_query_started(event: dict[str, Any]) -> None:
    """Starts the endpoint when ``$HEADRACE_METRICS_PORT`` is set, then records the start."""
    from headrace_prometheus.server import serve_from_env

    serve_from_env()
    for lst in _listeners():
        lst.headrace_query_started(event=event)


@hookimpl
def headrace_query_progress(progress: dict[str, Any]) -> None:
    """Records one batch's progress."""
    for lst in _listeners():
        lst.headrace_query_progress(progress=progress)


@hookimpl
def headrace_query_terminated(event: dict[str, Any]) -> None:
    """Records the end of a query (and a failure)."""
    for lst in _listeners():
        lst.headrace_query_terminated(event=event)
