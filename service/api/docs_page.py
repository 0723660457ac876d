"""``/docs``: the interactive API documentation, with Swagger UI served by the app itself.

FastAPI's own ``/docs`` page loads Swagger UI's script and stylesheet from a public CDN, so
on a machine without internet access (a cluster node, a robot) the page stays blank. Here
the page points at ``/docs/assets/...``, which this router answers from the files of the
``fastapi-swagger`` package (it ships Swagger UI's dist build and follows its releases), read
once and kept in memory. ``/redoc`` (also CDN-only) is not served.
"""

from __future__ import annotations

import functools
from importlib import resources

from fastapi import APIRouter, Request, Response
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse

from rlserve.service.errors import NotFound

router = APIRouter(include_in_schema=False)

ASSET_PACKAGE = "fastapi_swagger.resources"
ASSETS = {
    "swagger-ui-bundle.js": "text/javascript; charset=utf-8",
    "swagger-ui.css": "text/css; charset=utf-8",
    "favicon-32x32.png": "image/png",
}


@functools.cache
def asset_bytes(name: str) -> bytes:
    """One of Swagger UI's files, from the installed package."""
    return resources.files(ASSET_PACKAGE).joinpath(name).read_bytes()


@router.get("/docs")
async def swagger_ui(request: Request) -> HTMLResponse:
    root = request.scope.get("root_path", "").rstrip("/")
    return get_swagger_ui_html(
        openapi_url=f"{root}{request.app.openapi_url}",
        title=f"{request.app.title} - Swagger UI",
        swagger_js_url=f"{root}/docs/assets/swagger-ui-bundle.js",
        swagger_css_url=f"{root}/docs/assets/swagger-ui.css",
        swagger_favicon_url=f"{root}/docs/assets/favicon-32x32.png",
    )


@router.get("/docs/assets/{name}")
async def swagger_asset(name: str) -> Response:
    media_type = ASSETS.get(name)
    if media_type is None:
        raise NotFound(f"no documentation asset {name!r}")
    return Response(asset_bytes(name), media_type=media_type, headers={"cache-control": "public, max-age=86400"})
