"""What hoptrace costs when nothing is happening (target: an idle collector and agent ≤ 1 % of a core each).

A VXLAN TwoHostTopology with every component as `make demo` runs it (InfluxDB, dispatcher, collector and
an agent per emulated host, TLS), then, in turn: no trace; the reference 8-hop trace applied with no traffic
on its flow. Each phase measures every process's CPU seconds (utime + stime from /proc/PID/stat) over the
same wall-clock interval, so the shares are side by side in one run.

    .venv/bin/python bench/idle_cost.py [--seconds 30]

Prints a table and one JSON line (share of a core per component and phase).
"""

from __future__ import annotations

import argparse
import json
import time

from case_common import require_root, traced_topology

from common import proc_usage
from hoptrace.lab.reference import vxlan_path_spec

TARGET = 0.01  # of a core, each component


def shares(pids: dict[str, int], seconds: float) -> dict[str, float]:
    """Each process's CPU share of a core over `seconds` of wall time."""
    before = {name: proc_usage(pid).cpu_s for name, pid in pids.items()}
    start = time.monotonic()
    time.sleep(seconds)
    elapsed = time.monotonic() - start
    return {name: (proc_usage(pid).cpu_s - before[name]) / elapsed for name, pid in pids.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="length of each phase")
    parser.add_argument("--settle", type=float, default=5.0, help="wait before each phase")
    args = parser.parse_args()
    require_root()
    phases: dict[str, dict[str, float]] = {}
    with traced_topology("vxlan") as (topo, cluster):
        pids = {name: c.process.pid for name, c in cluster.components.items()}
        time.sleep(args.settle)
        phases["no trace"] = shares(pids, args.seconds)
        cluster.apply(vxlan_path_spec(topo, "idle"))
        time.sleep(args.settle)
        phases["trace applied, no traffic"] = shares(pids, args.seconds)
    names = sorted(pids)
    print(f"{'phase':28}" + "".join(f"{n:>14}" for n in names))
    for phase, got in phases.items():
        print(f"{phase:28}" + "".join(f"{got[n] * 100:>13.2f}%" for n in names))
    worst = max(v for got in phases.values() for n, v in got.items() if n != "dispatcher")
    print(f"busiest collector or agent: {worst * 100:.2f} % of a core (target ≤ {TARGET * 100:.0f} %)")
    print(json.dumps({"seconds": args.seconds, "share_of_a_core": phases}))


if __name__ == "__main__":
    main()
