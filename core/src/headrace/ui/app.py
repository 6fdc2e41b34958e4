"""The dashboard's web application (Starlette): a JSON API over the ``Catalog`` and the
vendored static front end, behind a guard that answers only the host names the dashboard
serves and, when it has one, only requests carrying its access token. Imported only when the
dashboard starts (``headrace[ui]``)."""

from __future__ import annotations

import functools
import hashlib
import hmac
import ipaddress
import json
import os
import shutil
import subprocess
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from headrace.ui.catalog import Catalog

__all__ = ["HostAndTokenGuard", "cookie_name", "create_app"]

STATIC = os.path.join(os.path.dirname(__file__), "static")


class _JSON(JSONResponse):
    def render(self, content: Any) -> bytes:
        return json.dumps(content, default=str, allow_nan=False, separators=(",", ":")).encode()


Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Awaitable[None]]
_COOKIE_LABEL = b"headrace-ui-cookie"


def cookie_name(port: int) -> str:
    """The access cookie of the dashboard on ``port`` (cookies are not kept apart by port)."""
    return f"headrace-ui-{port}"


def _cookie_value(token: str) -> str:
    # the cookie holds a keyed hash of the token, not the token itself
    return hmac.new(token.encode(), _COOKIE_LABEL, hashlib.sha256).hexdigest()


def _norm(host: str) -> str:
    return host.strip().lower().removeprefix("[").removesuffix("]").rstrip(".")


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def _split_host(value: str) -> tuple[str, int | None] | None:
    """``(name, port)`` of a Host header (``name``, ``name:port``, ``[v6]:port``); None if malformed."""
    value = value.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        if end < 0:
            return None
        name, rest = value[1:end], value[end + 1:]
        if rest and not rest.startswith(":"):
            return None
        port_text = rest[1:] if rest else ""
    elif value.count(":") == 1:
        name, port_text = value.split(":")
    elif ":" in value:
        return None  # a bare IPv6 address without brackets is not a valid Host header
    else:
        name, port_text = value, ""
    if port_text and not (port_text.isdigit() and len(port_text) <= 5):
        return None
    return name.rstrip("."), int(port_text) if port_text else None


class HostAndTokenGuard:
    """ASGI middleware in front of the dashboard.

    - The ``Host`` header must give an IP address or one of ``names`` with the dashboard's
      port, or one of ``extra_names`` (any port: a proxy in front may use its own; ``"*"``:
      any host), else 403. A web page the browser reached under another domain name that
      resolves to this machine (DNS rebinding) cannot read the API; an IP address is safe to
      answer, since a page can only send it as the Host when its own origin is that address.
    - With a ``token``, a request must carry it: ``?token=...`` (checked, then a cookie is set
      and the browser is sent to the same URL without the token), the cookie, or the header
      ``Authorization: Bearer ...``; else 403. The token never appears in a response, a log
      line or an error.

    Called by the server for every request, on its event loop thread.
    """

    def __init__(self, app: ASGIApp, *, port: int, names: Iterable[str], extra_names: Iterable[str] = (),
                 token: str | None) -> None:  # fmt: skip
        self.app = app
        self.port = port
        self.names = {_norm(h) for h in names}
        extra = {_norm(h) for h in extra_names}
        self.any_host = "*" in extra
        self.extra_names = extra - {"*"}
        self._token = token
        self._cookie = _cookie_value(token) if token else None
        self._cookie_name = cookie_name(port)

    def __repr__(self) -> str:
        hosts = sorted(self.names | self.extra_names | ({"*"} if self.any_host else set()))
        return f"HostAndTokenGuard(port={self.port}, hosts={hosts}, token={'set' if self._token else 'none'})"

    def _host_ok(self, raw: str | None) -> bool:
        if self.any_host:
            return True
        got = _split_host(raw) if raw else None
        if got is None:
            return False
        name, port = got
        if name in self.extra_names:
            return True
        return (name in self.names or _is_ip(name)) and (port if port is not None else 80) == self.port

    def _matches(self, given: str | None) -> bool:
        return given is not None and self._token is not None and hmac.compare_digest(given.encode(), self._token.encode())

    async def __call__(self, scope: Scope, receive: Callable[[], Awaitable[Any]], send: Callable[[Any], Awaitable[None]]) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, send)
            return
        if scope["type"] != "http":  # the dashboard serves no websocket: nothing else gets past the guard
            await send({"type": "websocket.close", "code": 1008})
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        if not self._host_ok(headers.get("host")):
            await _plain(send, 403, "headrace dashboard: this dashboard does not answer requests for this host name "
                         f"(the Host header must name one it serves, with port {self.port}); open it as "
                         f"http://127.0.0.1:{self.port}/ on its machine, or start it with --allow-host NAME")  # fmt: skip
            return
        if self._token is None:
            await self.app(scope, receive, send)
            return
        query = parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
        given = [v for k, v in query if k == "token"]
        if given:
            if not self._matches(given[-1]):
                await _plain(send, 403, "headrace dashboard: the token in the URL is not this dashboard's access token")
                return
            rest = urlencode([(k, v) for k, v in query if k != "token"])
            cookie = f"{self._cookie_name}={self._cookie}; Path=/; HttpOnly; SameSite=Strict"
            await _plain(send, 303, "", [("location", quote(scope.get("path", "/")) + (f"?{rest}" if rest else "")),
                                         ("set-cookie", cookie)])  # fmt: skip
            return
        auth = headers.get("authorization", "")
        scheme, _, value = auth.partition(" ")
        if scheme.lower() in ("bearer", "token") and self._matches(value.strip()):
            await self.app(scope, receive, send)
            return
        cookies = dict(_cookie_pairs(headers.get("cookie", "")))
        got = cookies.get(self._cookie_name)
        if got is not None and self._cookie is not None and hmac.compare_digest(got.encode(), self._cookie.encode()):
            await self.app(scope, receive, send)
            return
        await _plain(send, 403, "headrace dashboard: this dashboard needs its access token: open "
                     f"http://HOST:{self.port}/?token=TOKEN once (TOKEN: the HEADRACE_UI_TOKEN it was started with; "
                     "a cookie keeps the page signed in), or send the header 'Authorization: Bearer TOKEN'")  # fmt: skip


