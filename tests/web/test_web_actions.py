"""Hop actions and event probes on the results page, in a real browser (headless Chromium), on the whole
system: two emulated hosts, the real dispatcher, collector, agents and InfluxDB.

The trace counts, by CPU, the packets at host-b's wire, histograms their length there and records each
one's length (record: [len]; the wire frame: 64-byte payload + 92 bytes of headers + the 4-byte ID the first
hop appended); an event probe counts host-a's transmits of one odd frame size (net:net_dev_xmit where
len == 1329 and name == "wire0"), sent to a port the trace's filter does not match so no hop writes an ID
into them (the frame is the payload + 92 bytes of Ethernet, IPv4, UDP, VXLAN and the inner headers; see
tests/system/test_events_end_to_end.py). The page must show the counts sent, the histogram's one bucket
holding them all, the recorded length's packets = sent and min = max = the frame, and the same numbers as
`hoptrace report --json`; without scripts the server renders the same. Screenshot: test-artifacts/web/
results-actions.png (the one in docs/screenshots/).
"""

from __future__ import annotations

import json
import os
import re
import time
from typing import Any

import pytest
from selenium.webdriver.common.by import By
from system_helpers import running_cluster
from test_web_browser import fetch, wait
from test_web_pathgraph import log_in
from web_helpers import live_server, screenshot, web_config

from hoptrace import kernel_abi
from hoptrace.lab.processes import udp_transfer
from hoptrace.lab.reference import vxlan_path_spec
from hoptrace.spec import spec_from_data
from hoptrace.v1 import trace_pb2
from hoptrace.web import create_app

pytestmark = pytest.mark.kernel  # running_cluster's agents load BPF here

TRACE = "web-actions"
PORT = 11111
SENT = 120  # traced datagrams (64-byte payload) through the hops
TRACED_PAYLOAD = 64
TRACED_FRAME = TRACED_PAYLOAD + 92 + kernel_abi.UDP_ID_LEN  # at host-b's wire, ID included
EVENT_SENT = 70  # untraced datagrams whose wire frame the event probe counts
# Odd, so the wire frame (1329 bytes) is unlike anything else on this machine, the 1093 of
# tests/system/test_events_end_to_end.py included (it may run meanwhile: tracepoints see every netns).
PAYLOAD = 1237
WIRE_FRAME = PAYLOAD + 92
OTHER_PORT = 5555
HOP = "b-wire-in"
LATENCY_HOP = "a-veth-in"  # the latency from host-a's previous hop (c1's eth0 egress)
EVENT = "wire-frames"


def actions_spec(topology: Any) -> trace_pb2.TraceSpec:
    """The c1 -> c2 VXLAN trace with `count: {by: cpu}`, `histogram: len` and `record: [len]` at host-b's
    wire, `histogram: latency` at host-a's bridge port, and the event (count by cpu, histogram of len)."""
    spec = vxlan_path_spec(topology, TRACE, port=PORT)
    hop = next(h for h in spec.hops if h.name == HOP)
    hop.actions.extend(
        [
            trace_pb2.ActionSpec(kind="timestamp"),
            trace_pb2.ActionSpec(kind="count", by="cpu"),
            trace_pb2.ActionSpec(kind="histogram", field="len"),
            trace_pb2.ActionSpec(kind="record", fields=["len"]),
        ]
    )
    latency_hop = next(h for h in spec.hops if h.name == LATENCY_HOP)
    latency_hop.actions.extend(
        [trace_pb2.ActionSpec(kind="timestamp"), trace_pb2.ActionSpec(kind="histogram", field="latency")]
    )
    event = {
        "name": EVENT,
        "node": "host-a",
        "tracepoint": "net:net_dev_xmit",
        "where": f'len == {WIRE_FRAME} and name == "wire0"',
        "actions": [{"count": {"by": "cpu"}}, {"histogram": "len"}],
    }
    spec.events.extend(spec_from_data({"name": TRACE, "hops": [], "events": [event]}).events)
    return spec


