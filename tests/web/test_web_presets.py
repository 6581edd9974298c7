"""The Presets page: login and CSRF like every form, the dispatcher's RunPreset errors next to the fields, and
on the whole system (two emulated hosts, real agents) a MACE run whose summary table the page shows."""

from __future__ import annotations

import html
import re
import time

import pytest
from flask.testing import FlaskClient
from system_helpers import UdpSender, running_cluster
from test_web_app import field_errors, token_of
from web_helpers import PASSWORD, USERNAME, web_config

from hoptrace.web import create_app

pytestmark = pytest.mark.kernel  # running_cluster's agents load BPF here


def test_presets_page_needs_login_and_the_csrf_token(client: FlaskClient, login):
    response = client.get("/presets/")
    assert response.status_code == 302 and "/login" in response.headers["Location"]
    login()
    page = client.get("/presets/")
    assert page.status_code == 200
    assert 'id="preset-form"' in page.text and 'href="/presets/"' in page.text  # the form and the nav link
    form = {"node": "host-a", "preset": "iron", "duration": "1"}
    assert client.post("/presets/", data=form).status_code == 400
    assert client.post("/presets/", data={**form, "csrf_token": "forged"}).status_code == 400


def test_preset_form_shows_the_dispatchers_errors(client: FlaskClient, login):
    login()
    token = token_of(client.get("/presets/").text)
    unknown = client.post("/presets/", data={"csrf_token": token, "node": "host-a", "preset": "nope"})
    assert unknown.status_code == 400
    assert "unknown preset 'nope'" in field_errors(unknown.text)["preset"]
    no_container = client.post(
        "/presets/", data={"csrf_token": token, "node": "host-a", "preset": "mace", "duration": "1"}
    )
    assert field_errors(no_container.text)["container"] == "args.container: required"
    absent = client.post(
        "/presets/", data={"csrf_token": token, "node": "host-z", "preset": "iron", "duration": "1"}
    )
    assert absent.status_code == 502
    assert "node &#39;host-z&#39;: no agent connected" in absent.text


def test_mace_preset_from_the_form_shows_the_containers_overhead(topology, influxd):
    with running_cluster(topology, influxd.url) as cluster:
        app = create_app(
            web_config(DISPATCHER=cluster.dispatcher_addr, DISPATCHER_CHANNEL_FACTORY=cluster.channel)
        )
        client = app.test_client()
        token = token_of(client.get("/login").text)
        client.post("/login", data={"username": USERNAME, "password": PASSWORD, "csrf_token": token})
        page = client.get("/presets/").text
        assert '<option value="host-a"' in page and '<option value="host-b"' in page
        sender = UdpSender(topology, "c1", "c2", 12131, rate_pps=300).start()
        try:
            time.sleep(0.5)
            form = {
                "csrf_token": token_of(page),
                "node": "host-a",
                "preset": "mace",
                "container": topology.c1,
                "path": "inner-dev",
                "peer": topology.addr("c2"),
                "duration": "2",
            }
            response = client.post("/presets/", data=form)
        finally:
            sender.stop()
    assert response.status_code == 200, html.unescape(response.text)
    table = re.search(r'<table class="grid" id="mace-table">.*?</table>', response.text, re.S).group(0)
    egress = re.search(r'<tr data-direction="egress">(.*?)</tr>', table, re.S).group(1)
    cells = [re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<td[^>]*>.*?</td>", egress, re.S)]
    assert int(cells[1]) >= 300  # packets: 2 s at 300 pps
    assert float(cells[5].rstrip("%")) > 90  # coverage
    assert cells[2] not in ("0ns", "")  # mean overhead
