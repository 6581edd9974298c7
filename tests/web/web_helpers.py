"""What the web tests share (imported by conftest.py and the test modules): the test user, the app's test
configuration, a live server in a thread, Chromium's flags, screenshots into test-artifacts/."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from flask import Flask
from werkzeug.security import generate_password_hash
from werkzeug.serving import make_server

TESTS = Path(__file__).resolve().parents[1]
ARTIFACTS = TESTS.parent / "test-artifacts" / "web"

USERNAME = "operator"
PASSWORD = "correct horse battery staple"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
# Headless Chromium that talks to nothing but the page under test.
CHROMIUM_ARGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1280,800",
)


def web_config(**overrides: Any) -> dict[str, Any]:
    """A test configuration with one user (USERNAME/PASSWORD)."""
    return {
        "TESTING": True,
        "SECRET_KEY": "test-secret",
        "USERS": {USERNAME: generate_password_hash(PASSWORD)},
        "POLL_INTERVAL_MS": 1000,
        **overrides,
    }


@contextmanager
def live_server(app: Flask) -> Iterator[str]:
    """`app` served by a threaded WSGI server on a free loopback port; yields its base URL."""
    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, name="web-live-server", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        thread.join(10)


def screenshot(driver: Any, name: str) -> Path:
    """Save the page as test-artifacts/web/NAME.png (git-ignored) and return the path."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    driver.save_screenshot(str(path))
    return path
