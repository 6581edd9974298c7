"""The web UI in a real browser (headless Chromium) on the whole system: two emulated hosts, the real
dispatcher, collector, agents and InfluxDB. Log in, build the c1 -> c2 VXLAN trace in the form, watch it
run, send traffic, and read the decomposition the results page draws."""

from __future__ import annotations

import os
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.select import Select
from selenium.webdriver.support.ui import WebDriverWait
from system_helpers import running_cluster
from web_helpers import PASSWORD, USERNAME, live_server, screenshot, web_config

from hoptrace.lab.processes import udp_transfer
from hoptrace.lab.reference import vxlan_path_spec
from hoptrace.spec import load_spec, spec_to_yaml
from hoptrace.v1 import api_pb2
from hoptrace.web import create_app

pytestmark = pytest.mark.kernel  # running_cluster's agents load BPF here

TRACE = "web-udp"
PORT = 11111
PACKETS = 200


def wait(driver: Any, condition: Any, timeout_s: float = 20.0, what: str = "") -> Any:
    """WebDriverWait with a message naming what was awaited.

    The results page re-renders its tables every 2 s: an element found a moment ago may be replaced, so a
    stale element means "look again", not failure.
    """
    return WebDriverWait(
        driver, timeout_s, poll_frequency=0.2, ignored_exceptions=(StaleElementReferenceException,)
    ).until(condition, message=what)


def fill(element: Any, value: str) -> None:
    """Replace an input's value as a user would type it."""
    element.clear()
    if value:
        element.send_keys(value)


def fetch(base: str, path: str, cookies: dict[str, str] | None = None, data: dict[str, str] | None = None):
    """A plain HTTP request (no redirects followed): (status, Location, body)."""

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any, **kwargs: Any) -> None:
            return None

    opener = urllib.request.build_opener(NoRedirect)
    request = urllib.request.Request(
        base + path, data=urllib.parse.urlencode(data).encode() if data else None
    )
    if cookies:
        request.add_header("Cookie", "; ".join(f"{k}={v}" for k, v in cookies.items()))
    try:
        with opener.open(request, timeout=30) as response:
            return response.status, response.headers.get("Location"), response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.headers.get("Location"), error.read().decode(errors="replace")


