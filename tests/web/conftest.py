"""Fixtures of the web UI tests: the Flask app and test client on an in-process dispatcher, a live server in
a thread, headless Chromium through selenium + chromedriver, the full cluster (tests/system's helper), and
stored results in a real InfluxDB with a dispatcher reading them (`glance`)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from stored_results import Glance, glance_world
from web_helpers import CHROMEDRIVER, CHROMIUM, CHROMIUM_ARGS, PASSWORD, USERNAME, web_config

from hoptrace.dispatcher.server import DispatcherServer
from hoptrace.lab.processes import InfluxServer
from hoptrace.web import create_app


@pytest.fixture
def dispatcher() -> Iterator[DispatcherServer]:
    """A real dispatcher (plaintext, loopback) with no agent: ValidateTrace answers from the real code."""
    state = tempfile.mkdtemp(prefix="hoptrace-web-dispatcher-")
    server = DispatcherServer("127.0.0.1:0", state).start()
    try:
        yield server
    finally:
        server.stop(grace=0)
        shutil.rmtree(state, ignore_errors=True)


@pytest.fixture
def app(dispatcher: DispatcherServer) -> Flask:
    """The web app on the in-process dispatcher, which has no report store (GetReport is refused)."""
    return create_app(web_config(DISPATCHER=dispatcher.address))


@pytest.fixture
def client(app: Flask) -> FlaskClient:
    """A test client of `app` (not logged in)."""
    return app.test_client()


@pytest.fixture
def login(client: FlaskClient) -> Callable[[], FlaskClient]:
    """``login()`` logs `client` in (through the form, with its CSRF token) and returns it."""
    import re

    def do_login() -> FlaskClient:
        page = client.get("/login")
        token = re.search(r'name="csrf_token" value="([^"]+)"', page.text).group(1)
        response = client.post(
            "/login", data={"username": USERNAME, "password": PASSWORD, "csrf_token": token}
        )
        assert response.status_code == 302, response.text
        return client

    return do_login


@pytest.fixture
def browser() -> Iterator[Any]:
    """Headless Chromium driven by chromedriver (Debian's chromium + chromium-driver), fresh profile."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    for binary in (CHROMIUM, CHROMEDRIVER):
        if not Path(binary).exists():
            pytest.fail(f"{binary} is missing: apt-get install chromium chromium-driver", pytrace=False)
    profile = tempfile.mkdtemp(prefix="hoptrace-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in (*CHROMIUM_ARGS, f"--user-data-dir={profile}"):
        options.add_argument(argument)
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture
def glance(tmp_path: Path, influxd: InfluxServer) -> Iterator[Glance]:
    """One trace's results and a node's clock in InfluxDB, a dispatcher reading them, two registered agents
    (one never measured): stored_results.glance_world."""
    with glance_world(tmp_path, influxd) as world:
        yield world
