"""/ui: the dashboard, served by the API itself (no other server, no CDN: a farm is often
air-gapped). Static files shipped in the package (`api/ui/`): one HTML page and ES modules that
read the same REST endpoints as every other client, with the bearer token the person signs in
with (kept in the tab's sessionStorage; a new tab borrows it from an open one). The tuning
curve is drawn on a canvas by `chart.js`; the knob views and the comparison of jobs by Apache
ECharts, vendored in `static/vendor/` (its version in `explain.js`'s header), so nothing is
fetched from elsewhere.

The page is locked down by its headers: scripts, styles and connections from this origin only
(no inline script, no eval), never framed, no referrer sent."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, FastAPI
from fastapi.responses import FileResponse, RedirectResponse
from starlette.staticfiles import StaticFiles
from starlette.types import Message, Receive, Scope, Send

UI_DIR = Path(__file__).resolve().parents[1] / "ui"
STATIC = "/ui/static"
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
                               "img-src 'self' data:; connect-src 'self'; base-uri 'none'; "
                               "form-action 'self'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}

router = APIRouter(include_in_schema=False)


@router.get("/ui")
async def index() -> FileResponse:
    """The single page; the pages inside it are routed by the URL's fragment (#/jobs/...)."""
    return FileResponse(UI_DIR / "index.html", media_type="text/html; charset=utf-8",
                        headers=SECURITY_HEADERS)


@router.get("/ui/")
async def index_slash() -> RedirectResponse:
    return RedirectResponse("/ui", status_code=308)


class _Static(StaticFiles):
    """The page's modules and styles, with the same headers as the page (revalidated on every
    load, so an upgraded API never runs an old script against a new endpoint)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers += [(k.lower().encode(), v.encode()) for k, v in SECURITY_HEADERS.items()]
                message = {**message, "headers": headers}
            await send(message)

        await super().__call__(scope, receive, send_with_headers)


def mount(app: FastAPI) -> None:
    app.mount(STATIC, _Static(directory=UI_DIR / "static"), name="ui-static")


@router.get("/")
async def root() -> RedirectResponse:
    """A person who opens the API's address lands on the dashboard."""
    return RedirectResponse("/ui", status_code=307)