def test_operator_builds_a_trace_in_the_browser_and_sees_where_the_time_goes(topology, influxd, browser):
    spec = vxlan_path_spec(topology, TRACE, port=PORT)
    with running_cluster(topology, influxd.url) as cluster:
        app = create_app(
            web_config(DISPATCHER=cluster.dispatcher_addr, DISPATCHER_CHANNEL_FACTORY=cluster.channel)
        )
        with live_server(app) as base:
            # -- not logged in: every page sends the browser to the login form
            status, location, _ = fetch(base, "/traces/")
            assert status == 302 and "/login" in location
            browser.get(base + "/agents/")
            wait(browser, expected_conditions.url_contains("/login"), what="redirect to login")
            browser.find_element(By.ID, "username").send_keys(USERNAME)
            browser.find_element(By.ID, "password").send_keys(PASSWORD)
            browser.find_element(By.ID, "login").click()
            # Not url_contains("/agents/"): the login page's own URL has it (?next=/agents/), so that wait
            # could end before the login's redirect did, and the rows be read from the login form.
            wait(
                browser,
                expected_conditions.presence_of_element_located((By.CSS_SELECTOR, "#agents tbody tr")),
                what="back to the agents page, its rows",
            )

            # -- agents: both hosts connected, with their namespaces and devices
            rows = {
                row.get_attribute("data-node"): row.text
                for row in browser.find_elements(By.CSS_SELECTOR, "#agents tbody tr")
            }
            assert set(rows) == {"host-a", "host-b"}, rows
            assert all(" yes " in f" {text} " for text in rows.values()), rows
            namespaces = browser.find_element(By.ID, "node-host-a").text
            assert topology.c1 in namespaces and "vxlan0" in namespaces and "veth-c1" in namespaces
            screenshot(browser, "agents")

            # -- the form: one row per hop, devices and namespaces offered from the chosen node
            browser.get(base + "/traces/new")
            fill(browser.find_element(By.ID, "name"), spec.name)
            Select(browser.find_element(By.ID, "protocol")).select_by_value("udp")
            fill(browser.find_element(By.ID, "src"), spec.filter.src)
            fill(browser.find_element(By.ID, "dst"), spec.filter.dst)
            fill(browser.find_element(By.ID, "dst_port"), str(spec.filter.dst_port))
            for _ in range(len(spec.hops) - 1):
                browser.find_element(By.ID, "add-hop").click()
            rows = browser.find_elements(By.CSS_SELECTOR, "#hops tbody tr.hop")
            assert len(rows) == len(spec.hops)
            wrong_dev = 3  # a-wire-out: typed wrong first, to see the dispatcher's error beside it
            for index, (row, hop) in enumerate(zip(rows, spec.hops, strict=True)):
                number = row.get_attribute("data-row")
                fill(row.find_element(By.NAME, f"hops-{number}-name"), hop.name)
                Select(row.find_element(By.NAME, f"hops-{number}-node")).select_by_value(hop.node)
                fill(row.find_element(By.NAME, f"hops-{number}-at"), hop.at)
                fill(row.find_element(By.NAME, f"hops-{number}-netns"), hop.netns)
                fill(
                    row.find_element(By.NAME, f"hops-{number}-dev"),
                    "wire9" if index == wrong_dev else hop.dev,
                )
            first = rows[0].get_attribute("data-row")
            offered = browser.execute_script(
                f"return [...document.getElementById('dev-{first}').options].map(o => o.value)"
            )
            assert "eth0" in offered, offered  # c1's devices, from host-a's registration
            offered_ns = browser.execute_script(
                f"return [...document.getElementById('netns-{first}').options].map(o => o.value)"
            )
            assert topology.c1 in offered_ns and "" in offered_ns, offered_ns  # host-a's own and c1

            bad = rows[wrong_dev].get_attribute("data-row")
            error = wait(
                browser,
                lambda d: d.find_element(By.ID, f"err-hops-{bad}-dev").text or False,
                what="inline error under the wrong device",
            )
            assert "no device 'wire9'" in error and "wire0" in error, error
            screenshot(browser, "form-inline-error")
            fill(rows[wrong_dev].find_element(By.NAME, f"hops-{bad}-dev"), spec.hops[wrong_dev].dev)
            wait(
                browser,
                lambda d: "valid" in d.find_element(By.ID, "validity").text,
                what="the dispatcher accepting the corrected spec",
            )
            browser.find_element(By.ID, "apply").click()

            # -- applied: running on both nodes, the YAML is the CLI's
            wait(browser, expected_conditions.url_to_be(f"{base}/traces/{TRACE}"), 60, "the trace page")
            state = browser.find_element(By.ID, "trace-state").text
            assert state.startswith("running: 2/2 nodes active"), state
            applied = cluster.api().GetTrace(api_pb2.GetTraceRequest(name=TRACE), timeout=10)
            assert applied.spec == spec
            yaml_text = browser.find_element(By.ID, "spec-yaml").text
            assert yaml_text.strip() == spec_to_yaml(spec).strip()
            assert load_spec(yaml_text) == spec
            browser.get(f"{base}/traces/")
            listed = browser.find_element(By.CSS_SELECTOR, f'#traces tr[data-trace="{TRACE}"]').text
            assert "running (2/2 nodes)" in listed, listed

            # -- the YAML round trip: the CLI applies what the page shows, unchanged
            spec_file = Path(cluster.workdir) / f"{TRACE}.yaml"
            spec_file.write_text(yaml_text + "\n")
            cluster.hoptrace("trace", "apply", "-f", str(spec_file))
            again = cluster.api().GetTrace(api_pb2.GetTraceRequest(name=TRACE), timeout=10)
            assert again.spec == spec and again.generation > applied.generation
            # ... and the YAML editor applies pasted YAML too.
            browser.get(f"{base}/traces/yaml?from={TRACE}")
            editor = browser.find_element(By.ID, "spec")
            assert editor.get_attribute("value").strip() == spec_to_yaml(spec).strip()
            browser.find_element(By.ID, "apply-yaml").click()
            wait(browser, expected_conditions.url_to_be(f"{base}/traces/{TRACE}"), 60, "apply from YAML")
            third = cluster.api().GetTrace(api_pb2.GetTraceRequest(name=TRACE), timeout=10)
            assert third.spec == spec and third.generation > again.generation

            # -- traffic, then the results page fills in by itself (it polls every second here)
            browser.get(f"{base}/traces/{TRACE}/results?since=15m")
            payloads = [os.urandom(64) for _ in range(PACKETS)]
            assert udp_transfer(topology, "c1", "c2", payloads, 4, PORT, gap_s=0.002) == payloads

            def every_segment_counted(driver: Any) -> list[tuple[str, int]] | bool:
                rows = driver.find_elements(By.CSS_SELECTOR, "#decomposition tbody tr")
                counts = [
                    (
                        r.find_element(By.CSS_SELECTOR, "td").text,
                        int(r.find_element(By.CSS_SELECTOR, "td.count").text),
                    )
                    for r in rows
                ]
                return (
                    counts if len(counts) == len(spec.hops) - 1 and all(c > 0 for _, c in counts) else False
                )

            counts = wait(browser, every_segment_counted, 60, "every segment with packets in the table")
            names = [hop.name for hop in spec.hops]
            expected = [f"{a} → {b}" for a, b in zip(names, names[1:], strict=False)]
            # a cell may carry an annotation after the segment (e.g. a same-node marker)
            assert len(counts) == len(expected)
            assert all(name.startswith(want) for (name, _), want in zip(counts, expected, strict=True)), (
                counts
            )
            chart = browser.execute_script(
                "const c = Chart.getChart('decomposition-chart');"
                "return {labels: c.data.labels, stacks: c.data.datasets.map(d => d.label),"
                " p50: c.data.datasets.map(d => d.data[0])}"
            )
            assert chart["labels"] == ["p50", "p90", "p99"]
            assert len(chart["stacks"]) == len(spec.hops) - 1
            assert sum(chart["p50"]) > 0, chart
            wait(
                browser,
                lambda d: d.execute_script(
                    "return Chart.getChart('timeseries-chart').data.datasets.some(s => s.data.length > 0)"
                ),
                30,
                "time series points",
            )
            wait(  # hop_counters arrive per second, after the first joined packets
                browser,
                lambda d: len(d.find_elements(By.CSS_SELECTOR, "#throughput tbody tr")) == len(spec.hops),
                30,
                "a throughput row per hop",
            )
            time.sleep(1.5)  # let the charts settle before the picture
            shot = screenshot(browser, "results")  # what a 1280x800 window shows first
            assert shot.stat().st_size > 10_000
            height = browser.execute_script("return document.documentElement.scrollHeight")
            browser.set_window_size(1280, height + 140)
            time.sleep(1)
            screenshot(browser, "results-full-page")
            browser.set_window_size(1280, 800)

            # -- the slowest packets as waterfalls: one bar per segment of the path, each after the last
            assert "most time: " in browser.find_element(By.ID, "most-time").text
            browser.find_element(By.ID, "slowest-packets").click()
            wait(browser, expected_conditions.url_contains("/packets"), what="the packets page")
            sections = browser.find_elements(By.CSS_SELECTOR, "section.waterfall")
            assert sections, browser.find_element(By.TAG_NAME, "main").text
            for section in sections:
                names = [n.text for n in section.find_elements(By.CSS_SELECTOR, ".wf-name")]
                assert names == expected, names  # every segment of the path, in path order
            slowest = int(sections[0].get_attribute("data-packet"))
            screenshot(browser, "waterfall")
            browser.get(f"{base}/traces/{TRACE}/packets?since=15m&packet=0x{slowest:08x}")
            one = browser.find_elements(By.CSS_SELECTOR, "section.waterfall")
            assert [int(s.get_attribute("data-packet")) for s in one] == [slowest]

            # -- the same table without JavaScript (server-rendered), for the session's cookie
            cookies = {c["name"]: c["value"] for c in browser.get_cookies()}
            status, _, body = fetch(base, f"/traces/{TRACE}/results?since=15m", cookies)
            assert status == 200
            table = body[
                body.index('id="decomposition"') : body.index("</table>", body.index('id="decomposition"'))
            ]
            server_counts = [int(c) for c in re.findall(r'<td class="num count">(\d+)</td>', table)]
            assert len(server_counts) == len(spec.hops) and all(c > 0 for c in server_counts)  # + end to end

            # -- a form post without the CSRF token is refused, and changes nothing
            status, _, _ = fetch(base, f"/traces/{TRACE}/delete", cookies, data={"confirm": "yes"})
            assert status == 400
            assert [
                t.spec.name for t in cluster.api().ListTraces(api_pb2.ListTracesRequest(), timeout=10).traces
            ] == [TRACE]

            # -- delete through the UI (with its confirmation)
            browser.get(f"{base}/traces/{TRACE}")
            browser.find_element(By.CSS_SELECTOR, "button.danger").click()
            wait(browser, expected_conditions.alert_is_present(), what="the delete confirmation").accept()
            wait(browser, expected_conditions.url_to_be(f"{base}/traces/"), 60, "back to the list")
            assert "deleted" in browser.find_element(By.CSS_SELECTOR, ".flash").text
            assert not cluster.api().ListTraces(api_pb2.ListTracesRequest(), timeout=10).traces
