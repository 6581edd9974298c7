"""Record now, import later: the agents' --out files of a live cluster, imported into a bucket of their own
with `hoptrace import`, give the report the live collector gave of the same packets.

Both agents write their JSON lines beside their collector stream (each sink takes every batch from a queue of
its own). host-b's clock is off by a simulated 3.7 ms, which the files must carry (its clock lines) for the
cross-host segment to come out right; the trace has `drops: true` and an nftables rule drops about 5 % at
host-b's wire, so the files must also carry the drop hops, the reasons their records name and the kernel's
names of them. A dispatcher reading only the imported bucket answers the report.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from system_helpers import UdpSender, report, running_cluster

from hoptrace.lab.localcluster import HOPTRACE, LocalCluster
from hoptrace.lab.reference import vxlan_path_spec
from hoptrace.lab.waiting import wait_until

PACKETS = 300
PORT = 11111
IMPORTED_BUCKET = "imported/autogen"


def segments(data: dict) -> dict[str, dict]:
    """The report's segments and end to end, by 'from>to'."""
    return {f"{s['from']}>{s['to']}": s for s in [*data["segments"], data["end_to_end"]]}


def test_imported_files_report_what_the_live_collector_did(topology, influxd, tmp_path: Path) -> None:
    spec = vxlan_path_spec(topology, "import-e2e", port=PORT, tc_only=True)
    spec.drops = True
    files = {node: tmp_path / f"{node}.jsonl" for node in ("host-a", "host-b")}
    agent_args = {
        "host-a": ["--out", str(files["host-a"])],
        "host-b": ["--out", str(files["host-b"]), "--clock-offset", "3.7ms"],
    }
    topology.drop_flow_on_wire(50, PORT)
    try:
        with running_cluster(topology, influxd.url, agent_args=agent_args) as cluster:
            cluster.apply(spec)
            sender = UdpSender(topology, "c1", "c2", PORT, rate_pps=500).start()
            wait_until(lambda: sender.sent >= PACKETS, f"{PACKETS} datagrams sent", 10)
            sent = sender.stop()
            dropped = topology.dropped_on_wire()

            def accounted() -> dict | None:  # every packet counted, the lost ones with their drop
                data = report(cluster, spec.name)
                e2e = data["end_to_end"]
                lost = sum(d["count"] for d in e2e["drops"])
                return data if e2e["count"] + e2e["loss_count"] >= sent and lost >= dropped else None

            live = wait_until(accounted, f"the live report of {spec.name}'s {sent} datagrams", 30, 0.5)
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
    assert wire["drops"] == [{"node": "host-b", "reason": "NETFILTER_DROP", "count": dropped}], wire
    cross = imported_segments["a-wire-out>b-wire-in"]
    assert int(cross["p50_ns"]) < 1_000_000, cross  # not host-b's 3.7 ms
