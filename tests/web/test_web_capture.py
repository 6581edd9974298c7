"""The results page's pcap-ng download: the captures the collector wrote (its capture stage and InfluxDB
exporter, into a real InfluxDB) read back through the dispatcher's GetPackets and written as pcap-ng, every
capture's time to the nanosecond, bytes and hop as written; a trace without captures answers 404."""

from __future__ import annotations

import io
import time

from pcapng import FileScanner, blocks
from stored_results import Glance, logged_in, pid
from web_helpers import web_config

from hoptrace import kernel_abi
from hoptrace.collector.captures import HopCapturesStage
from hoptrace.collector.influx import InfluxConfig, InfluxExporter
from hoptrace.collector.records import Capture
from hoptrace.web import create_app

HOPS = ("a-c1-out", "a-wire-out")
PACKETS = 5


class AtMaster:
    def to_master(self, ts_ns: int) -> int:
        return ts_ns


def write_captures(glance: Glance, influxd) -> dict[int, list[tuple[int, bytes]]]:
    """PACKETS packets captured at both hops, 1 ms apart, through the collector's stage and exporter; what was
    written per packet: (time, bytes) at each hop."""
    now = time.time_ns() - 2_000_000_000
    written: dict[int, list[tuple[int, bytes]]] = {}
    stage = HopCapturesStage()
    points = []
    for hop_index in range(len(HOPS)):
        captures = []
        for i in range(PACKETS):
            at = now + i * 1_000_000 + hop_index * 1_234 + 7  # ns that a microsecond clock would lose
            data = bytes([i, hop_index]) * 40
            captures.append(((at, pid(i), 0, 0, 100, hop_index, 1, 0, 0), Capture(300, 1, data)))
            written.setdefault(pid(i), []).append((at, data))
        points += stage.add(glance.trace, glance.measured, captures, AtMaster(), HOPS.__getitem__)
    exporter = InfluxExporter(
        InfluxConfig(url=influxd.url, bucket=influxd.bucket, org=influxd.org, token=influxd.token)
    )
    try:
        exporter.export(points)
        assert exporter.flush(timeout_s=30), "points not written"
    finally:
        exporter.close()
    return written


def test_the_results_page_downloads_the_captured_packets_as_pcapng(glance: Glance, influxd) -> None:
    written = write_captures(glance, influxd)
    client = logged_in(create_app(web_config(DISPATCHER=glance.dispatcher.address)))
    results = client.get(f"/traces/{glance.trace}/results?since=15m").text
    assert f'href="/traces/{glance.trace}/packets.pcapng?since=15m" id="captured-pcap"' in results
    download = client.get(f"/traces/{glance.trace}/packets.pcapng?since=15m")
    assert download.status_code == 200, download.text
    assert download.headers["Content-Disposition"] == f"attachment; filename={glance.trace}.pcapng"
    found = list(FileScanner(io.BytesIO(download.data)))
    interfaces = [b for b in found if isinstance(b, blocks.InterfaceDescription)]
    assert [(i.options["if_name"], i.link_type) for i in interfaces] == [
        (hop, kernel_abi.CAPTURE_LINK_ETHERNET) for hop in HOPS
    ]
    got: dict[int, list[tuple[int, bytes]]] = {}
    for block in (b for b in found if isinstance(b, blocks.EnhancedPacket)):
        packet_id = int(block.options["opt_comment"].split()[2], 16)
        at = (block.timestamp_high << 32) | block.timestamp_low
        got.setdefault(packet_id, []).append((at, bytes(block.packet_data)))
        assert block.packet_len == 300
    assert got == written  # every capture, at its hop's interface, to the ns

    none = client.get(f"/traces/{glance.trace}-none/packets.pcapng?since=15m")
    assert none.status_code == 404, none.text
