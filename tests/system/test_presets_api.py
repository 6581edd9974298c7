"""Presets through the dispatcher: `Hoptrace.RunPreset` runs MACE or Iron on one node's agent, on the VXLAN
topology with real traffic, and the CLI's remote ``--node`` prints the same report through it.

Ground truths: the UDP flow from c1 is the only traffic of c1, so MACE sees (nearly) every one of its packets
leave, each with a positive container overhead; Iron on host-b sees the flow reach c2 there.
"""

from __future__ import annotations

import json
import time

import grpc
import pytest
from system_helpers import UdpSender, running_cluster

from hoptrace.dispatcher.presets import validate_preset_request
from hoptrace.v1 import agent_pb2, api_pb2


def run_preset(cluster, node: str, preset: str, **args: str) -> dict:
    """RunPreset through the admin stub; the summary object."""
    request = api_pb2.RunPresetRequest(node=node, preset=preset, args=args)
    result = cluster.api().RunPreset(request, timeout=60)
    assert not result.error
    return json.loads(result.summary_json)


def test_run_preset_mace_and_iron_on_nodes_while_udp_flows(topology, influxd):
    """MACE on host-a for c1 covers its packets with positive egress overhead; Iron on host-b lists c2."""
    with running_cluster(topology, influxd.url) as cluster:
        sender = UdpSender(topology, "c1", "c2", 12121, rate_pps=300).start()
        try:
            time.sleep(0.5)
            # The peer picks the outer device: the route to c2 (the VXLAN device, followed to the wire).
            peer = topology.addr("c2")
            mace = run_preset(cluster, "host-a", "mace", container=topology.c1, peer=peer, duration="3s")
            iron = run_preset(cluster, "host-b", "iron", duration="3s")
            cli = cluster.hoptrace(
                "mace",
                "--node",
                "host-a",
                "--container",
                topology.c1,
                "--peer",
                peer,
                "--duration",
                "2",
                "--json",
            )
            cli_iron = cluster.hoptrace("iron", "--node", "host-b", "--duration", "1", "--json")
        finally:
            sender.stop()

    assert mace["node"] == "host-a" and mace["container"] == topology.c1
    assert 2.5 < mace["seconds"] < 10
    egress = mace["egress"]
    assert egress["count"] >= 300, egress  # 3 s at 300 pps
    assert egress["coverage"] > 0.9, egress
    assert egress["mean_ns"] > 0 and egress["p50_ns"] > 0 and egress["p99_ns"] >= egress["p50_ns"]

    assert iron["node"] == "host-b" and 2.5 < iron["seconds"] < 10
    containers = {c["container"]: c for c in iron["per_container"]}
    assert iron["containers"] == len(containers) >= 1
    c2 = containers.get(topology.c2)
    assert c2 is not None, f"{topology.c2} not among {sorted(containers)}"
    assert c2["packets"] > 0 and c2["caused_ns"] > 0

    report = json.loads(cli.stdout)
    assert report["summary"]["node"] == "host-a"
    assert report["summary"]["egress"]["coverage"] > 0.9
    iron_report = json.loads(cli_iron.stdout)
    assert iron_report["summary"]["node"] == "host-b" and "per_container" not in iron_report["summary"]
    assert topology.c2 in {c["container"] for c in iron_report["containers"]}


def test_run_preset_names_what_is_wrong(topology, influxd):
    """An unknown preset or argument is INVALID_ARGUMENT naming the field; a node not connected is NOT_FOUND;
    what only the node finds out (a netns path that does not exist) is FAILED_PRECONDITION with the reason."""
    with running_cluster(topology, influxd.url) as cluster:
        api = cluster.api()
        cases = [
            (
                api_pb2.RunPresetRequest(node="host-a", preset="nope"),
                grpc.StatusCode.INVALID_ARGUMENT,
                "preset",
            ),
            (
                api_pb2.RunPresetRequest(node="host-a", preset="mace", args={"duration": "1s"}),
                grpc.StatusCode.INVALID_ARGUMENT,
                "args.container",
            ),
            (
                api_pb2.RunPresetRequest(node="host-a", preset="iron", args={"object": "/tmp/x.o"}),
                grpc.StatusCode.INVALID_ARGUMENT,
                "args.object",
            ),
            (
                api_pb2.RunPresetRequest(node="host-z", preset="iron", args={"duration": "1s"}),
                grpc.StatusCode.NOT_FOUND,
                "host-z",
            ),
            (
                api_pb2.RunPresetRequest(
                    node="host-a", preset="mace", args={"container": "/run/netns/absent", "duration": "1s"}
                ),
                grpc.StatusCode.FAILED_PRECONDITION,
                "/run/netns/absent",
            ),
        ]
        for request, code, named in cases:
            with pytest.raises(grpc.RpcError) as caught:
                api.RunPreset(request, timeout=40)
            assert caught.value.code() == code, caught.value.details()
            assert named in caught.value.details()
        # The session still serves after a failed preset.
        summary = json.loads(
            api.RunPreset(
                api_pb2.RunPresetRequest(node="host-b", preset="iron", args={"duration": "1s"})
            ).summary_json
        )
        assert summary["node"] == "host-b"


@pytest.mark.parametrize(
    ("args", "field"),
    [
        ({"container": "c", "duration": "0s"}, "args.duration"),
        ({"container": "c", "duration": "soon"}, "args.duration"),
        ({"container": "c", "path": "wire"}, "args.path"),
        ({"container": "c", "packets": "true"}, "args.packets"),
        ({"container": "unknown-netns"}, "args.container"),
    ],
)
def test_validate_preset_request_names_the_field(args, field):
    """Pure validation: each bad argument is named by its field."""
    registration = agent_pb2.Register(node="n", namespaces=[agent_pb2.Namespace(name="c")])
    errors = validate_preset_request("n", "mace", args, registration)
    assert [e.field for e in errors] == [field]
