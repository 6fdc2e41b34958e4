"""headrace-prometheus: Prometheus metrics (and, with the ``otel`` extra, OpenTelemetry metrics
and spans) for headrace queries, built on headrace's listener hooks.

Installed, it records every query of the process into ``prometheus_client``'s global registry;
``serve(port)`` (or ``HEADRACE_METRICS_PORT``, or ``headrace run --metrics-port N``) exposes
them on ``/metrics``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["PrometheusListener", "__version__", "default_listener", "serve"]

__version__ = "0.1.0"

if TYPE_CHECKING:
    from headrace_prometheus._plugin import default_listener
    from headrace_prometheus.metrics import PrometheusListener
    from headrace_prometheus.server import serve


def __getattr__(name: str) -> Any:  # lazy: importing the package imports no client library
    if name == "PrometheusListener":
        from headrace_prometheus.metrics import PrometheusListener

        return PrometheusListener
    if name == "serve":
        from headrace_prometheus.server import serve

        return serve
    if name == "default_listener":
        from headrace_prometheus._plugin import default_listener

        return default_listener
    raise AttributeError(f"module 'headrace_prometheus' has no attribute {name!r}")
