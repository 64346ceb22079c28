"""The API's interactive documentation at ``/docs``, served whole by this server.

FastAPI's own ``/docs`` page loads Swagger UI from a CDN, so it is blank on a machine
without the internet (and tells the CDN who reads our docs). Here the page and Swagger
UI's script, stylesheet and icon come from the ``swagger-ui-bundle-v2`` package (Swagger
UI 5: it reads OpenAPI 3.1, which FastAPI writes), under ``/docs/assets``; ReDoc, which
has no such package, is not served.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles
from swagger_ui_bundle import swagger_ui_path

ASSETS = "/docs/assets"


def install(app: FastAPI) -> None:
    """``/docs`` and its assets (the app is made with ``docs_url=None``)."""
    app.mount(ASSETS, StaticFiles(directory=swagger_ui_path), name="docs-assets")

    @app.get("/docs", include_in_schema=False)
    def docs() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=app.openapi_url or "/openapi.json",
            title=f"{app.title}: the HTTP API",
            swagger_js_url=f"{ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{ASSETS}/favicon-32x32.png",
        )