def page_numbers(browser: Any) -> dict[str, Any]:
    """What the page draws (read from the DOM the user sees): the hop's count total, by-cpu rows and
    histogram of len and recorded rows; the latency hop's histogram; the event's count, by-cpu rows and
    histogram."""
    return browser.execute_script(
        """
        const rows = (table) => table ? Object.fromEntries([...table.querySelectorAll('tbody tr')].map(
          (r) => [r.dataset.key, Number(r.querySelector('td.count').textContent)])) : {};
        const histogram = (section, field) => {
          const table = section && section.querySelector(`table.histogram[data-field="${field}"]`);
          if (!table) return {total: -1, buckets: []};
          return {total: Number(table.querySelector('.total').textContent),
                  buckets: [...table.querySelectorAll('tr.bucket')].map((b) => ({
                    le: Number(b.dataset.le), label: b.querySelector('td.bound').textContent,
                    count: Number(b.querySelector('td.count').textContent)}))};
        };
        const cell = (row, c) => row.querySelector(`td.${c}`).textContent;
        const recorded = (section) => section ? Object.fromEntries([...section.querySelectorAll(
          'table.recorded tbody tr')].map((r) => [`${r.dataset.field}@${r.dataset.node}`, Object.fromEntries(
          ['packets', 'min', 'mean', 'max', 'last'].map((c) => [c, Number(cell(r, c))])
          .concat([['unit', cell(r, 'unit')]]))])) : {};
        const hop = document.querySelector(`#actions section.hop-actions[data-hop="${arguments[0]}"]`);
        const latency = document.querySelector(`#actions section.hop-actions[data-hop="${arguments[1]}"]`);
        const event = document.querySelector(`#actions section.event[data-event="${arguments[2]}"]`);
        return {
          hop_total: hop ? Number(hop.querySelector('.counts .count-total').textContent) : -1,
          hop_by_cpu: hop ? rows(hop.querySelector('table.count-by[data-by="cpu"]')) : {},
          len: histogram(hop, 'len'),
          recorded: recorded(hop),
          latency: histogram(latency, 'latency'),
          event_total: event ? Number(event.querySelector('.count-total').textContent) : -1,
          event_by_cpu: event ? rows(event.querySelector('table.count-by[data-by="cpu"]')) : {},
          event_len: histogram(event, 'len'),
        };""",
        HOP,
        LATENCY_HOP,
        EVENT,
    )


