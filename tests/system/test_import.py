"""Record now, import later: the agents' --out files of a live cluster, imported into a bucket of their own
with `hoptrace import`, give the report the live collector gave of the same packets, and the same packets in
`hoptrace packets --pcap`.

Both agents write their JSON lines beside their collector stream (each sink takes every batch from a queue of
its own). host-b's clock is off by a simulated 3.7 ms, which the files must carry (its clock lines) for the
cross-host segment to come out right; the trace has `drops: true` and an nftables rule drops about 5 % at
host-b's wire, so the files must also carry the drop hops, the reasons and functions their records name and
the kernel's names of the reasons. A hop on each host has `capture: N`, so the files carry the captured bytes
too: tshark reads the imported recording's pcap-ng as the live one's, packet for packet, hop for hop, byte for
byte. A dispatcher reading only the imported bucket answers the report and the packets.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from system_helpers import UdpSender, report, running_cluster

from hoptrace.lab.localcluster import HOPTRACE, LocalCluster
from hoptrace.lab.reference import vxlan_path_spec
from hoptrace.lab.waiting import wait_until
from hoptrace.v1 import trace_pb2

PACKETS = 300
PORT = 11111
IMPORTED_BUCKET = "imported/autogen"
# A hop with the capture action on each host (the first and the last of the path), and its bytes; 300
# datagrams/s at both stay within the collector's default capture budget (1000 a second and trace).
CAPTURING = {"a-c1-eth0-out": 96, "b-c2-eth0-in": 72}


def segments(data: dict) -> dict[str, dict]:
    """The report's segments and end to end, by 'from>to'."""
    return {f"{s['from']}>{s['to']}": s for s in [*data["segments"], data["end_to_end"]]}


