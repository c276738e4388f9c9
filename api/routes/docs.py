"""/v1/docs (Swagger UI) and /v1/redoc (ReDoc) from assets shipped with the package (the
`fastapi-offline` wheel vendors swagger-ui-dist and redoc's standalone bundle): no CDN, so the
pages render on an air-gapped farm."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse
from starlette.staticfiles import StaticFiles

from . import V1

STATIC = f"{V1}/docs/static"
OPENAPI = f"{V1}/openapi.json"

router = APIRouter(include_in_schema=False)


def _assets() -> Path:
    import fastapi_offline

    return Path(fastapi_offline.__file__).resolve().parent / "static"


@router.get(f"{V1}/docs")
async def swagger() -> HTMLResponse:
    return get_swagger_ui_html(openapi_url=OPENAPI, title="tunefarm API",
                               swagger_js_url=f"{STATIC}/swagger-ui-bundle.js",
                               swagger_css_url=f"{STATIC}/swagger-ui.css",
                               swagger_favicon_url=f"{STATIC}/favicon.png")


@router.get(f"{V1}/redoc")
async def redoc() -> HTMLResponse:
    return get_redoc_html(openapi_url=OPENAPI, title="tunefarm API",
                          redoc_js_url=f"{STATIC}/redoc.standalone.js",
                          redoc_favicon_url=f"{STATIC}/favicon.png", with_google_fonts=False)


def mount(app: FastAPI) -> None:
    app.mount(STATIC, StaticFiles(directory=_assets()), name="docs-static")