def _cookie_pairs(header: str) -> Iterable[tuple[str, str]]:
    for part in header.split(";"):
        name, eq, value = part.strip().partition("=")
        if eq:
            yield name, value


async def _plain(send: Callable[[Any], Awaitable[None]], status: int, text: str,
                 extra: list[tuple[str, str]] | None = None) -> None:  # fmt: skip
    body = (text + "\n").encode() if text else b""
    headers = [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode()),
               (b"x-content-type-options", b"nosniff"), (b"cache-control", b"no-store")]  # fmt: skip
    headers += [(k.encode("latin-1"), v.encode("latin-1")) for k, v in extra or []]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


@functools.lru_cache(maxsize=32)
def _svg(dot: str) -> tuple[bytes | None, str]:
    """A flow graph's DOT drawn as SVG by graphviz's ``dot`` (as ``headrace pipelines graph``
    draws it), or None and why not. Cached per graph: a pipeline's graph seldom changes."""
    exe = shutil.which("dot")
    if exe is None:
        return None, "graphviz's `dot` is not installed on the dashboard's machine (e.g. apt-get install graphviz)"
    try:
        res = subprocess.run([exe, "-Tsvg"], input=dot.encode(), capture_output=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"graphviz's dot failed: {e}"
    if res.returncode != 0:
        return None, f"graphviz's dot failed: {res.stderr.decode(errors='replace').strip()[:300]}"
    return res.stdout, ""


def create_app(catalog: Catalog, *, refresh_ms: int = 1000) -> Starlette:
    """The ASGI app: ``/`` (the page), ``/static/*``, ``/api/queries``,
    ``/api/queries/{key}/progress?after=N``, ``/api/pipelines`` and
    ``/api/pipelines/{key}/graph.svg``. Called once per dashboard; ``start_ui`` puts
    :class:`HostAndTokenGuard` in front of it."""

    async def index(request: Request) -> Response:
        return FileResponse(os.path.join(STATIC, "index.html"), headers={"Cache-Control": "no-cache"})

    async def config(request: Request) -> Response:
        return _JSON({"refreshMs": refresh_ms})

    async def queries(request: Request) -> Response:
        return _JSON(catalog.queries())

    async def progress(request: Request) -> Response:
        raw = request.query_params.get("after")
        try:
            after = int(raw) if raw not in (None, "") else None
        except ValueError:
            return _JSON({"error": f"after={raw!r} is not a batch id"}, status_code=400)
        got = catalog.progress(request.path_params["key"], after=after)
        if got is None:
            return _JSON({"error": "no such query"}, status_code=404)
        return _JSON(got)

    async def pipelines(request: Request) -> Response:
        return _JSON(await run_in_threadpool(catalog.pipelines))

    async def pipeline_graph(request: Request) -> Response:
        dot = await run_in_threadpool(catalog.pipeline_graph, request.path_params["key"])
        if dot is None:
            return _JSON({"error": "no such pipeline, or its event log has no flow graph yet"}, status_code=404)
        svg, why = await run_in_threadpool(_svg, dot)
        if svg is None:
            return _JSON({"error": why}, status_code=503)
        # shown in an <img>: no script in it can run; nosniff keeps it an image
        return Response(svg, media_type="image/svg+xml", headers={"Cache-Control": "no-cache",
                                                                  "X-Content-Type-Options": "nosniff"})  # fmt: skip

    return Starlette(
        routes=[
            Route("/", index),
            Route("/api/config", config),
            Route("/api/queries", queries),
            Route("/api/queries/{key}/progress", progress),
            Route("/api/pipelines", pipelines),
            Route("/api/pipelines/{key}/graph.svg", pipeline_graph),
            Mount("/static", StaticFiles(directory=STATIC), name="static"),
        ]
    )
