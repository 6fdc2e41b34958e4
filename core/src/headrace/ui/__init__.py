"""``headrace ui``: a live web dashboard of headrace queries.

It reads what every query keeps in its checkpoint (``headrace.history``: the last progress
records, the current run, how the last run ended), so it shows running queries live, in this
process or any other, and finished or failed ones from their checkpoints, without any link to
the queries but the folder; and the pipelines whose storage it finds there, from their event
logs (flows, status, expectation counts and the flow graph each run records).

::

    from headrace.ui import start_ui
    ui = start_ui(["/data/checkpoints"], port=4040)   # a checkpoint, or a folder holding some
    print(ui.url); ...; ui.close()

It answers only requests whose ``Host`` gives an IP address, the name it is bound to (the
machine's name for ``0.0.0.0``) or ``localhost``, with its port, or a name given in
``allowed_hosts`` (any port): a page served under another domain name cannot read it through
DNS rebinding. With an
access ``token`` every request must carry it (``?token=`` once, then a cookie; or
``Authorization: Bearer``); a bind other machines can reach needs one unless
``allow_insecure_bind``.

Needs the ``ui`` extra (``pip install 'headrace[ui]'``: Starlette and uvicorn), imported when the
dashboard starts, never by ``import headrace``.
"""

from __future__ import annotations

import ipaddress
import logging
import re
import socket
import threading
import time
from collections.abc import Iterable
from typing import Any

from headrace.errors import HeadraceError, register_secret
from headrace.ui.catalog import Catalog, find_checkpoints

__all__ = ["TOKEN_ENV", "Catalog", "UIServer", "find_checkpoints", "start_ui"]

log = logging.getLogger(__name__)

DEFAULT_PORT = 4040
TOKEN_ENV = "HEADRACE_UI_TOKEN"
MIN_REFRESH_MS, MAX_REFRESH_MS = 100, 3_600_000
_MIN_TOKEN_LEN = 16
_TOKEN_CHARS = re.compile(r"[A-Za-z0-9._~+/=-]+")
_LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
_WILDCARDS = ("", "0.0.0.0", "::")


def _check_token(token: str | None) -> None:
    """The token's shape (never its value) is checked before anything binds."""
    if token is None:
        return
    if not isinstance(token, str) or len(token) < _MIN_TOKEN_LEN or not _TOKEN_CHARS.fullmatch(token):
        n = len(token) if isinstance(token, str) else 0
        why = f"has {n} characters" if n < _MIN_TOKEN_LEN else "has characters outside that set"
        raise HeadraceError(
            f"the dashboard's access token ({TOKEN_ENV}) must be at least {_MIN_TOKEN_LEN} characters of letters, "
            f"digits and ._~+/=- (the one given {why}); "
            "make one with: python -c 'import secrets; print(secrets.token_urlsafe(24))'"
        )


def _whole(value: Any) -> int | None:
    """``value`` as an int when it is a whole number (``4040``, ``"4040"``), else None."""
    if isinstance(value, bool):
        return None
    try:
        n = int(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return n if n == value or str(n) == str(value).strip() else None


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


class UIServer:
    """A running dashboard: ``url``, ``port``, ``catalog`` (``add`` more folders), ``close()``."""

    def __init__(self, server: Any, thread: threading.Thread, sock: socket.socket, catalog: Catalog) -> None:
        self._server = server
        self._thread = thread
        self._sock = sock
        self.catalog = catalog
        host, self.port = sock.getsockname()[:2]
        self.host = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(host, host)

    @property
    def url(self) -> str:
        """The dashboard's address (without its token, which is never shown)."""
        return f"http://{f'[{self.host}]' if ':' in self.host else self.host}:{self.port}/"

    def close(self, timeout: float = 10.0) -> None:
        """Stop serving. Idempotent."""
        self._server.should_exit = True
        self._thread.join(timeout)
        self._sock.close()


def start_ui(folders: Iterable[str] = (), *, port: int = DEFAULT_PORT, host: str = "127.0.0.1",
             refresh_ms: int = 1000, token: str | None = None, allow_insecure_bind: bool = False,
             allowed_hosts: Iterable[str] = ()) -> UIServer:  # fmt: skip
    """Serve the dashboard for the checkpoints in (or under) ``folders`` on ``host:port``
    (``port=0``: any free port) from a daemon thread; returns once it accepts connections.
    Called once per dashboard, from any thread.

    ``token``: the access token every request must carry (a secret: never logged or shown).
    A ``host`` other machines can reach (not a loopback address) is refused without a token
    unless ``allow_insecure_bind``. ``allowed_hosts``: more names the ``Host`` header may give,
    with any port (``"*"``: any host), besides IP addresses, the bound name and ``localhost``."""
    try:
        import uvicorn

        from headrace.ui.app import HostAndTokenGuard, create_app
    except ImportError as e:
        raise HeadraceError(
            f"the dashboard needs the ui extra ({e.name} is not installed); fix: pip install 'headrace[ui]'"
        ) from None
    port_n, refresh_n = _whole(port), _whole(refresh_ms)
    if port_n is None or not 0 <= port_n <= 65535:
        raise HeadraceError(f"dashboard port {port!r} is not a TCP port; give 0..65535 (0: any free port)")
    if refresh_n is None or not MIN_REFRESH_MS <= refresh_n <= MAX_REFRESH_MS:
        raise HeadraceError(f"dashboard refresh interval {refresh_ms!r} ms is out of range; give "
                            f"{MIN_REFRESH_MS}..{MAX_REFRESH_MS} milliseconds (--refresh-ms)")  # fmt: skip
    port, refresh_ms = port_n, refresh_n
    _check_token(token)
    extra_hosts = [str(h) for h in allowed_hosts]
    for h in extra_hosts:
        if h != "*" and (not h or any(c.isspace() or c in "/@?#" for c in h)):
            raise HeadraceError(f"allowed host {h!r} is not a host name; give a name such as dashboard.example.com "
                                "(or '*' for any)")  # fmt: skip
    if token is not None:
        register_secret(token)
    catalog = Catalog(folders)
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise HeadraceError(
            f"cannot serve the dashboard on {host}:{port}: {e.strerror or e}; give another port with --port"
        ) from None
    bound, bound_port = sock.getsockname()[:2]
    if token is None and not allow_insecure_bind and not _is_loopback(bound):
        sock.close()
        raise HeadraceError(
            f"the dashboard would serve {host}:{port}, which other machines can reach, without an access token; "
            f"set {TOKEN_ENV} to a secret (python -c 'import secrets; print(secrets.token_urlsafe(24))'), or bind "
            "127.0.0.1 (the default), or pass --allow-insecure-bind to let anyone who reaches it read the dashboard"
        )
    names = [*_LOOPBACK_NAMES, host if host not in _WILDCARDS else socket.gethostname()]
    app = HostAndTokenGuard(create_app(catalog, refresh_ms=refresh_ms), port=bound_port, names=names,
                            extra_names=extra_hosts, token=token)  # fmt: skip
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")  # no access log: URLs may hold ?token=
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
    log.info("dashboard on %s%s", ui.url, " (access token required)" if token else "")
    return ui
