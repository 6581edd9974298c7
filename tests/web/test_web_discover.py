"""The new-trace page discovers its hops (Hoptrace.Discover): the filter's fields instead of hop rows, the
dispatcher's errors next to the fields, and on the whole system (two emulated hosts, real agents, a UDP flow)
the discovered path filling the hop rows in order, shown with its share, then applied as it stands."""

from __future__ import annotations

import html
import re

import pytest
from flask.testing import FlaskClient
from system_helpers import UdpSender, running_cluster
from test_discover import EXPECTED_NAMES, expected_hops
from test_web_app import field_errors, token_of
from web_helpers import PASSWORD, USERNAME, web_config

from hoptrace.v1 import api_pb2
from hoptrace.web import create_app

pytestmark = pytest.mark.kernel  # running_cluster's agents load BPF here


def test_discover_needs_protocol_and_source_and_says_so_next_to_them(client: FlaskClient, login):
    login()
    token = token_of(client.get("/traces/new").text)
    page = client.post("/traces/new", data={"csrf_token": token, "name": "x", "action": "discover"})
    assert page.status_code == 422
    errors = field_errors(page.text)
    assert "required" in errors["src"] and "udp or tcp" in errors["protocol"]
    bad = client.post(
        "/traces/new",
        data={"csrf_token": token, "protocol": "udp", "src": "198.18.1.2", "action": "discover",
              "discover_duration": "soon", "dst_port": "http"},
    )  # fmt: skip
    errors = field_errors(bad.text)
    assert "soon" in errors["discover_duration"] and "http" in errors["dst_port"]


def hop_rows(page: str) -> list[tuple[str, str, str, str, str]]:
    """(name, node, netns, dev, at) of each filled hop row of the form."""
    values = dict(re.findall(r'name="(hops-\d+-\w+)" value="([^"]*)"', page))
    for number, options in re.findall(r'<select name="hops-(\d+)-node".*?>(.*?)</select>', page, re.S):
        chosen = re.search(r'<option value="([^"]+)" selected', options)
        values[f"hops-{number}-node"] = chosen.group(1) if chosen else ""
    rows = []
    for index in range(64):
        name = values.get(f"hops-{index}-name")
        if not name:
            break
        keys = ("name", "node", "netns", "dev", "at")
        rows.append(tuple(html.unescape(values.get(f"hops-{index}-{k}", "")) for k in keys))
    return rows


def test_discover_fills_the_hops_in_order_and_applies(topology, influxd):
    with running_cluster(topology, influxd.url) as cluster:
        app = create_app(
            web_config(DISPATCHER=cluster.dispatcher_addr, DISPATCHER_CHANNEL_FACTORY=cluster.channel)
        )
        client = app.test_client()
        token = token_of(client.get("/login").text)
        client.post("/login", data={"username": USERNAME, "password": PASSWORD, "csrf_token": token})
        token = token_of(client.get("/traces/new").text)
        form = {
            "csrf_token": token, "name": "web-discovered", "protocol": "udp", "src": topology.addr("c1"),
            "dst": topology.addr("c2"), "dst_port": "12141", "discover_duration": "2",
        }  # fmt: skip
        sender = UdpSender(topology, "c1", "c2", 12141, rate_pps=200).start()
        try:
            page = client.post("/traces/new", data={**form, "action": "discover"})
        finally:
            sender.stop()
        assert page.status_code == 200, html.unescape(page.text)
        rows = hop_rows(page.text)
        assert [r[0] for r in rows] == EXPECTED_NAMES
        assert [(r[1], r[2], r[3], r[4]) for r in rows] == expected_hops(topology)
        assert re.search(r"Path 1 of 1: \d+ packets \(100%\)", page.text)
        assert 'id="name" value="web-discovered"' in page.text  # the user's name stays
        # Apply the filled form as it stands.
        posted = {**form, "action": "apply"}
        for index, (name, node, netns, dev, at) in enumerate(rows):
            values = {"name": name, "node": node, "netns": netns, "dev": dev, "at": at}
            posted.update({f"hops-{index}-{key}": value for key, value in values.items()})
        applied = client.post("/traces/new", data=posted)
        assert applied.status_code == 302, html.unescape(applied.text)
        trace = cluster.api().GetTrace(api_pb2.GetTraceRequest(name="web-discovered"))
        assert [h.name for h in trace.spec.hops] == EXPECTED_NAMES
        cluster.api().DeleteTrace(api_pb2.DeleteTraceRequest(name="web-discovered"))
