"""socket-read and uprobe hops end to end: a UDP flow c1 -> c2 through the VXLAN path into a real application
(agent/internal/tracer/testdata/reader.c, compiled here) goes through the dispatcher (validation, plans),
both agents, the collector and InfluxDB into `hoptrace report --json`, whose decomposition must reach the
application: container device -> socket read -> handler entry -> handler return, each segment with every
message the application received (and it received each unchanged). The read hop counts by the reader's
name (comm), which the report shows as the name."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

from system_helpers import report, running_cluster, wait_report

from hoptrace.lab.reference import vxlan_path_spec
from hoptrace.v1 import trace_pb2

SENT = 100
SIZE = 200
PORT = 11111
READER_SOURCE = (
    Path(__file__).resolve().parents[2] / "agent" / "internal" / "tracer" / "testdata" / "reader.c"
)


def _send_messages(topology, count: int) -> None:
    """Each message after the application's answer to the previous one (reader.c's protocol)."""
    sender = topology.socket("c1", socket.AF_INET, socket.SOCK_DGRAM)
    with sender:
        sender.settimeout(5)
        sender.connect((topology.addr("c2"), PORT))
        for k in range(count):
            sender.send(bytes((k + i) & 0xFF for i in range(SIZE)))
            assert sender.recv(1) == b"k", f"no answer to message {k}"


def test_decomposition_reaches_the_application(topology, influxd, tmp_path):
    reader = tmp_path / "reader"
    subprocess.run(["clang", "-O2", "-g", "-o", str(reader), str(READER_SOURCE)], check=True)
    spec = vxlan_path_spec(topology, "e2e-sockread", port=PORT)
    spec.hops.extend(
        [
            trace_pb2.HopSpec(
                name="b-c2-read",
                node="host-b",
                at="socket-read",
                netns=topology.c2,
                actions=[
                    trace_pb2.ActionSpec(kind="timestamp"),
                    trace_pb2.ActionSpec(kind="count", by="comm"),
                ],
            ),
            trace_pb2.HopSpec(
                name="b-handler", node="host-b", at=f"uprobe:{reader}:handle_request", netns=topology.c2
            ),
            trace_pb2.HopSpec(
                name="b-handled", node="host-b", at=f"uretprobe:{reader}:handle_request", netns=topology.c2
            ),
        ]
    )
    with running_cluster(topology, influxd.url) as cluster:
        cluster.apply(spec)
        app = subprocess.Popen(
            ["ip", "netns", "exec", topology.c2, str(reader), "udp", str(PORT), str(SENT), str(SIZE)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert app.stdout is not None and app.stdout.readline().strip() == "ready"
            _send_messages(topology, SENT)
            out, err = app.communicate(timeout=10)
        finally:
            if app.poll() is None:
                app.kill()
                app.wait()
        # The application got every message unchanged (reader.c checks each byte) and handled each once.
        assert app.returncode == 0 and out.strip() == f"ok {SENT}", (out, err)
        data = wait_report(cluster, "e2e-sockread", SENT)
        deadline = time.monotonic() + 30
        while not _read_counts(data) and time.monotonic() < deadline:  # the agent's next counter report
            time.sleep(1)
            data = report(cluster, "e2e-sockread")

    segments = {(s["from"], s["to"]): s for s in data["segments"]}
    for pair in [("b-c2-eth0-in", "b-c2-read"), ("b-c2-read", "b-handler"), ("b-handler", "b-handled")]:
        segment = segments[pair]
        # Every message at every step, none lost, and time only moves forward (same node, one clock).
        assert segment["count"] == SENT and segment["loss_count"] == 0, segment
        assert 0 <= segment["p50_ns"] <= segment["max_ns"], segment
    assert data["end_to_end"]["from"] == "a-c1-eth0-out" and data["end_to_end"]["to"] == "b-handled"
    assert data["end_to_end"]["count"] == SENT
    assert _read_counts(data) == [
        {"node": "host-b", "by": "comm", "key": _comm_key("reader"), "count": SENT, "key_name": "reader"}
    ]


def _read_counts(data) -> list:
    return next((h["counts"] for h in data["hops"] if h["hop"] == "b-c2-read"), [])


def _comm_key(name: str) -> int:
    """The comm field's value of a task name: its first 8 bytes, little-endian."""
    return int.from_bytes(name.encode()[:8].ljust(8, b"\0"), "little")
