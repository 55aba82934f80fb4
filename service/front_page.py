"""GET /: where to go from here (the API's description, the health routes, the console).

A person who opens the service's address in a browser gets a short page; a
program gets the same links as JSON. A page is listed only when the
application serves it: the route table is read at request time, so the
page never points at a path that would answer 404.
"""

from __future__ import annotations

from html import escape
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, JSONResponse
from starlette.routing import BaseRoute, Match

router = APIRouter()

CONSOLE_PATH = "/console"


def _serves(routes: list[BaseRoute], path: str) -> bool:
    """Whether a route of the application (an included router's, a mount's) answers GET
    ``path``: asked of the routes themselves, as the router would ask them."""
    scope = {"type": "http", "method": "GET", "path": path, "root_path": "", "headers": []}
    return any(route.matches(scope)[0] is Match.FULL for route in routes)


def links(request: Request) -> dict[str, Any]:
    """The pages the application serves, found in its route table (whoever serves them)."""
    app = request.app
    found: dict[str, Any] = {"service": "topoplace"}
    for key, path in (("docs", "/docs"), ("redoc", "/redoc")):
        if _serves(app.routes, path):
            found[key] = path
    if app.openapi_url:
        found["openapi"] = app.openapi_url
    found["health"] = ["/healthz", "/readyz"]
    if _serves(app.routes, CONSOLE_PATH):
        found["console"] = CONSOLE_PATH
    return found


_TITLES = {
    "docs": "API documentation (Swagger UI)",
    "redoc": "API documentation (ReDoc)",
    "openapi": "OpenAPI document",
    "console": "console",
}


def _page(found: dict[str, Any]) -> str:
    items = [
        f'<li><a href="{escape(found[key])}">{escape(title)}</a></li>'
        for key, title in _TITLES.items()
        if key in found
    ]
    items += [f'<li><a href="{escape(path)}">{escape(path)}</a></li>' for path in found["health"]]
    return (
        '<!doctype html><html><head><meta charset="utf-8"><title>topoplace</title></head>'
        "<body><h1>topoplace</h1><p>Topology-aware GPU placement. The API is under"
        f" <code>/v1</code>.</p><ul>{''.join(items)}</ul></body></html>"
    )


@router.get("/", include_in_schema=False)
def front_page(request: Request) -> Any:
    """Links to the docs, the health routes and the console; HTML for a browser."""
    found = links(request)
    if "text/html" in request.headers.get("accept", ""):
        return HTMLResponse(_page(found))
    return JSONResponse(found)
