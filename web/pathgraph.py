"""The path graph: hosts as boxes, namespaces inside them, devices as vertices in path order, each segment's
latency on its edge; parallel paths (ECMP) on their own rows, each with its share.

Drawn as plain SVG on the server (templates/_pathgraph.html) rather than with an npm graph library: a path is
a chain with at most a few parallel branches, so the layout is a grid (column = position along the path,
row = which path first needs the place), and a server-drawn graph needs no script, shows the same numbers
the API gave (formatted by the report's own `format_ns`), and fits the page's Content-Security-Policy
unchanged. Two sources feed it: a discovery (`from_discovery`, every path and the measured step times) and
an applied trace (`from_trace`, its hops and the report's segment p50/p99).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from flask import render_template

from hoptrace.results.format import format_ns
from hoptrace.v1 import api_pb2, trace_pb2

# Geometry (px): a column per position along the path, a row per parallel branch. A graph's vertices and
# columns are widened to its longest label (`_widths`): every name is read whole, none runs into another.
COLUMN_W = 116  # the least: VERTEX_W and the gap an edge's label stands in
VERTEX_W = 70
VERTEX_H = 40
ROW_H = 96
MARGIN = 12
HOST_LABEL_H = 22
NETNS_LABEL_H = 18
EDGE_LABEL_H = 30
HOP_NAME_H = 14  # the hop's name under its vertex
LABEL_PAD = 10  # clear space beside a label
# Average glyph width per px of font size (the page's system-ui sans serif; bold a little wider): what a
# label's width is estimated with. tests/web/test_web_pathgraph_layout.py holds Chromium's own widths to it.
GLYPH_EM, BOLD_GLYPH_EM = 0.62, 0.68
# Edge colours of the paths (most common first); an edge every path takes is drawn in the first.
PALETTE = ("#2557d6", "#e8710a", "#11733b", "#7e3fb8", "#00838f", "#c2185b")


def place_id(hop: trace_pb2.HopSpec) -> str:
    """A vertex's identity: where the hop is (node, netns, device, attach point), not its generated name."""
    return "|".join((hop.node, hop.netns, hop.dev, hop.at))


def netns_label(netns: str) -> str:
    """A namespace as a reader knows it: the last part of its path (``/run/netns/c1`` -> ``c1``)."""
    return netns.rstrip("/").rsplit("/", 1)[-1]


def at_label(at: str) -> str:
    """The attach point, short: ``tc-ingress`` -> ``in``, ``tc-egress`` -> ``out``, a tracepoint by its event
    (``tracepoint:net:netif_receive_skb`` -> ``tp netif_receive_skb``), others as they are."""
    if at.startswith("tracepoint:"):
        return "tp " + at.rsplit(":", 1)[-1]
    return {"tc-ingress": "in", "tc-egress": "out"}.get(at, at)


def text_width(text: str, size_px: float, bold: bool = False) -> float:
    """The estimated width of `text` at `size_px` in the graph's font."""
    return len(text) * size_px * (BOLD_GLYPH_EM if bold else GLYPH_EM)


@dataclass
class Vertex:
    """One device crossing (a hop) placed on the grid."""

    id: str
    name: str
    node: str
    netns: str
    dev: str
    at: str
    column: int = 0
    row: int = 0
    column_w: int = COLUMN_W  # the graph's (_lay_out)
    vertex_w: int = VERTEX_W

    @property
    def at_short(self) -> str:
        """The attach point as the vertex shows it (at_label)."""
        return at_label(self.at)

    @property
    def x(self) -> int:
        return MARGIN + self.column * self.column_w + (self.column_w - self.vertex_w) // 2

    @property
    def y(self) -> int:
        return MARGIN + HOST_LABEL_H + NETNS_LABEL_H + EDGE_LABEL_H + self.row * ROW_H


@dataclass
class Edge:
    """One segment: from a vertex to the next, with its latency as text (median, p99) and the raw ns."""

    source: Vertex
    target: Vertex
    median_ns: int | None
    p99_ns: int | None
    median_text: str
    p99_text: str
    share: float = 1.0
    packets: int = 0
    color: str = PALETTE[0]

    @property
    def geometry(self) -> dict[str, float]:
        """Start and end (the vertices' facing sides), the control points of a curve between rows, and
        where the label goes."""
        x1, y1 = self.source.x + self.source.vertex_w, self.source.y + VERTEX_H / 2
        x2, y2 = self.target.x, self.target.y + VERTEX_H / 2
        if x2 <= x1:  # back to an earlier column (a packet that returns): go round underneath
            x1, x2 = self.source.x + self.source.vertex_w / 2, self.target.x + self.target.vertex_w / 2
            y1, y2 = self.source.y + VERTEX_H, self.target.y + VERTEX_H
        mid_x = (x1 + x2) / 2
        # The label (median, p99 under it) stands above the vertices' row, where it may be a column wide; an
        # edge between rows labels at the lower row: the upper row's own edge is labelled in the same gap.
        label_y = max(self.source.y, self.target.y) - EDGE_LABEL_H + 11
        return {"x1": x1, "y1": y1, "x2": x2, "y2": y2, "cx": mid_x, "label_x": mid_x, "label_y": label_y}


