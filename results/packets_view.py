"""The one view of `GetPackets`' answer: each packet's passage as the dict `hoptrace packets --json` prints
and as a text waterfall (`hoptrace packets`); the web draws the same segments as bars."""

from __future__ import annotations

from datetime import UTC
from typing import Any

from hoptrace.results.format import WITHIN_CLOCK_BOUND, format_ns
from hoptrace.v1 import api_pb2

# GetPackets: how many slowest packets by default and at most.
DEFAULT_SLOWEST, MAX_SLOWEST = 10, 50


def packets_from_proto(packets: api_pb2.PacketList) -> list[dict[str, Any]]:
    """`hoptrace packets --json`: each packet with its segments (raw numbers, offsets from its first hop), and
    its captures where the answer has them."""
    return [
        {
            "packet_id": p.packet_id,
            "at": p.at.ToDatetime(tzinfo=UTC).isoformat(timespec="microseconds"),
            "end_to_end_ns": p.end_to_end_ns,
            "segments": [
                {
                    "from": getattr(s, "from"),
                    "to": s.to,
                    "from_node": s.from_node,
                    "to_node": s.to_node,
                    "offset_ns": s.offset_ns,
                    "latency_ns": s.latency_ns,
                    "below_clock_bound": s.below_clock_bound,
                }
                for s in p.segments
            ],
            **({"captures": [capture_from_proto(c) for c in p.captures]} if p.captures else {}),
        }
        for p in packets.packets
    ]


def capture_from_proto(capture: api_pb2.PacketCapture) -> dict[str, Any]:
    """One hop's capture of a packet (`GetPackets` with `captured`): its bytes in hex."""
    return {
        "hop": capture.hop,
        "node": capture.node,
        "at_ns": capture.at.ToNanoseconds(),
        "wire_len": capture.wire_len,
        "link_type": capture.link_type,
        "data": capture.data.hex(),
    }


def render_packets_text(packets: list[dict[str, Any]], width: int = 40) -> str:
    """Each packet as a text waterfall: per segment its start, latency and a bar of `width` columns placed
    on the packet's whole passage (a segment within its clock bound reads so, never as a negative number)."""
    lines: list[str] = []
    for p in packets:
        ends = [max(s["offset_ns"], 0) + max(s["latency_ns"], 0) for s in p["segments"]]
        span = max([p["end_to_end_ns"], *ends, 1])
        e2e = format_ns(p["end_to_end_ns"]) if p["end_to_end_ns"] else "incomplete"
        lines.append(f"packet 0x{p['packet_id']:08x}  {p['at']}  end to end {e2e}")
        rows = []
        for s in p["segments"]:
            start = min(round(width * max(s["offset_ns"], 0) / span), width - 1)
            length = max(1, min(round(width * max(s["latency_ns"], 0) / span), width - start))
            nodes = s["from_node"] if s["from_node"] == s["to_node"] else f"{s['from_node']} > {s['to_node']}"
            latency = WITHIN_CLOCK_BOUND if s["below_clock_bound"] else format_ns(s["latency_ns"])
            bar = " " * start + "#" * length + " " * (width - start - length)
            rows.append(
                [f"{s['from']} > {s['to']}", nodes, f"+{format_ns(s['offset_ns'])}", latency, f"|{bar}|"]
            )
        if rows:
            widths = [max(len(r[i]) for r in rows) for i in range(4)]
            for r in rows:
                cells = [
                    r[0].ljust(widths[0]),
                    r[1].ljust(widths[1]),
                    r[2].rjust(widths[2]),
                    r[3].rjust(widths[3]),
                ]
                lines.append("  " + "  ".join([*cells, r[4]]))
        lines.append("")
    return "\n".join(lines)
