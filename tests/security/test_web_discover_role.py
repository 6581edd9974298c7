"""The web UI discovers a path with its own credentials: `hoptrace web` started as the demo starts it (mutual
TLS, the `web` certificate and its operator token) runs Discover from the new-trace page. It once answered
"token 'web' has role operator; Discover needs admin", with a stray "hops: must list at least one hop"."""

from __future__ import annotations

import html
import http.cookiejar
import re
import secrets
import urllib.parse
import urllib.request

from system_helpers import UdpSender

from hoptrace.lab.localcluster import LocalCluster

PORT = 12151


def csrf_of(page: str) -> str:
    return re.search(r'name="csrf_token" value="([^"]+)"', page).group(1)


def test_the_web_token_discovers_a_path(topology, influxd):
    cluster = LocalCluster(influx_url=influxd.url)
    assert cluster.secure and cluster.certs is not None
    try:
        cluster.start_dispatcher()
        cluster.start_collector()
        cluster.wait_listening()
        # each agent owns its own host's namespaces, as on real hosts (and as LocalCluster.start_on does)
        cluster.start_agent("host-a", topology.host_a, "--netns-owned", topology.c1)
        cluster.start_agent("host-b", topology.host_b, "--netns-owned", topology.c2)
        cluster.wait_agents(["host-a", "host-b"])
        password = secrets.token_hex(8)
        _, base = cluster.start_web(password)
        cluster.wait_http(base + "/login")

        browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))

        def post(path: str, form: dict[str, str]) -> tuple[int, str]:
            body = urllib.parse.urlencode(form).encode()
            try:
                with browser.open(base + path, data=body, timeout=60) as response:
                    return response.status, response.read().decode()
            except urllib.error.HTTPError as error:
                return error.code, error.read().decode(errors="replace")

        login_page = browser.open(base + "/login", timeout=30).read().decode()
        status, _ = post(
            "/login", {"username": "admin", "password": password, "csrf_token": csrf_of(login_page)}
        )
        assert status == 200  # the redirect to the traces page was followed
        form_page = browser.open(base + "/traces/new", timeout=30).read().decode()
        form = {
            "csrf_token": csrf_of(form_page), "name": "web-role", "protocol": "udp",
            "src": topology.addr("c1"), "dst": topology.addr("c2"), "dst_port": str(PORT),
            "discover_duration": "2", "action": "discover",
        }  # fmt: skip
        sender = UdpSender(topology, "c1", "c2", PORT, rate_pps=200).start()
        try:
            status, page = post("/traces/new", form)
        finally:
            sender.stop()
        text = html.unescape(page)
        assert status == 200, text
        assert "needs admin" not in text and "must list at least one hop" not in text
        assert re.search(r"Path 1 of 1: \d+ packets \(100%\)", text), text
        assert 'name="hops-0-name" value="' in page and sender.sent > 0
    finally:
        cluster.stop()
