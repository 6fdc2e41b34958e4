"""``headrace ui``: a live web dashboard of headrace queries.

It reads what every query keeps in its checkpoint (``headrace.history``: the last progress
records, the current run, how the last run ended), so it shows running queries live, in this
process or any other, and finished or failed ones from their checkpoints, without any link to
the queries but the folder.

::

    from headrace.ui import start_ui
    ui = start_ui(["/data/checkpoints"], port=4040)   # a checkpoint, or a folder holding some
    print(ui.url); ...; ui.close()

Needs the ``ui`` extra (``pip install 'headrace[ui]'``: Starlette and uvicorn), imported when the
dashboard starts, never by ``import headrace``.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Iterable
from typing import Any

from headrace.errors import HeadraceError
from headrace.ui.catalog import Catalog, find_checkpoints

__all__ = ["Catalog", "UIServer", "find_checkpoints", "start_ui"]

log = logging.getLogger(__name__)

DEFAULT_PORT = 4040


class UIServer:
    """A running dashboard: ``url``, ``port``, ``catalog`` (``add`` more folders), ``close()``."""

    def __init__(self, server: Any, thread: threading.Thread, sock: socket.socket, catalog: Catalog) -> None:
        self._server = server
        self._thread = thread
        self._sock = sock
        self.catalog = catalog
        host, self.port = sock.getsockname()[:2]
        self.host = "127.0.0.1" if host in ("0.0.0.0", "") else host

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/"

    def close(self, timeout: float = 10.0) -> None:
        """Stop serving. Idempotent."""
        self._server.should_exit = True
        self._thread.join(timeout)
        self._sock.close()


def start_ui(folders: Iterable[str] = (), *, port: int = DEFAULT_PORT, host: str = "127.0.0.1",
             refresh_ms: int = 1000) -> UIServer:  # fmt: skip
    """Serve the dashboard for the checkpoints in (or under) ``folders`` on ``host:port``
    (``port=0``: any free port) from a daemon thread; returns once it accepts connections."""
    try:
        import uvicorn

        from headrace.ui.app import create_app
    except ImportError as e:
        raise HeadraceError(
            f"the dashboard needs the ui extra ({e.name} is not installed); fix: pip install 'headrace[ui]'"
        ) from None
    if not 0 <= int(port) <= 65535:
        raise HeadraceError(f"dashboard port {port!r} is not a TCP port; give 0..65535 (0: any free port)")
    catalog = Catalog(folders)
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, int(port)))
    except OSError as e:
        sock.close()
        raise HeadraceError(
            f"cannot serve the dashboard on {host}:{port}: {e.strerror or e}; give another port with --port"
        ) from None
    config = uvicorn.Config(create_app(catalog, refresh_ms=refresh_ms), log_level="warning", access_log=False,
                            lifespan="off")  # fmt: skip
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="headrace-ui", daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            sock.close()
            raise HeadraceError(f"the dashboard did not start on {host}:{port}")
        time.sleep(0.01)
    ui = UIServer(server, thread, sock, catalog)
    log.info("dashboard on %s", ui.url)
    return ui
