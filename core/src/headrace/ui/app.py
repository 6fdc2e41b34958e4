"""The dashboard's web application (Starlette): a JSON API over the ``Catalog`` and the
vendored static front end. Imported only when the dashboard starts (``headrace[ui]``)."""

from __future__ import annotations

import json
import os
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from headrace.ui.catalog import Catalog

__all__ = ["create_app"]

STATIC = os.path.join(os.path.dirname(__file__), "static")


class _JSON(JSONResponse):
    def render(self, content: Any) -> bytes:
        return json.dumps(content, default=str, allow_nan=False, separators=(",", ":")).encode()


def create_app(catalog: Catalog, *, refresh_ms: int = 1000) -> Starlette:
    """The ASGI app: ``/`` (the page), ``/static/*``, ``/api/queries`` and
    ``/api/queries/{key}/progress?after=N``. Called once per dashboard."""

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

    return Starlette(
        routes=[
            Route("/", index),
            Route("/api/config", config),
            Route("/api/queries", queries),
            Route("/api/queries/{key}/progress", progress),
            Mount("/static", StaticFiles(directory=STATIC), name="static"),
        ]
    )
