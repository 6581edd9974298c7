"""A trace whose device or network namespace vanished after the apply is not "active": the agent notices
(attach.Hop.Gone, checked with every heartbeat), reports the trace's status to the dispatcher unasked, and
`hoptrace trace ls`, `trace get` and the web's trace list name the node, the hop and what went away. It read
"1/1 nodes active" with nothing attached.

Real agents on the two-host topology: a veth and a namespace are deleted under a running trace."""

from __future__ import annotations

import html
import http.cookiejar
import re
import secrets
import subprocess
import urllib.parse
import urllib.request

from system_helpers import running_cluster

from hoptrace.lab.waiting import wait_until
from hoptrace.v1 import api_pb2, trace_pb2

TRACE = "vanishing"


def status_of(cluster, trace: str) -> str:
    """The STATUS column of `trace` in `hoptrace trace ls` (the last one)."""
    listed = cluster.hoptrace("trace", "ls").stdout
    row = next(line for line in listed.splitlines() if line.startswith(trace + " "))
    return row[row.index(" nodes active") - 3 :].strip()


def web_traces_page(cluster) -> str:
    """The web's trace list, as a logged-in user sees it (`hoptrace web` with the cluster's web token)."""
    password = secrets.token_hex(8)
    _, base = cluster.start_web(password)
    cluster.wait_http(base + "/login")
    browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
    login = browser.open(base + "/login", timeout=30).read().decode()
    token = re.search(r'name="csrf_token" value="([^"]+)"', login).group(1)
    form = urllib.parse.urlencode({"username": "admin", "password": password, "csrf_token": token})
    browser.open(base + "/login", data=form.encode(), timeout=30).close()
    return html.unescape(browser.open(base + "/traces/", timeout=30).read().decode())


def test_a_vanished_device_or_netns_is_named_in_the_trace_status(topology, influxd):
    hops = [
        ("a-c1-eth0-out", "host-a", "tc-egress", "eth0", topology.c1),
        ("a-veth-in", "host-a", "tc-ingress", "veth-c1", ""),
        ("a-wire-out", "host-a", "tc-egress", "wire0", ""),
        ("b-wire-in", "host-b", "tc-ingress", "wire0", ""),
        ("b-c2-eth0-in", "host-b", "tc-ingress", "eth0", topology.c2),
    ]
    spec = trace_pb2.TraceSpec(
        name=TRACE,
        filter=trace_pb2.Filter(protocol="udp", dst=topology.addr("c2"), dst_port=12161),
        hops=[
            trace_pb2.HopSpec(name=n, node=node, at=at, dev=dev, netns=ns) for n, node, at, dev, ns in hops
        ],
    )
    with running_cluster(topology, influxd.url) as cluster:
        cluster.apply(spec)
        assert status_of(cluster, TRACE) == "2/2 nodes active"

        # The host's end of c1's veth: both ends go, the container's eth0 with it.
        subprocess.run(["ip", "-n", topology.host_a, "link", "del", "veth-c1"], check=True)
        host_a = (
            f"host-a: hop a-c1-eth0-out: device eth0 is gone from netns {topology.c1}; "
            f"hop a-veth-in: device veth-c1 is gone from netns {topology.host_a}"
        )
        wait_until(
            lambda: status_of(cluster, TRACE) == f"1/2 nodes active: {host_a}", "host-a's lost hops", 20
        )

        # c2's whole namespace.
        subprocess.run(["ip", "netns", "del", topology.c2], check=True)
        host_b = f"host-b: hop b-c2-eth0-in: netns {topology.c2} is gone"
        wait_until(
            lambda: status_of(cluster, TRACE) == f"0/2 nodes active: {host_a}; {host_b}",
            "host-b's lost hop",
            20,
        )
        shown = cluster.hoptrace("trace", "get", TRACE).stdout
        assert f"# node host-b: not active: hop b-c2-eth0-in: netns {topology.c2} is gone" in shown, shown

        # The hops whose devices are still there stay attached.
        trace = cluster.api().GetTrace(api_pb2.GetTraceRequest(name=TRACE), timeout=10)
        attached = sorted(hop.name for status in trace.nodes for hop in status.hops if hop.attached)
        assert attached == ["a-wire-out", "b-wire-in"], trace.nodes

        page = web_traces_page(cluster)
        row = re.search(rf'<tr data-trace="{TRACE}">(.*?)</tr>', page, re.S).group(1)
        assert "not running (0/2 nodes)" in row, row
        assert f"host-a: hop a-c1-eth0-out: device eth0 is gone from netns {topology.c1}" in row, row
        assert host_b in row, row

        cluster.hoptrace("trace", "rm", TRACE)
        assert "no traces" in cluster.hoptrace("trace", "ls").stdout