def pcap_frames(cluster: LocalCluster, trace: str, path: Path) -> list[dict]:
    """`hoptrace packets TRACE --pcap PATH` of the cluster's dispatcher, read back by tshark: each frame's
    comment (packet ID, hop, node), interface, time (ns since the epoch), length and bytes, in file order."""
    result = cluster.hoptrace("packets", trace, "--since", "30m", "--pcap", str(path))
    assert result.stdout.startswith(f"{path}: "), result.stdout
    out = subprocess.run(
        ["tshark", "-r", str(path), "-T", "json", "-x"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    frames = []
    for frame in json.loads(out):
        layers = frame["_source"]["layers"]
        seconds, _, fraction = layers["frame"]["frame.time_epoch"].partition(".")
        frames.append(
            {
                "comment": layers["pkt_comment"]["frame.comment"],
                "interface": layers["frame"]["frame.interface_id_tree"]["frame.interface_name"],
                "time_ns": int(seconds) * 10**9 + int(fraction.ljust(9, "0")[:9]),
                "len": int(layers["frame"]["frame.len"]),
                "bytes": layers["frame_raw"][0],
            }
        )
    return frames


def test_imported_files_report_what_the_live_collector_did(topology, influxd, tmp_path: Path) -> None:
    spec = vxlan_path_spec(topology, "import-e2e", port=PORT, tc_only=True)
    spec.drops = True
    for hop in spec.hops:
        if hop.name in CAPTURING:
            hop.actions.extend(
                [
                    trace_pb2.ActionSpec(kind="timestamp"),
                    trace_pb2.ActionSpec(kind="capture", bytes=CAPTURING[hop.name]),
                ]
            )
    files = {node: tmp_path / f"{node}.jsonl" for node in ("host-a", "host-b")}
    agent_args = {
        "host-a": ["--out", str(files["host-a"])],
        "host-b": ["--out", str(files["host-b"]), "--clock-offset", "3.7ms"],
    }
    topology.drop_flow_on_wire(50, PORT)
    try:
        with running_cluster(topology, influxd.url, agent_args=agent_args) as cluster:
            cluster.apply(spec)
            sender = UdpSender(topology, "c1", "c2", PORT, rate_pps=300).start()
            wait_until(lambda: sender.sent >= PACKETS, f"{PACKETS} datagrams sent", 10)
            sent = sender.stop()
            dropped = topology.dropped_on_wire()

            def accounted() -> dict | None:  # every packet counted, the lost ones with their drop
                data = report(cluster, spec.name)
                e2e = data["end_to_end"]
                lost = sum(d["count"] for d in e2e["drops"])
                return data if e2e["count"] + e2e["loss_count"] >= sent and lost >= dropped else None

            live = wait_until(accounted, f"the live report of {spec.name}'s {sent} datagrams", 30, 0.5)
            expected = 2 * sent - dropped  # each datagram at a-c1-eth0-out, those not dropped at b-c2-eth0-in

            def all_captured() -> list[dict] | None:
                frames = pcap_frames(cluster, spec.name, tmp_path / "live.pcapng")
                return frames if len(frames) >= expected else None

            live_frames = wait_until(all_captured, f"the live pcap-ng's {expected} frames", 20, 0.5)
    finally:
        topology.stop_dropping()
    assert live["packets"] == sent and live["complete"] == sent - dropped > 0 and dropped > 0, live
    # The agents stopped with the cluster: their files hold every record and their last counters.
    for node, path in files.items():
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        kinds = {line["type"] for line in lines}
        assert {"trace", "clock", "record", "counters"} <= kinds, (node, kinds)
        trace_line = next(line for line in lines if line["type"] == "trace")
        assert trace_line["node"] == node and "NETFILTER_DROP" in trace_line["drop_reasons"].values()
    offsets = [
        line["offset_ns"]
        for line in map(json.loads, files["host-b"].read_text().splitlines())
        if line["type"] == "clock" and "offset_ns" in line
    ]
    assert offsets and all(3_600_000 < offset < 3_800_000 for offset in offsets), offsets[:5]

    def import_files() -> str:
        result = subprocess.run(
            [*HOPTRACE, "import", *map(str, files.values()), "--influx-url", influxd.url]
            + ["--influx-bucket", IMPORTED_BUCKET],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, result.stderr
        return result.stdout

    out = import_files()
    assert f"{live['packets']} packets, {live['complete']} complete" in out, out
    imported_side = LocalCluster(influx_url=influxd.url, influx_bucket=IMPORTED_BUCKET)
    try:
        imported_side.start_dispatcher()
        imported_side.wait_listening(addrs=[imported_side.dispatcher_addr])
        imported = report(imported_side, spec.name)  # the import returned once InfluxDB had every point
        imported_frames = pcap_frames(imported_side, spec.name, tmp_path / "imported.pcapng")
        import_files()  # again: the same points, rewritten, not added
        assert report(imported_side, spec.name) == imported
    finally:
        imported_side.stop()

    assert (imported["packets"], imported["complete"]) == (live["packets"], live["complete"])
    live_segments, imported_segments = segments(live), segments(imported)
    names = [hop.name for hop in spec.hops]
    path = [f"{a}>{b}" for a, b in zip(names, names[1:], strict=False)] + [f"{names[0]}>{names[-1]}"]
    assert list(imported_segments) == path
    for name in path:
        mine, theirs = imported_segments[name], live_segments[name]
        for key in ("count", "incomplete", "loss_count", "drops"):
            assert mine[key] == theirs[key], (name, key, mine, theirs)
        # The same records, placed through the same clock estimates: the medians agree within the bound
        # of the clocks (and the sketch's 0.5 % between two rounds of one value).
        slack = int(theirs.get("clock_bound_ns", 0)) + 0.01 * abs(int(theirs["p50_ns"])) + 1
        assert abs(int(mine["p50_ns"]) - int(theirs["p50_ns"])) <= slack, (name, mine, theirs)
    wire = imported_segments["b-wire-in>b-vxlan-in"]
    netfilter = {"node": "host-b", "reason": "NETFILTER_DROP", "function": "nft_do_chain", "count": dropped}
    assert wire["drops"] == [netfilter], wire

    # The captures: every packet at each capturing hop (host-b's hop lacks the dropped ones), once, with the
    # same ID, hop and bytes, in the same order; their times through the same clock estimates.
    lost = sent - live["complete"]
    assert len(live_frames) == 2 * sent - lost == expected, (len(live_frames), sent, lost)
    same = ("comment", "interface", "len", "bytes")
    assert [[f[k] for k in same] for f in imported_frames] == [[f[k] for k in same] for f in live_frames]
    by_hop = {hop: [f for f in live_frames if f["interface"] == hop] for hop in CAPTURING}
    assert {hop: len(frames) for hop, frames in by_hop.items()} == {
        "a-c1-eth0-out": sent,
        "b-c2-eth0-in": sent - lost,
    }
    assert all(len(f["bytes"]) == 2 * min(f["len"], CAPTURING[f["interface"]]) for f in live_frames)
    # A file's clock line is written when the node's mapping moved by 1 us: the times agree within that (9 ns
    # in the run that set this bound).
    skew = max(abs(i["time_ns"] - f["time_ns"]) for i, f in zip(imported_frames, live_frames, strict=True))
    assert skew <= 2_000, skew
    cross = imported_segments["a-wire-out>b-wire-in"]
    assert int(cross["p50_ns"]) < 1_000_000, cross  # not host-b's 3.7 ms