@dataclass
class Box:
    """A host or a namespace: a labelled rectangle round its vertices."""

    label: str
    node: str
    netns: str
    x: int
    y: int
    w: int
    h: int


@dataclass
class PathGraph:
    """A laid-out graph, ready for templates/_pathgraph.html."""

    vertices: list[Vertex]
    edges: list[Edge]
    paths: list[dict[str, Any]] = field(default_factory=list)
    hosts: list[Box] = field(default_factory=list)
    namespaces: list[Box] = field(default_factory=list)
    width: int = 0
    height: int = 0
    vertex_w: int = VERTEX_W
    column_w: int = COLUMN_W

    def to_data(self) -> dict[str, Any]:
        """The graph as JSON (what the page's script and the tests read besides the SVG)."""
        return {
            "vertices": [
                {"id": v.id, "name": v.name, "node": v.node, "netns": v.netns, "dev": v.dev, "at": v.at}
                for v in self.vertices
            ],
            "edges": [
                {
                    "from": e.source.id,
                    "to": e.target.id,
                    "median_ns": e.median_ns,
                    "p99_ns": e.p99_ns,
                    "median": e.median_text,
                    "p99": e.p99_text,
                    "share": e.share,
                    "packets": e.packets,
                }
                for e in self.edges
            ],  # fmt: skip
            "paths": self.paths,
        }


def _widths(graph: PathGraph) -> tuple[int, int]:
    """The graph's vertex and column widths: a vertex holds its device and attach point (12 px bold, 11 px)
    and its namespace's label (11 px, in a box 8 px wider on each side); a column also holds the hop's
    name under the vertex and an edge's latency labels above the gap after it (10.5 px; 11 estimated),
    each with clear space."""
    vertex = max(
        [VERTEX_W]
        + [text_width(v.dev, 12, bold=True) + LABEL_PAD for v in graph.vertices]
        + [text_width(v.at_short, 11) + LABEL_PAD for v in graph.vertices]
        + [text_width(f"netns {netns_label(v.netns)}", 11) + 12 - 16 for v in graph.vertices if v.netns]
    )
    names = [text_width(v.name, 11) + LABEL_PAD for v in graph.vertices]
    latencies = [
        text_width(t, 11) + LABEL_PAD for e in graph.edges for t in (e.median_text, f"p99 {e.p99_text}")
    ]
    column = max([COLUMN_W, vertex + COLUMN_W - VERTEX_W, *names, *latencies])
    return int(vertex + 0.5), int(column + 0.5)


def _lay_out(graph: PathGraph, rows_of_paths: Sequence[Sequence[str]]) -> PathGraph:
    """Columns, rows, host and namespace boxes, and the drawing's size."""
    graph.vertex_w, graph.column_w = _widths(graph)
    for vertex in graph.vertices:
        vertex.vertex_w, vertex.column_w = graph.vertex_w, graph.column_w
    by_id = {v.id: v for v in graph.vertices}
    taken: set[tuple[int, int]] = set()
    placed: set[str] = set()
    for ids in rows_of_paths:
        for column, vertex_id in enumerate(ids):
            if vertex_id in placed:
                continue
            vertex = by_id[vertex_id]
            row = 0
            while (column, row) in taken:
                row += 1
            vertex.column, vertex.row = column, row
            taken.add((column, row))
            placed.add(vertex_id)
    rows = 1 + max((v.row for v in graph.vertices), default=0)
    columns = 1 + max((v.column for v in graph.vertices), default=0)
    top = MARGIN
    bottom = (
        MARGIN + HOST_LABEL_H + NETNS_LABEL_H + EDGE_LABEL_H + (rows - 1) * ROW_H + VERTEX_H + HOP_NAME_H + 14
    )
    for node in dict.fromkeys(v.node for v in graph.vertices):
        mine = [v for v in graph.vertices if v.node == node]
        left = MARGIN + min(v.column for v in mine) * graph.column_w + 3
        right = MARGIN + (max(v.column for v in mine) + 1) * graph.column_w - 3
        graph.hosts.append(Box(node, node, "", left, top, right - left, bottom - top))
        for netns in dict.fromkeys(v.netns for v in mine if v.netns):
            inside = [v for v in mine if v.netns == netns]
            left = min(v.x for v in inside) - 8
            right = max(v.x for v in inside) + graph.vertex_w + 8
            ns_top = top + HOST_LABEL_H
            graph.namespaces.append(
                Box(netns_label(netns), node, netns, left, ns_top, right - left, bottom - ns_top - 6)
            )
    graph.width = 2 * MARGIN + columns * graph.column_w
    graph.height = bottom + MARGIN
    return graph