def test_results_page_shows_hop_counts_histograms_and_events(topology, influxd, browser):
    spec = actions_spec(topology)
    with running_cluster(topology, influxd.url) as cluster:
        cluster.apply(spec)
        app = create_app(
            web_config(DISPATCHER=cluster.dispatcher_addr, DISPATCHER_CHANNEL_FACTORY=cluster.channel)
        )
        with live_server(app) as base:
            log_in(browser, base)
            browser.get(f"{base}/traces/{TRACE}/results?since=15m")
            # Before any traffic the sections say there is nothing yet, rather than drawing zeros.
            assert browser.find_element(By.ID, "no-hop-actions").text.startswith("No hop counts")
            traced = [os.urandom(64) for _ in range(SENT)]
            assert udp_transfer(topology, "c1", "c2", traced, 4, PORT, gap_s=0.002) == traced
            untraced = [os.urandom(PAYLOAD) for _ in range(EVENT_SENT)]
            assert udp_transfer(topology, "c1", "c2", untraced, 4, OTHER_PORT, gap_s=0.002) == untraced

            # Counts arrive with the agents' counters (every second); the page polls every second here.
            def all_counted(driver: Any) -> dict[str, Any] | bool:
                seen = page_numbers(driver)
                done = (
                    seen["hop_total"] >= SENT
                    and seen["len"]["total"] >= SENT
                    and seen["recorded"].get("len@host-b", {}).get("packets", 0) >= SENT
                    and seen["latency"]["total"] >= SENT
                    and seen["event_total"] >= EVENT_SENT
                    and seen["event_len"]["total"] >= EVENT_SENT
                )
                return seen if done else False

            wait(
                browser,
                all_counted,
                60,
                "the hops' counts, histograms and recorded values and the event's count and histogram",
            )
            report = json.loads(cluster.hoptrace("report", TRACE, "--since", "15m", "--json").stdout)
            # The page after the report was read (a poll later): the same numbers as the report API.
            time.sleep(1.5)
            seen = page_numbers(browser)

            assert seen["hop_total"] == SENT, seen
            assert sum(seen["hop_by_cpu"].values()) == SENT, seen
            cpus = os.cpu_count() or 1
            assert all(0 <= int(cpu) < cpus for cpu in seen["hop_by_cpu"]), seen
            # Every datagram the same size at the wire: one bucket, all of them, its bounds readable.
            (bucket,) = seen["len"]["buckets"]
            assert bucket["count"] == SENT and seen["len"]["total"] == SENT, seen
            assert 128 <= bucket["le"] <= 255, bucket
            assert bucket["label"] == f"{(bucket['le'] + 1) // 2}–{bucket['le']}", bucket
            # Recorded length: every traced datagram, each the same frame, in bytes.
            assert seen["recorded"] == {
                "len@host-b": {
                    "packets": SENT,
                    "min": TRACED_FRAME,
                    "mean": TRACED_FRAME,
                    "max": TRACED_FRAME,
                    "last": TRACED_FRAME,
                    "unit": "bytes",
                }
            }, seen["recorded"]
            # Latency: every traced packet, bounds as durations (ns, us or ms).
            assert seen["latency"]["total"] == SENT == sum(b["count"] for b in seen["latency"]["buckets"]), (
                seen
            )
            assert all(
                re.fullmatch(r"[\d.]+(ns|us|ms)(–[\d.]+(ns|us|ms))?", b["label"])
                for b in seen["latency"]["buckets"]
            ), seen
            assert seen["event_total"] == EVENT_SENT, seen
            assert sum(seen["event_by_cpu"].values()) == EVENT_SENT, seen
            # One frame size: 1329 bytes are in [1024, 2047].
            assert seen["event_len"] == {
                "total": EVENT_SENT,
                "buckets": [{"le": 2047, "label": "1024–2047", "count": EVENT_SENT}],
            }, seen

            hops = {h["hop"]: h for h in report["hops"]}
            assert seen["hop_by_cpu"] == {str(c["key"]): c["count"] for c in hops[HOP]["counts"]}, (
                seen,
                hops[HOP],
            )
            for name, field in ((HOP, "len"), (LATENCY_HOP, "latency")):
                (histogram,) = hops[name]["histograms"]
                assert histogram["field"] == field and histogram["total"] == seen[field]["total"], histogram
                assert [(b["le"], b["count"]) for b in seen[field]["buckets"]] == [
                    (b["le"], b["count"]) for b in histogram["buckets"]
                ], (seen, histogram)
            (recorded,) = hops[HOP]["recorded"]
            assert (recorded["field"], recorded["node"]) == ("len", "host-b"), recorded
            assert {k: recorded[k] for k in ("count", "min", "max", "last")} == {
                "count": seen["recorded"]["len@host-b"]["packets"],
                **{k: seen["recorded"]["len@host-b"][k] for k in ("min", "max", "last")},
            }, (recorded, seen["recorded"])
            assert abs(recorded["mean"] - seen["recorded"]["len@host-b"]["mean"]) <= 0.05, recorded
            (event,) = [e for e in report["events"] if e["name"] == EVENT]
            assert (event["node"], event["count"]) == ("host-a", seen["event_total"]), event
            assert seen["event_by_cpu"] == event["by"], (seen, event)
            assert event["histogram"] == [{"le": 2047, "count": EVENT_SENT}], event

            section = browser.find_element(By.ID, "actions")
            browser.execute_script("arguments[0].scrollIntoView()", section)
            time.sleep(0.5)
            shot = screenshot(browser, "results-actions")
            assert shot.stat().st_size > 10_000

            # Without scripts: the server renders the same sections with the same numbers.
            cookies = {c["name"]: c["value"] for c in browser.get_cookies()}
            status, _, body = fetch(base, f"/traces/{TRACE}/results?since=15m", cookies)
            assert status == 200
            hop_html = body[
                body.index(f'data-hop="{HOP}"') : body.index("</section>", body.index(f'data-hop="{HOP}"'))
            ]
            assert f'<strong class="count-total">{SENT}</strong>' in hop_html, hop_html
            assert re.search(
                rf'<tr class="bucket" data-le="{bucket["le"]}">.*?<td class="num count">{SENT}</td>', hop_html
            )
            assert re.search(
                rf'<tr data-field="len" data-node="host-b">.*?<td class="num packets">{SENT}</td>'
                rf'<td class="num min">{TRACED_FRAME}</td>.*?<td class="num max">{TRACED_FRAME}</td>',
                hop_html,
            ), hop_html
            event_html = body[body.index(f'data-event="{EVENT}"') :]
            assert f'<strong class="count-total">{EVENT_SENT}</strong>' in event_html[:400], event_html[:400]
