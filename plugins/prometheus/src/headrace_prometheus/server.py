"""The ``/metrics`` HTTP endpoint (``prometheus_client``'s own server, in a daemon thread)."""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

__all__ = ["ENV_ADDR", "ENV_PORT", "MetricsServer", "serve", "serve_from_env"]

log = logging.getLogger(__name__)

ENV_PORT = "HEADRACE_METRICS_PORT"
ENV_ADDR = "HEADRACE_METRICS_ADDR"
DEFAULT_ADDR = "127.0.0.1"

_lock = threading.Lock()
_servers: dict[tuple[str, int], MetricsServer] = {}


class MetricsServer:
    """A running endpoint: ``port`` (the real one when 0 was asked for), ``url``, ``close()``."""

    def __init__(self, httpd: Any, thread: threading.Thread, addr: str) -> None:
        self._httpd = httpd
        self._thread = thread
        self.addr = addr
        self.port = int(httpd.server_port)

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.addr in ("", "0.0.0.0") else self.addr
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        """Stop serving (tests; an application usually keeps it for its lifetime)."""
        self._httpd.shutdown()
        self._httpd.server_close()
        with _lock:
            for k, v in list(_servers.items()):
                if v is self:
                    del _servers[k]


def serve(port: int = 9464, addr: str | None = None, registry: Any = None) -> MetricsServer:
    """Serve ``/metrics`` on ``addr:port`` (``port=0``: a free port, see ``.port``) and make
    sure the default listener records every query of this process.

    ``addr`` defaults to ``$HEADRACE_METRICS_ADDR`` or 127.0.0.1; give ``0.0.0.0`` for a
    Prometheus on another host. Serving the same address twice returns the running server.
    Called once per process, typically at start-up (``headrace run --metrics-port N`` does).
    """
    from prometheus_client import REGISTRY, start_http_server

    from headrace_prometheus._plugin import default_listener

    if not 0 <= int(port) <= 65535:
        raise ValueError(f"metrics port {port!r} is not a TCP port; give 0..65535 (0: any free port)")
    addr = addr if addr is not None else os.environ.get(ENV_ADDR, DEFAULT_ADDR)
    default_listener().register()  # into the global REGISTRY now (it waits for prometheus_client's import)
    with _lock:
        running = _servers.get((addr, int(port))) if port else None
        if running is not None:
            return running
        try:
            httpd, thread = start_http_server(int(port), addr=addr, registry=registry or REGISTRY)
        except OSError as e:
            raise OSError(
                f"cannot serve metrics on {addr}:{port}: {e.strerror or e}; give another port "
                f"(--metrics-port / {ENV_PORT}) or stop what uses it"
            ) from e
        server = MetricsServer(httpd, thread, addr)
        _servers[(addr, server.port)] = server
        if port:
            _servers[(addr, int(port))] = server
    log.info("serving Prometheus metrics on %s", server.url)
    return server


def serve_from_env() -> MetricsServer | None:
    """``serve($HEADRACE_METRICS_PORT)`` when that variable is set; called when a query starts."""
    raw = os.environ.get(ENV_PORT, "").strip()
    if not raw:
        return None
    try:
        port = int(raw)
    except ValueError:
        log.error("%s=%r is not a port number; metrics are not served", ENV_PORT, raw)
        return None
    try:
        return serve(port)
    except (OSError, ValueError) as e:
        log.error("%s", e)
        return None
