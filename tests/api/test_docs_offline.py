"""/v1/docs and /v1/redoc render with the network off: Chromium loads them from a real API
process while every request that leaves 127.0.0.1 is refused (no CDN asset can be fetched)."""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)


def _offline_page(browser: Any, base: str) -> tuple[Any, list[str]]:
    ctx = browser.new_context(viewport={"width": 1280, "height": 900})
    page = ctx.new_page()
    refused: list[str] = []

    def only_local(route: Any) -> None:
        if route.request.url.startswith(base):
            route.continue_()
        else:
            refused.append(f"{route.request.resource_type} {route.request.url}")
            route.abort()

    page.route("**/*", only_local)
    return page, refused


def test_swagger_ui_and_redoc_render_offline(live_server: tuple[str, Any],
                                             browser: Any) -> None:
    base, _app = live_server
    page, refused = _offline_page(browser, base)
    page.goto(f"{base}/v1/docs")
    page.wait_for_selector(".swagger-ui .opblock", timeout=30_000)
    ops = page.locator(".swagger-ui .opblock").count()
    assert ops >= 20, ops  # every operation of the document, listed
    assert page.locator(".swagger-ui .info .title").inner_text().startswith("tunefarm")
    assert refused == [], refused  # Swagger UI asked for nothing outside the API
    page.goto(f"{base}/v1/redoc")
    page.wait_for_selector(".menu-content", timeout=30_000)
    assert page.locator(".menu-content li").count() >= 20
    # ReDoc's "powered by" logo is the only thing it asks a CDN for: an image, not its code
    assert all(r.startswith("image ") for r in refused), refused
    page.context.close()
