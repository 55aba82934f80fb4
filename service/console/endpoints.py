"""The browser's routes: /docs, /redoc, /console, their assets, and a node's wiring as SVG.

The pages and their assets are open (service/access.py): they hold no data. The
console reads everything through the API with the caller's own token, so what a
page shows is what that token may read. Every URL a page uses is relative to the
page, so a proxy that serves the service under a prefix (``/topoplace/docs``)
needs nothing more from the service (docs/console.md).
"""

from __future__ import annotations

import base64
import hashlib
import re
from importlib import resources
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Depends, FastAPI
from fastapi import Path as PathParam
from fastapi.openapi.docs import get_swagger_ui_oauth2_redirect_html
from fastapi.responses import HTMLResponse, Response
from fastapi.staticfiles import StaticFiles

from service.console.topology import topology_svg
from service.deps import get_state
from service.state import ServiceState

STATIC = Path(__file__).parent / "static"
# Swagger UI and ReDoc as fastapi-offline ships them (their licences travel in the files).
DOCS_ASSETS = Path(str(resources.files("fastapi_offline") / "static"))
ASSETS = {"/assets/console": STATIC, "/assets/docs": DOCS_ASSETS}

router = APIRouter()
State = Annotated[ServiceState, Depends(get_state)]
NodeName = Annotated[str, PathParam(min_length=1, max_length=253)]

SVG = {"content": {"image/svg+xml": {"schema": {"type": "string"}}}, "description": "the picture"}


def mount_assets(app: FastAPI) -> None:
    """Serve the pages' scripts and styles from the package."""
    for prefix, folder in ASSETS.items():
        app.mount(prefix, StaticFiles(directory=folder), name=prefix.strip("/").replace("/", "-"))


# The pages load nothing but this service's own files: what a bundled script would fetch
# from elsewhere (ReDoc's footer logo from its vendor's CDN) is refused by the browser
# before it is asked for, so the pages behave the same with and without a way out.
# Inline styles: Swagger UI, ReDoc and the wiring SVG set them; no inline script runs.
CSP = (
    "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline';"
    " worker-src 'self' blob:; connect-src 'self'; object-src 'none'; base-uri 'self';"
    " frame-ancestors 'self'"
)


def _script_hash(script: str) -> str:
    """The CSP source allowing exactly this inline script."""
    return f"'sha256-{base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()}'"


# Swagger UI's OAuth2 redirect page is one inline script: that script, by its hash, and
# nothing else may run there (service/edge/headers.py gives every answer its headers).
_REDIRECT = bytes(get_swagger_ui_oauth2_redirect_html().body).decode()
REDIRECT_CSP = (
    "default-src 'none'; script-src "
    + " ".join(_script_hash(s) for s in re.findall(r"<script>(.*?)</script>", _REDIRECT, re.S))
    + "; frame-ancestors 'self'; base-uri 'none'; form-action 'none'"
)


def _page(name: str) -> HTMLResponse:
    html = (STATIC / name).read_text(encoding="utf-8")
    # no-cache: a new release's page is fetched again, not taken from a stale cache.
    headers = {"Cache-Control": "no-cache", "Content-Security-Policy": CSP}
    return HTMLResponse(html, headers=headers)


@router.get("/docs", include_in_schema=False)
def swagger_ui() -> HTMLResponse:
    return _page("docs.html")


@router.get("/docs/oauth2-redirect", include_in_schema=False)
def swagger_ui_redirect() -> HTMLResponse:
    page = get_swagger_ui_oauth2_redirect_html()
    page.headers["Content-Security-Policy"] = REDIRECT_CSP
    return page


@router.get("/redoc", include_in_schema=False)
def redoc() -> HTMLResponse:
    return _page("redoc.html")


@router.get("/console", include_in_schema=False)
def console() -> HTMLResponse:
    return _page("console.html")


@router.get(
    "/v1/nodes/{name}/topology.svg",
    tags=["nodes"],
    response_class=Response,
    responses={200: SVG},
)
def get_topology_svg(name: NodeName, state: State) -> Response:
    """The node's GPU wiring as a picture: NUMA nodes, PCIe switch groups, NICs, NVLink
    islands and lane counts, each GPU coloured by the allocation holding it."""
    return Response(topology_svg(state, name), media_type="image/svg+xml")
