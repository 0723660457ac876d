"""``/docs`` is served with its own Swagger UI assets: the page names no other host.

tests/docs/test_docs_offline_browser.py renders the page in a real browser without network;
these pin what it relies on, in process.
"""

from __future__ import annotations

import re

import pytest

from rlserve.service.api.docs_page import ASSETS, asset_bytes

pytestmark = pytest.mark.asyncio


async def test_the_page_loads_only_from_this_server(make_client):
    _, client = make_client(("mlp",))
    page = await client.get("/docs")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    urls = re.findall(r"""(?:src|href)=["']([^"']+)["']""", page.text)
    assert sorted(urls) == ["/docs/assets/favicon-32x32.png", "/docs/assets/swagger-ui-bundle.js",
                            "/docs/assets/swagger-ui.css"]
    assert "url: '/openapi.json'" in page.text
    assert not re.search(r"https?://", page.text), "the page refers to another host"


async def test_the_assets_are_swagger_ui_itself(make_client):
    _, client = make_client(("mlp",))
    for name, media_type in ASSETS.items():
        answer = await client.get(f"/docs/assets/{name}")
        assert answer.status_code == 200 and answer.headers["content-type"] == media_type, name
        assert answer.content == asset_bytes(name) and len(answer.content) > 500, name
    assert (await client.get("/docs/assets/favicon-32x32.png")).content.startswith(b"\x89PNG")
    bundle = (await client.get("/docs/assets/swagger-ui-bundle.js")).text
    assert "SwaggerUIBundle" in bundle
    missing = await client.get("/docs/assets/../../etc/passwd")
    assert missing.status_code == 404
    unknown = await client.get("/docs/assets/index.html")
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "not_found"


async def test_fastapis_cdn_pages_are_gone(make_client):
    _, client = make_client(("mlp",))
    assert (await client.get("/redoc")).status_code == 404
    paths = (await client.get("/openapi.json")).json()["paths"]
    assert not any(path.startswith("/docs") for path in paths)
