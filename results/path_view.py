"""The one view of a path discovery's result (`Hoptrace.Discover`): each discovered path and each edge of the
path graph as the dicts `hoptrace discover --json` prints and the web's form lists, and the text
`hoptrace discover` prints."""

from __future__ import annotations

from typing import Any

from hoptrace.results.format import format_ns
from hoptrace.v1 import api_pb2


def path_data(path: api_pb2.DiscoveredPath) -> dict[str, Any]:
    """One path: its packets, share and hops, each with its median time after the path's first crossing."""
    return {
        "packets": path.packets,
        "share": round(path.share, 4),
        "hops": [
            {
                "name": hop.name,
                "node": hop.node,
                "netns": hop.netns,
                "dev": hop.dev,
                "at": hop.at,
                "since_first_ns": since_first_ns,
            }
            for hop, since_first_ns in zip(path.hops, path.since_first_ns, strict=True)
        ],
    }


def segment_data(segment: api_pb2.DiscoveredSegment) -> dict[str, Any]:
    """One edge of the path graph: its hops' names, packets, share, median and p99 step time, and whether
    the flow's addresses were translated in it."""
    return {
        "from": segment.from_hop.name,
        "to": segment.to_hop.name,
        "packets": segment.packets,
        "share": round(segment.share, 4),
        "median_ns": segment.median_ns,
        "p99_ns": segment.p99_ns,
        "translated": segment.translated,
    }


def paths_text(result: api_pb2.DiscoverResult) -> str:
    """Every path as text: share, then one line per crossing; then each segment's median and p99."""
    lines = []
    for index, path in enumerate(result.paths, 1):
        lines.append(f"path {index} of {len(result.paths)}: {path.packets} packets ({path.share:.0%})")
        for hop, since_first_ns in zip(path.hops, path.since_first_ns, strict=True):
            where = f"{hop.node} {hop.netns or '(host)'} {hop.dev}"
            lines.append(f"  {hop.name:<24} {where:<40} +{since_first_ns / 1000:.1f}us")
    if result.segments:
        lines.append("segments (median / p99 of each step, share of packets):")
        for segment in result.segments:
            step = f"{segment.from_hop.name} -> {segment.to_hop.name}"
            times = f"{format_ns(segment.median_ns)} / {format_ns(segment.p99_ns)}"
            translated = "  addresses translated (followed by the packets' IDs)" if segment.translated else ""
            lines.append(f"  {step:<40} {times:<20} {segment.share:.0%}{translated}")
    return "\n".join(lines)
