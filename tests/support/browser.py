"""Debian's Chromium driven by Playwright, for the dashboard's and the API docs' browser tests
(its own browser download cannot reach the internet here); with CI=true a missing browser
fails them."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from typing import Any

import pytest

CHROMIUM = os.environ.get("TUNEFARM_CHROMIUM") or shutil.which("chromium") or shutil.which(
    "chromium-browser")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    why = None
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        why = "playwright is not installed (pip install -e '.[test]')"
    if why is None and CHROMIUM is None:
        why = "no Chromium (apt-get install chromium; or set TUNEFARM_CHROMIUM)"
    if why is not None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{why}; CI=true requires the browser tests", pytrace=False)
        pytest.skip(why)
    args = ["--no-sandbox"] if os.geteuid() == 0 else []  # Chromium refuses root otherwise
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=args)
        yield b
        b.close()
