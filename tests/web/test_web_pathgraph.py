"""The path graph in a real browser (headless Chromium) on three emulated hosts with a routed hop and two
equal-cost wires (lab/routed.py), with the real dispatcher, collector, three agents and InfluxDB.

Discovery is started from the new-trace page's filter (no hop rows): progress shows while the agents look,
then the graph: one box per host with exactly the discovered device crossings of that host in path order,
both ECMP paths with their shares, and on every edge the median and p99 the dispatcher's Discover answer gave
(read off the gRPC stream the web app itself received). "Apply path 1 as trace" applies that path; its
results page draws the same hops with the report's p50/p99 (GetReport) on the edges. A flow nobody sends
gives the dispatcher's "no packet ... seen" message after the duration. The screenshots (test-artifacts/web/
discover-path-graph.png, results-path-graph.png) are the ones in docs/screenshots/.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.select import Select
from system_helpers import wait_report
from test_discover_routed import PORT, UdpFlows, cluster3, expected, routed, wire_of  # noqa: F401 - fixtures
from test_web_browser import fill, wait
from web_helpers import PASSWORD, USERNAME, live_server, screenshot, web_config

from hoptrace.lab.localcluster import LocalCluster
from hoptrace.lab.routed import RoutedTopology
from hoptrace.results.format import format_ns
from hoptrace.results.report_view import latency_text, report_from_proto
from hoptrace.v1 import api_pb2, trace_pb2
from hoptrace.web import create_app

pytestmark = pytest.mark.kernel  # running_cluster's agents load BPF here

TRACE = "web-graph"


class RecordDiscover(grpc.UnaryStreamClientInterceptor):
    """Keeps every DiscoverResult the web app receives from the dispatcher (the API's own answer)."""

    def __init__(self) -> None:
        self.results: list[api_pb2.DiscoverResult] = []

    def intercept_unary_stream(self, continuation: Callable, details: Any, request: Any) -> Iterator[Any]:
        for event in continuation(details, request):
            if isinstance(event, api_pb2.DiscoverEvent) and event.HasField("result"):
                self.results.append(event.result)
            yield event


def web_app(cluster: LocalCluster, recorder: RecordDiscover):
    return create_app(
        web_config(
            DISPATCHER=cluster.dispatcher_addr,
            DISPATCHER_CHANNEL_FACTORY=lambda: grpc.intercept_channel(cluster.channel(), recorder),
        )
    )


def log_in(browser: Any, base: str) -> None:
    browser.get(base + "/traces/new")
    wait(browser, expected_conditions.url_contains("/login"), what="the login form")
    browser.find_element(By.ID, "username").send_keys(USERNAME)
    browser.find_element(By.ID, "password").send_keys(PASSWORD)
    browser.find_element(By.ID, "login").click()
    # Not url_contains("/traces/new"): the login page's own URL has it (?next=...), so that wait could end
    # before the login's redirect did.
    wait(browser, expected_conditions.presence_of_element_located((By.ID, "name")), what="the new-trace form")


def start_discovery(browser: Any, topo: RoutedTopology, name: str, seconds: str) -> list[str]:
    """Fill the filter (no hop rows), press "Discover path" and wait for the end; the progress lines seen
    meanwhile."""
    fill(browser.find_element(By.ID, "name"), name)
    Select(browser.find_element(By.ID, "protocol")).select_by_value("udp")
    fill(browser.find_element(By.ID, "src"), topo.addr("c1"))
    fill(browser.find_element(By.ID, "dst"), topo.addr("c2"))
    fill(browser.find_element(By.ID, "dst_port"), str(PORT))
    fill(browser.find_element(By.ID, "discover_duration"), seconds)
    browser.find_element(By.ID, "discover-button").click()
    seen: list[str] = []

    def finished(driver: Any) -> bool:
        text = driver.find_element(By.ID, "discover-progress").text
        if text and (not seen or seen[-1] != text):
            seen.append(text)
        return driver.find_element(By.ID, "discover").get_attribute("data-state") == "done"

    wait(browser, finished, timeout_s=float(seconds) + 60, what="the discovery's end")
    return seen


def place(hop: trace_pb2.HopSpec) -> str:
    return "|".join((hop.node, hop.netns, hop.dev, hop.at))


def graph_vertices(browser: Any) -> dict[str, list[tuple[str, str, str]]]:
    """Per host box: its vertices' (netns, dev, at) in drawing order."""
    drawn = browser.execute_script(
        """return [...document.querySelectorAll('#path-graph g.host')].map((host) => [
          host.dataset.node,
          [...host.querySelectorAll('g.vertex')].map((v) => [v.dataset.netns, v.dataset.dev, v.dataset.at]),
        ]);"""
    )  # pairs, not an object: the hosts' drawing order survives
    return {node: [tuple(v) for v in vertices] for node, vertices in drawn}


def graph_edges(browser: Any) -> dict[tuple[str, str], dict[str, str]]:
    """Every edge by (from, to) vertex id: its median and p99 as drawn, and the raw ns it carries."""
    edges = browser.execute_script(
        """return [...document.querySelectorAll('#path-graph g.edge')].map((e) => ({
          from: e.dataset.from, to: e.dataset.to, median_ns: e.dataset.medianNs, p99_ns: e.dataset.p99Ns,
          median: e.querySelector('tspan.median').textContent,
          p99: (e.querySelector('tspan.p99') || {textContent: ''}).textContent}));"""
    )
    return {(e["from"], e["to"]): e for e in edges}


def per_node(places: list[tuple[str, str, str, str]]) -> dict[str, list[tuple[str, str, str]]]:
    out: dict[str, list[tuple[str, str, str]]] = {}
    for node, netns, dev, at in places:
        if (netns, dev, at) not in out.setdefault(node, []):
            out[node].append((netns, dev, at))
    return out


def test_graph_of_two_ecmp_paths_applied_then_on_results(routed, cluster3, browser):  # noqa: F811 (fixtures)
    """Discovery over both wires: the graph per host, the edges' latencies, the shares; path 2 applied
    from the graph; its results page draws the same hops with the report's numbers."""
    sports = list(range(30000, 30032))
    on_wire1 = sum(wire_of(routed, sport) for sport in sports)
    assert 0 < on_wire1 < len(sports), "the hash put every flow on one wire: pick other ports"
    recorder = RecordDiscover()
    with live_server(web_app(cluster3, recorder)) as base:
        log_in(browser, base)
        assert not browser.find_elements(By.CSS_SELECTOR, "#hops tbody tr.hop input[value]:not([value=''])")
        with UdpFlows(routed, sports):
            progress = start_discovery(browser, routed, TRACE, "3")
        assert any(line.startswith("looking") for line in progress), progress  # while the agents look
        assert browser.find_element(By.ID, "discover-message").text == ""
        assert len(recorder.results) == 1
        result = recorder.results[0]

        # -- the API's answer: two paths, each the exact ten crossings over its wire
        assert len(result.paths) == 2, [[h.name for h in p.hops] for p in result.paths]
        wires = [0 if any(h.dev == "wa0" for h in p.hops) else 1 for p in result.paths]
        for path, wire in zip(result.paths, wires, strict=True):
            assert [(h.node, h.netns, h.dev, h.at) for h in path.hops] == expected(routed, wire)

        # -- the graph: per host exactly the discovered crossings, in path order (the main path's first)
        drawn = graph_vertices(browser)
        want = per_node(expected(routed, wires[0]) + expected(routed, wires[1]))
        assert drawn == want, drawn
        assert list(drawn) == ["host-a", "host-r", "host-b"]  # hosts left to right in path order
        assert drawn["host-a"][3:] == [("", f"wa{wires[0]}", "tc-egress"), ("", f"wa{wires[1]}", "tc-egress")]
        namespaces = browser.execute_script(
            "return [...document.querySelectorAll('#path-graph g.netns')].map((n) => n.dataset.netns)"
        )
        assert namespaces == [routed.c1, routed.c2]

        # -- each edge: the median and p99 of the API's segment, and nothing else drawn
        edges = graph_edges(browser)
        segments = {(place(s.from_hop), place(s.to_hop)): s for s in result.segments}
        assert len(segments) == 12  # 6 steps both paths share + 3 of each wire's own
        assert set(edges) == set(segments)
        for key, segment in segments.items():
            edge = edges[key]
            assert (int(edge["median_ns"]), int(edge["p99_ns"])) == (segment.median_ns, segment.p99_ns)
            assert edge["median"] == format_ns(segment.median_ns), (key, edge)
            assert edge["p99"] == f"p99 {format_ns(segment.p99_ns)}", (key, edge)
        both = segments[(place(result.paths[0].hops[0]), place(result.paths[0].hops[1]))]
        assert both.packets == result.packets and both.median_ns > 0  # c1 eth0 -> veth-c1: every packet

        # -- each path with its share, as the API gave it and as the kernel's hash predicts
        legend = browser.find_elements(By.CSS_SELECTOR, "#path-graph li.path")
        assert len(legend) == 2
        for item, path in zip(legend, result.paths, strict=True):
            shown = item.find_element(By.CSS_SELECTOR, ".path-share").text
            assert shown == f"{path.packets} packets ({path.share * 100:.0f}%)", shown
        share1 = next(p.share for p, w in zip(result.paths, wires, strict=True) if w == 1)
        assert abs(share1 - on_wire1 / len(sports)) < 0.05, (share1, on_wire1)
        # The main path fills the hop rows.
        names = browser.execute_script(
            "return [...document.querySelectorAll('#hops tbody tr.hop input[name$=\"-name\"]')]"
            ".map((i) => i.value).filter((v) => v)"
        )
        assert names == [h.name for h in result.paths[0].hops]
        browser.execute_script("document.getElementById('discover').scrollIntoView()")
        screenshot(browser, "discover-path-graph")

        # -- apply the second path (the minor wire) from the graph
        browser.find_element(By.CSS_SELECTOR, "button.apply-path[data-path='2']").click()
        wait(browser, expected_conditions.url_contains(f"/traces/{TRACE}"), what="the applied trace's page")
        trace = cluster3.api().GetTrace(api_pb2.GetTraceRequest(name=TRACE))
        assert [h.name for h in trace.spec.hops] == [h.name for h in result.paths[1].hops]
        assert [place(h) for h in trace.spec.hops] == [place(h) for h in result.paths[1].hops]

        # -- its results: the graph of the trace's hops with the report's p50/p99 on each edge
        sport = next(s for s in sports if wire_of(routed, s) == wires[1])
        time.sleep(0.5)  # the agents attach the new trace
        with UdpFlows(routed, [sport], rate_pps=200) as flow:
            time.sleep(2)
        report = wait_report(cluster3, TRACE, flow.sent)
        assert report["complete"] == flow.sent
        browser.get(f"{base}/traces/{TRACE}/results?since=15m")
        wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#path-graph g.edge"), what="the graph")
        assert graph_vertices(browser) == per_node(expected(routed, wires[1]))
        request_ = api_pb2.GetReportRequest(trace=TRACE)
        request_.start.FromSeconds(int(time.time()) - 900)
        api = report_from_proto(cluster3.api().GetReport(request_, timeout=60))
        assert api["complete"] == flow.sent
        edges = graph_edges(browser)
        hops = list(trace.spec.hops)
        assert len(edges) == len(hops) - 1
        by_names = {(s["from"], s["to"]): s for s in api["segments"]}
        for before, after in zip(hops, hops[1:], strict=False):
            edge, segment = edges[(place(before), place(after))], by_names[(before.name, after.name)]
            assert segment["count"] == flow.sent
            assert (int(edge["median_ns"]), int(edge["p99_ns"])) == (segment["p50_ns"], segment["p99_ns"])
            assert edge["median"] == latency_text(segment, "p50_ns"), edge
            assert edge["p99"] == f"p99 {latency_text(segment, 'p99_ns')}", edge
        browser.execute_script("document.getElementById('path-graph').scrollIntoView()")
        screenshot(browser, "results-path-graph")
        cluster3.api().DeleteTrace(api_pb2.DeleteTraceRequest(name=TRACE))


def test_a_flow_nobody_sends_says_so_after_the_duration(routed, cluster3, browser):  # noqa: F811
    """No sender, looking on the two nodes ticked: after the duration, the dispatcher's message naming
    them, and no graph."""
    recorder = RecordDiscover()
    with live_server(web_app(cluster3, recorder)) as base:
        log_in(browser, base)
        ticked = ["host-a", "host-b"]
        for node in ticked:
            browser.find_element(By.CSS_SELECTOR, f"input[name='discover_nodes'][value='{node}']").click()
        started = time.monotonic()
        start_discovery(browser, routed, "nothing", "1")
        took = time.monotonic() - started
        message = browser.find_element(By.ID, "discover-message").text
        assert [r.message for r in recorder.results] == [message]
        assert [list(r.nodes) for r in recorder.results] == [ticked]
        assert re.fullmatch(r"no packet of the flow was seen in 1s on host-a, host-b: .+", message), message
        assert took >= 1.0
        assert not browser.find_element(By.ID, "path-graph").is_displayed()
        assert not browser.find_elements(By.CSS_SELECTOR, "#path-graph g.vertex")
