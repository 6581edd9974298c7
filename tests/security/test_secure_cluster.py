"""The happy path with security on: certificates, mTLS everywhere and a token, a trace on the VXLAN topology
applied through the API, and a report with data through the CLI."""

from __future__ import annotations

import os

from hoptrace.lab.localcluster import LocalCluster
from hoptrace.lab.processes import udp_transfer
from hoptrace.lab.reference import vxlan_path_spec


def test_trace_end_to_end_with_mtls_and_token(topology, influxd):
    """Every component speaks mutual TLS (no insecure warning anywhere); the report counts every packet."""
    cluster = LocalCluster(influx_url=influxd.url)
    assert cluster.secure and cluster.certs is not None
    try:
        cluster.start_dispatcher()
        cluster.start_collector("--join-window", "1")
        cluster.wait_listening()
        cluster.start_agent("host-a", topology.host_a)
        cluster.start_agent("host-b", topology.host_b)
        cluster.wait_agents(["host-a", "host-b"])
        spec = vxlan_path_spec(topology, "sec-e2e")
        cluster.apply(spec)

        payloads = [os.urandom(64) for _ in range(100)]
        assert udp_transfer(topology, "c1", "c2", payloads, 4, 11111, 0.002) == payloads

        import json
        import time

        deadline = time.monotonic() + 30
        data: dict = {}
        while time.monotonic() < deadline:
            result = cluster.hoptrace("report", "sec-e2e", "--since", "30m", "--json", check=False)
            if result.returncode == 0:
                data = json.loads(result.stdout)
                if data.get("complete", 0) >= 100:
                    break
            time.sleep(1)
        assert data.get("complete") == 100, data
        assert [s["count"] for s in data["segments"]] == [100] * (len(spec.hops) - 1)

        for component in cluster.components.values():
            log = component.log_path.read_text()
            assert "WITHOUT TLS" not in log and "--insecure" not in log, component.name
            assert "will refuse" not in log, component.log_tail()
    finally:
        cluster.stop()
