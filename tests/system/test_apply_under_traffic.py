"""A trace applied to live traffic: its hops attach one by one, and the nodes at different moments, so the
packets in flight at that moment pass some hops before those are attached. They are not lost; the report
counts them apart (`before_attach`) and counts loss only where a hop was attached when the packet reached
it.
"""

from __future__ import annotations

import time

from system_helpers import UdpSender, running_cluster, wait_report

from hoptrace.lab.reference import vxlan_path_spec
from hoptrace.lab.waiting import wait_until

RATE_PPS = 400


def test_packets_in_flight_at_apply_are_not_lost(topology, influxd):
    """A flow runs at 400 packets/s while the trace is applied and for 3 s after: no segment shows loss,
    every packet sent after the apply returned (every hop attached) is complete, and the packets that
    were in flight and missed the last hop are each counted once end to end as having passed a hop before it
    was attached."""
    spec = vxlan_path_spec(topology, "apply-live", port=11111)
    with running_cluster(topology, influxd.url) as cluster:
        sender = UdpSender(topology, "c1", "c2", 11111, rate_pps=RATE_PPS).start()
        try:
            wait_until(lambda: sender.sent >= RATE_PPS // 2, "the flow to run", 10, 0.05)
            cluster.apply(spec)  # returns once every hop of both nodes is attached
            sent_before_attached = sender.sent
            time.sleep(3)  # traffic's pacing: 3 s of the flow with every hop attached
        finally:
            sent = sender.stop()
        after = sent - sent_before_attached
        assert after >= RATE_PPS, (sent, sent_before_attached)
        data = wait_report(cluster, "apply-live", after)

    # The collector had the path before the first hop attached: no segment of placeholder hop names.
    names = [hop.name for hop in spec.hops]
    assert [(s["from"], s["to"]) for s in data["segments"]] == list(zip(names, names[1:], strict=False))
    segments = [*data["segments"], data["end_to_end"]]
    assert [s["loss_count"] for s in segments] == [0] * len(segments), segments
    assert all(s["tracer_lost"] == 0 for s in segments), segments
    # Every packet tagged after the last hop attached crossed every hop while it was attached.
    assert after <= data["complete"] <= data["packets"] <= sent, (after, data, sent)
    # The packets tagged before: every packet seen at the first hop and not at the last is one of them,
    # counted once end to end (a packet that passed only a middle hop unwatched has its end-to-end latency).
    e2e = data["end_to_end"]
    assert e2e["count"] + e2e["incomplete"] == data["packets"], data
    assert e2e["before_attach"] == e2e["incomplete"], e2e
    assert data["packets"] - data["complete"] <= sent_before_attached, (data, sent_before_attached)
    # The apply met packets in flight (the test would prove nothing otherwise): host-a's hops attach one
    # after another, each after its program's load, while packets go on being tagged at the first.
    assert e2e["before_attach"] > 0, e2e
    for s in data["segments"]:
        assert s["before_attach"] <= s["incomplete"], s
