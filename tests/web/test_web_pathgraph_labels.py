"""The path graph's labels read whole in Chromium: every device, attach point, hop name, namespace and edge
latency of the demo's trace (tracepoint hops, a container namespace at each end) lies inside the drawing, a
vertex's text inside its box, a namespace's label inside its box, and no two labels overlap. A tracepoint
hop's attach point ran 60 px out of its 70 px box into the next one, "netns htdemo-c2" out of its box, and the
hop names were nowhere in the graph.

The graph as the server draws it (web/pathgraph.py, the page's stylesheet) in headless Chromium; the boxes are
Chromium's own (getBBox)."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from web_helpers import screenshot, web_config

from hoptrace.lab.reference import vxlan_path_spec
from hoptrace.lab.topology import TwoHostTopology
from hoptrace.web import create_app, pathgraph

STYLE = Path(__file__).resolve().parents[2] / "web" / "static" / "app.css"
BOXES = """
const box = (e) => { const b = e.getBBox(); return [b.x, b.y, b.x + b.width, b.y + b.height]; };
const svg = document.querySelector('svg.pathgraph');
return {
  drawing: [0, 0, svg.width.baseVal.value, svg.height.baseVal.value],
  labels: [...svg.querySelectorAll('text')].map(t => [t.getAttribute('class'), t.textContent, box(t)]),
  vertices: [...svg.querySelectorAll('g.vertex')].map(g => [box(g.querySelector('rect')),
    [...g.querySelectorAll('text.vertex-dev, text.vertex-at')].map(box)]),
  namespaces: [...svg.querySelectorAll('g.netns')].map(g => [box(g.querySelector('rect')),
    box(g.querySelector('text'))]),
};
"""


def inside(inner: list[float], outer: list[float]) -> bool:
    return outer[0] <= inner[0] and outer[1] <= inner[1] and inner[2] <= outer[2] and inner[3] <= outer[3]


def overlap(a: list[float], b: list[float]) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def test_every_label_of_the_demo_trace_reads_whole(tmp_path: Path, browser: Any) -> None:
    spec = vxlan_path_spec(TwoHostTopology("htdemo"), "demo-udp")
    names = [hop.name for hop in spec.hops]
    segments = [
        {"from": a, "to": b, "count": 100, "p50_ns": 1500, "p99_ns": 27_000, "display": {}}
        for a, b in zip(names, names[1:], strict=False)
    ]
    segments[3]["display"] = {"p50_ns": "≤ ±2.4us", "p99_ns": "12.3us"}  # the wire: within its clock bound
    with create_app(web_config(DISPATCHER="127.0.0.1:9")).app_context():
        graph = pathgraph.render(pathgraph.from_trace(spec, segments))
    page = tmp_path / "graph.html"
    page.write_text(f"<!doctype html><meta charset=utf-8><style>{STYLE.read_text()}</style><body>{graph}")
    browser.get(page.as_uri())
    found = browser.execute_script(BOXES)

    texts = [text for _, text, _ in found["labels"]]
    for expected in (*names, "tp netif_receive_skb", "tp net_dev_xmit", "netns htdemo-c1", "netns htdemo-c2"):
        assert expected in texts, (expected, texts)
    for kind, text, box in found["labels"]:
        assert inside(box, found["drawing"]), (kind, text, box, found["drawing"])
    for rect, lines in found["vertices"]:
        assert all(inside(line, rect) for line in lines), (rect, lines)
    for rect, label in found["namespaces"]:
        assert inside(label, rect), (rect, label)
    clashes = [(a[:2], b[:2]) for a, b in itertools.combinations(found["labels"], 2) if overlap(a[2], b[2])]
    assert clashes == [], clashes
    screenshot(browser, "path-graph-labels")
