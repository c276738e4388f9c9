"""One browser tab on the dashboard (Chromium via Playwright), for the dashboard's tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.e2e.farm import Farm


class Ui:
    """One browser tab on the dashboard, collecting what the page logs as errors."""

    def __init__(self, browser: Any, farm: Farm, width: int) -> None:
        self.base = farm.api_url
        self.ctx = browser.new_context(viewport={"width": width, "height": 900})
        self.ctx.grant_permissions(["clipboard-read", "clipboard-write"], origin=self.base)
        self.page = self.ctx.new_page()
        self.page.set_default_timeout(30_000)
        self.errors: list[str] = []
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(f"uncaught: {e}"))

    def sign_in(self, token: str) -> None:
        self.page.goto(f"{self.base}/ui")
        self.page.fill("#token", token)
        self.page.click("form.signin button[type=submit]")
        self.page.wait_for_selector("#signed-in")

    def go(self, fragment: str) -> None:
        self.page.evaluate("(f) => { location.hash = f; }", fragment)

    def text(self, selector: str) -> str:
        return str(self.page.inner_text(selector))

    def shot(self, path: Path) -> None:
        self.page.screenshot(path=str(path), full_page=True)

    def close(self) -> None:
        self.ctx.close()