def _vertex(hop: trace_pb2.HopSpec) -> Vertex:
    return Vertex(place_id(hop), hop.name, hop.node, hop.netns, hop.dev, hop.at)


def _hop_data(hop: trace_pb2.HopSpec) -> dict[str, str]:
    return {"name": hop.name, "node": hop.node, "netns": hop.netns, "dev": hop.dev, "at": hop.at}


def _path_data(
    number: int, packets: int, share: float, ids: list[str], hops: Sequence[trace_pb2.HopSpec]
) -> dict[str, Any]:
    return {
        "number": number,
        "packets": packets,
        "share": share,
        "vertices": ids,
        "hops": [_hop_data(hop) for hop in hops],
        "color": PALETTE[(number - 1) % len(PALETTE)],
    }


def from_discovery(result: api_pb2.DiscoverResult) -> PathGraph:
    """The graph of a discovery: every path's crossings (shared ones once), the measured step times of
    `result.segments` on the edges, each path with its packets and share."""
    vertices: dict[str, Vertex] = {}
    paths: list[dict[str, Any]] = []
    rows: list[list[str]] = []
    for number, path in enumerate(result.paths, start=1):
        ids = []
        for hop in path.hops:
            vertices.setdefault(place_id(hop), _vertex(hop))
            ids.append(place_id(hop))
        rows.append(ids)
        paths.append(_path_data(number, path.packets, path.share, ids, path.hops))
    edges = []
    for segment in result.segments:
        source, target = vertices[place_id(segment.from_hop)], vertices[place_id(segment.to_hop)]
        step = (source.id, target.id)
        first_path = next((i for i, ids in enumerate(rows) if step in zip(ids, ids[1:], strict=False)), 0)
        edges.append(
            Edge(
                source,
                target,
                segment.median_ns,
                segment.p99_ns,
                format_ns(segment.median_ns),
                format_ns(segment.p99_ns),
                segment.share,
                segment.packets,
                PALETTE[first_path % len(PALETTE)],
            )
        )
    return _lay_out(PathGraph(list(vertices.values()), edges, paths), rows)


def from_trace(spec: trace_pb2.TraceSpec, segments: Sequence[Mapping[str, Any]]) -> PathGraph:
    """The graph of an applied trace: its hops in order, each segment's p50/p99 from the report (as the
    decomposition table shows them, "≤ ±170ns" within the clock bound); a segment without packets yet
    says so."""
    vertices = [_vertex(hop) for hop in spec.hops]
    ids = [v.id for v in vertices]
    if len(set(ids)) != len(ids):  # two hops at one place (e.g. two tracepoints): their names tell apart
        for vertex in vertices:
            vertex.id = vertex.name
        ids = [v.id for v in vertices]
    measured = {(s["from"], s["to"]): s for s in segments}
    edges = []
    for source, target in zip(vertices, vertices[1:], strict=False):
        segment = measured.get((source.name, target.name))
        if segment and segment.get("count"):
            display = segment.get("display") or {}
            edges.append(
                Edge(source, target, segment["p50_ns"], segment["p99_ns"],
                     display.get("p50_ns", format_ns(segment["p50_ns"])),
                     display.get("p99_ns", format_ns(segment["p99_ns"])), packets=segment["count"])
            )  # fmt: skip
        else:
            edges.append(Edge(source, target, None, None, "no packets", "", packets=0))
    paths = [_path_data(1, 0, 1.0, ids, spec.hops)]
    return _lay_out(PathGraph(vertices, edges, paths), [ids])


def render(graph: PathGraph, *, applicable: bool = False) -> str:
    """The graph's SVG and its paths' legend as HTML (`applicable`: each path gets an "apply as trace"
    button, on the new-trace page)."""
    return render_template(
        "_pathgraph.html", graph=graph, applicable=applicable, vertex_w=graph.vertex_w, vertex_h=VERTEX_H
    )
