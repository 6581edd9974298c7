"""vNetTracer case study 1, a congested virtual switch: a sockperf flow c1 -> c2 shares host-a's Linux bridge
with iperf3 TCP flows to host-b, from one and then several bridge ports.

Routed TwoHostTopology (no overlay, so the bridge and forwarding are the only virtual switching on host-a);
hops in examples/case-studies/congested-bridge.yaml. Cases: idle, 1 flow from c3, 4 flows from c3, one flow
from each of c3..c6. Each case is its own trace (``cb-<case>``), reported with ``hoptrace report --json``
once the report accounts for every datagram sockperf sent.

    sudo .venv/bin/python bench/case_congested_bridge.py [--seconds 8] [--mps 1000] [--case NAME ...] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from case_common import (
    extra_container,
    iperf3_load,
    report,
    require_root,
    sockperf,
    spec,
    traced_topology,
)

HOPS = [
    ("a-c1-eth0-out", "host-a", "tc-egress", "eth0", "{c1}"),
    ("a-veth-in", "host-a", "tracepoint:net:netif_receive_skb", "veth-c1", ""),
    ("a-wire-out", "host-a", "tc-egress", "wire0", ""),
    ("b-wire-in", "host-b", "tc-ingress", "wire0", ""),
    ("b-veth-out", "host-b", "tracepoint:net:net_dev_xmit", "veth-c2", ""),
    ("b-c2-eth0-in", "host-b", "tc-ingress", "eth0", "{c2}"),
]

CASES: list[tuple[str, list[tuple[int, int]]]] = [
    ("idle", []),
    ("1-flow-1-port", [(3, 1)]),
    ("4-flows-1-port", [(3, 4)]),
    ("4-flows-4-ports", [(3, 1), (4, 1), (5, 1), (6, 1)]),
]


def run(seconds: float = 8, mps: int = 1000, cases: list[str] | None = None) -> list[dict[str, Any]]:
    """The `cases` (default: every one of CASES) in turn on one topology; per case sockperf's numbers and
    the segment report."""
    selected = [(case, flows) for case, flows in CASES if cases is None or case in cases]
    results = []
    with traced_topology("routed") as (topo, cluster):
        used = sorted({i for _, flows in selected for i, _ in flows})  # the bridge ports the cases load
        ports = {i: extra_container(topo, i) for i in used}
        hops = [(n, node, at, dev, ns.format(c1=topo.c1, c2=topo.c2)) for n, node, at, dev, ns in HOPS]
        for case, flows in selected:
            name = f"cb-{case}"
            cluster.apply(spec(name, topo, hops))
            with iperf3_load(topo, [(ports[i], streams) for i, streams in flows], seconds + 4):
                app = sockperf(topo, seconds, mps)
            results.append({"case": case, "sockperf": app, "report": report(cluster, name, app)})
    return results


def main() -> int:
    """Command line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8)
    parser.add_argument("--mps", type=int, default=1000)
    parser.add_argument(
        "--case",
        action="append",
        choices=[case for case, _ in CASES],
        help="run this case only (repeatable; default: every case)",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    require_root()
    results = run(args.seconds, args.mps, args.case)
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
