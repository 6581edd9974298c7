"""The packets hops captured (a hop's `capture: N` action), read back from the collector's `hop_capture`
points as `GetPackets`' answer with `captured` set: each packet with its first bytes at every hop that kept
them, in the order of the packets' first captures (`hoptrace packets --pcap` writes them as pcap-ng).

Two queries: the first `captured` packet IDs of the range in the order of their first capture (and one more,
to tell a truncated answer), then every capture from the first of them to `PASSAGE_SLACK_NS` after the last,
kept for those IDs. Times are read as integers (`int(v: r._time)`): the client's datetimes stop at the
microsecond, and a pcap-ng file keeps the nanosecond.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any

from hoptrace.collector.schema import HOP_CAPTURE
from hoptrace.results.flux import flux_string, records, request_range
from hoptrace.v1 import api_pb2

# GetPackets with `captured`: at most this many packets per answer (20000 packets of 8 hops' 128 bytes are
# about 25 MB of the API's 64 MB messages).
MAX_CAPTURED = 20_000
# A packet's captures after its first one are looked for this long after it (a passage lasts ms; a capture
# seen later is another passage of a reused ID, or left out).
PASSAGE_SLACK_NS = 10_000_000_000


def query_captured(
    q: Any, org: str, bucket: str, request: api_pb2.GetPacketsRequest, path: Sequence[str] | None
) -> api_pb2.PacketList:
    """The request's captured packets (`request.captured` of them, or the one `request.packet_id`)."""
    limit = min(request.captured, MAX_CAPTURED)
    start, stop = request_range(request)
    base = (
        f"from(bucket: {flux_string(bucket)})"
        f' |> range(start: {start}, stop: {stop}) |> filter(fn: (r) => r._measurement == "{HOP_CAPTURE}"'
        f" and r.trace == {flux_string(request.trace)}"
    )
    only = f" and r._value == {int(request.packet_id)}" if request.packet_id else ""
    first_captures = (
        f'{base} and r._field == "packet_id"{only}) |> group() |> sort(columns: ["_time"]) |> unique()'
        f" |> limit(n: {limit + 1}) |> map(fn: (r) => ({{r with t_ns: int(v: r._time)}}))"
    )
    order: dict[int, int] = {}  # packet ID -> its first capture (unix ns), in that order
    for rec in records(q, org, first_captures):
        order.setdefault(int(rec.get_value()), int(rec.values["t_ns"]))
    out = api_pb2.PacketList()
    if len(order) > limit:
        out.truncated = True
        order.pop(next(reversed(order)))
    if not order:
        return out
    first, last = min(order.values()), max(order.values())
    captures = (
        f"from(bucket: {flux_string(bucket)})"
        f" |> range(start: time(v: {first}), stop: time(v: {last + PASSAGE_SLACK_NS}))"
        f' |> filter(fn: (r) => r._measurement == "{HOP_CAPTURE}"'
        f" and r.trace == {flux_string(request.trace)})"
        ' |> pivot(rowKey: ["_time"], columnKey: ["_field"], valueColumn: "_value")'
        " |> map(fn: (r) => ({r with t_ns: int(v: r._time)}))"
    )
    timelines = {packet_id: api_pb2.PacketTimeline(packet_id=packet_id) for packet_id in order}
    for packet_id, at in order.items():
        timelines[packet_id].at.FromNanoseconds(at)
    kept: list[tuple[int, int, api_pb2.PacketCapture]] = []
    hops: dict[str, int] = {}  # hop -> its first capture, for an order without a path
    for rec in records(q, org, captures):
        values = rec.values
        packet_id = values.get("packet_id")
        if packet_id is None or int(packet_id) not in timelines or values.get("bytes") is None:
            continue
        at = int(values["t_ns"])
        hop = values.get("hop", "")
        capture = api_pb2.PacketCapture(
            hop=hop,
            node=values.get("node", ""),
            wire_len=int(values.get("wire_len") or 0),
            link_type=int(values.get("link_type") or 0),
            data=base64.b64decode(values["bytes"]),
        )
        capture.at.FromNanoseconds(at)
        kept.append((at, int(packet_id), capture))
        hops[hop] = min(at, hops.get(hop, at))
    for _, packet_id, capture in sorted(kept, key=lambda k: (k[0], k[2].hop)):
        timelines[packet_id].captures.append(capture)
    out.packets.extend(timelines.values())
    on_path = [hop for hop in path or () if hop in hops]
    out.capture_hops.extend(on_path + sorted((h for h in hops if h not in on_path), key=lambda h: hops[h]))
    return out
