"""Packets of a trace as a waterfall (Jaeger-style): each segment of one packet's passage as a bar, placed
where the packet entered it and as long as it took there. The slowest packets end to end over a range, or
one packet by its ID, through the dispatcher's `GetPackets` (the web reads no InfluxDB itself).

Rendered on the server (bars are positioned with inline widths in percent of the packet's whole passage):
the page needs no JavaScript.
"""

from __future__ import annotations

import io
import re
from typing import Any

from flask import Blueprint, abort, render_template, request, send_file

from hoptrace.common.client import QUERY_TIMEOUT_S, ApiError
from hoptrace.results.format import WITHIN_CLOCK_BOUND, format_ns
from hoptrace.results.packets_view import MAX_SLOWEST, packets_from_proto
from hoptrace.results.pcap import captured_request, write_pcapng
from hoptrace.web.dispatcher import get_client, http_status
from hoptrace.web.results import (
    SINCE_CHOICES,
    bounds_ns,
    range_text,
    requested_bounds,
    requested_since,
    since_seconds,
)

bp = Blueprint("packets", __name__)

_PACKET_ID = re.compile(r"^(0x[0-9a-fA-F]{1,8}|[0-9]{1,10})$")
MIN_BAR_PERCENT = 0.4  # a bar of a few ns on a passage of ms stays visible


def parse_packet_id(text: str) -> int:
    """A packet ID as shown (0x07000123) or in decimal; 400 when it is not one (IDs are 32-bit, never 0)."""
    text = text.strip()
    value = int(text, 0) if _PACKET_ID.match(text) else 0
    if not 0 < value < 1 << 32:
        abort(400, description=f"bad packet ID {text!r}: use e.g. 0x07000123 or 117440803")
    return value


def packet_view(packet: dict[str, Any]) -> dict[str, Any]:
    """One packet of `packets_from_proto` (what `hoptrace packets --json` prints) as a waterfall: its
    segments with their bars' position and width in percent of the span."""
    ends = [max(s["offset_ns"], 0) + max(s["latency_ns"], 0) for s in packet["segments"]]
    span = max([packet["end_to_end_ns"], *ends, 1])
    rows = []
    for s in packet["segments"]:
        left = 100 * max(s["offset_ns"], 0) / span
        width = max(100 * max(s["latency_ns"], 0) / span, MIN_BAR_PERCENT)
        cross_node = s["from_node"] != s["to_node"]
        rows.append(
            {
                **s,
                "name": f"{s['from']} → {s['to']}",
                "nodes": f"{s['from_node']} → {s['to_node']}" if cross_node else s["from_node"],
                "cross_node": cross_node,
                "left": round(min(left, 100 - MIN_BAR_PERCENT), 3),
                "width": round(min(width, 100 - min(left, 100 - MIN_BAR_PERCENT)), 3),
                "offset": format_ns(s["offset_ns"]),
                "latency": WITHIN_CLOCK_BOUND if s["below_clock_bound"] else format_ns(s["latency_ns"]),
            }
        )
    return {
        **packet,
        "id": packet["packet_id"],
        "hex": f"0x{packet['packet_id']:08x}",
        "end_to_end": format_ns(packet["end_to_end_ns"]) if packet["end_to_end_ns"] else "incomplete",
        "span": format_ns(span),
        "ticks": [format_ns(span * q / 4) for q in range(5)],
        "segments": rows,
    }


@bp.get("/traces/<name>/packets")
def page(name: str):  # noqa: ANN201 - a view
    """The slowest packets of the range (?since= or ?start=, ?end=; ?slowest=) or one packet (?packet=ID) as
    waterfalls."""
    since, bounds = requested_since(), requested_bounds()
    packet_text = request.args.get("packet", "").strip()
    packet_id = parse_packet_id(packet_text) if packet_text else 0
    try:
        slowest = int(request.args.get("slowest") or 10)
    except ValueError:
        abort(400, description="slowest: a number of packets, e.g. 10")
    slowest = max(1, min(slowest, MAX_SLOWEST))
    error, status = None, 200
    packets: list[dict[str, Any]] = []
    try:
        answer = get_client().packets(
            name, since_seconds(since), packet_id=packet_id, slowest=slowest, **bounds_ns(bounds)
        )
        packets = [packet_view(packet) for packet in packets_from_proto(answer)]
    except ApiError as exc:  # no such trace, no store, store down: say so instead of a 500
        error, status = f"no packets of {name}: {exc.message}", http_status(exc)
    return render_template(
        "packets.html",
        name=name,
        since=since,
        bounds=bounds,
        range_text=range_text(since, bounds),
        since_choices=SINCE_CHOICES,
        slowest=slowest,
        packet_id=packet_id,
        packets=packets,
        error=error,
    ), status


# The download's packets: the first of the range, as hoptrace packets --pcap writes by default.
PCAP_PACKETS = 10_000


@bp.get("/traces/<name>/packets.pcapng")
def pcapng(name: str):  # noqa: ANN201 - a view
    """The packets hops captured in the range (a hop's capture: N action) as a pcap-ng download, as
    `hoptrace packets NAME --pcap FILE` writes it."""
    since, bounds = requested_since(), requested_bounds()
    request_ = captured_request(name, PCAP_PACKETS, since_s=since_seconds(since), **bounds_ns(bounds))
    try:
        answer = get_client().call("GetPackets", request_, timeout=QUERY_TIMEOUT_S)
    except ApiError as exc:
        abort(http_status(exc), description=f"no packets of {name}: {exc.message}")
    if not answer.packets:
        abort(404, description=f"no packet of {name} was captured in {range_text(since, bounds)}")
    out = io.BytesIO()
    write_pcapng(answer, out)
    out.seek(0)
    return send_file(
        out, mimetype="application/vnd.tcpdump.pcap", as_attachment=True, download_name=f"{name}.pcapng"
    )
