"""UDP every datagram: hoptrace's tagging against the least tagger, side by side.

iperf3 UDP (1400-byte datagrams, unlimited rate) c1 -> host-a over c1's one veth, pinned (client CPU 0,
server CPU 1), bracketed rounds (`none` between every two conditions), as `tcp_overhead.py --udp --path veth
--pin --bracket` runs them:

- `floor_tag`: the least tagger (tcp_overhead.LEAST_TAGGER_SOURCE) at c1's eth0: each datagram grown by its
  4-byte ID after the payload, as hoptrace's tagging hop does, lengths and checksums fixed, the ID recorded
  in the agent's ring; `ring_cost`'s `floor` recorder at host-a's veth (the ID read, the clock, a ring
  record); the agent ships both programs' records as hoptrace's (they carry its trace's slot);
- `tag_all`: hoptrace, every datagram tagged at c1's eth0 and recorded at both hops;
- with `--conditions`, any other of tcp_overhead's (`empty`, `floor_ring`: the floor without the growth).

Prints each condition's ratio to untraced and `tag_all over floor_tag` paired round by round (95 % bootstrap
intervals); `--perf COND` profiles that condition's first run (`perf record -a -g`). `--per-hop`: instead,
with bpf_stats on, each hop's ns per run in place (run_time_ns / run_cnt of the program at the hop, by its
attachment), median over rounds: the tagging hop (`c1-eth0-out`) and the recording hop (`a-veth-in`) of each
condition side by side.

    .venv/bin/python bench/udp_tag_floor.py --rounds 8 --seconds 5 [--conditions floor_tag,tag_all] \\
        [--perf tag_all] [--bpf-stats] [--ab-object OTHER.bpf.o --conditions floor_tag,tag_all,tag_all_ab]
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path

from overhead import iperf3
from tcp_overhead import CONDITIONS, PATH_TC_HOPS, SERVER, condition, run

from common import RecordSink, bpf_stats_enabled, bpftool_json, log, median, tcx_prog_ids
from hoptrace.lab.topology import TwoHostTopology

DEFAULT = "floor_tag,tag_all"
HOPS = PATH_TC_HOPS["veth"]


def hop_programs(topo: TwoHostTopology) -> dict[int, str]:
    """Program id -> the hop it runs at: the agents' by their tcx links, the floors' by clsact's filters."""
    at = {}
    for hop, (role, dev, direction) in HOPS.items():
        for prog in tcx_prog_ids(topo, role, dev)[direction]:
            at[prog] = hop
        shown = topo.run(role, "tc", "filter", "show", "dev", dev, direction, check=False).stdout
        for prog in re.findall(r" id (\d+) name ", shown):
            at[int(prog)] = hop
    return at


def per_hop(
    rounds: int, seconds: int, conditions: list[str], ab: dict[str, Path]
) -> dict[str, dict[str, list[float]]]:
    """Each condition's ns per run at each hop, one figure per round (bpf_stats on, order rotated); `ab`:
    `tag_all_ab`'s hop object."""
    server, iface = SERVER["veth"]
    results: dict[str, dict[str, list[float]]] = {c: {hop: [] for hop in HOPS} for c in conditions}
    sink = RecordSink()
    topo = TwoHostTopology("utf", overlay="vxlan")
    try:
        topo.create()
        with bpf_stats_enabled(), tempfile.TemporaryDirectory(prefix="hoptrace-utf-") as tmp:
            for r in range(rounds):
                for name in conditions[r % len(conditions) :] + conditions[: r % len(conditions)]:
                    with condition(name, topo, Path(tmp), sink, "veth", ab):
                        at = hop_programs(topo)
                        before = {p["id"]: p for p in bpftool_json("prog", "show") if p["id"] in at}
                        mbps = iperf3(topo, seconds, udp=True, server=server, server_iface=iface, cpus=(0, 1))
                        after = {p["id"]: p for p in bpftool_json("prog", "show") if p["id"] in at}
                    shown = []
                    for prog, hop in at.items():
                        runs = after[prog].get("run_cnt", 0) - before[prog].get("run_cnt", 0)
                        ns = after[prog].get("run_time_ns", 0) - before[prog].get("run_time_ns", 0)
                        if runs:
                            results[name][hop].append(ns / runs)
                            shown.append(f"{hop} {after[prog].get('name')} {ns / runs:.0f} ns x{runs}")
                    log(f"round {r + 1} {name}: {mbps:.0f} Mbit/s; " + "; ".join(shown))
    finally:
        topo.destroy()
        sink.close()
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--conditions", default=DEFAULT, help=f"comma-separated (default {DEFAULT})")
    ap.add_argument("--perf", choices=CONDITIONS, help="profile this condition's first run")
    ap.add_argument(
        "--bpf-stats",
        action="store_true",
        help="kernel.bpf_stats_enabled on: each run logs each program's ns per run (lowers the ratios)",
    )
    ap.add_argument(
        "--per-hop", action="store_true", help="each hop's ns per run in place (bpf_stats), not throughput"
    )
    ap.add_argument(
        "--ab-object",
        type=Path,
        help="`tag_all_ab`: tag_all with this build of hoptrace.bpf.o (another commit's)",
    )
    args = ap.parse_args()
    conditions = ["none"] + [c for c in args.conditions.split(",") if c and c != "none"]
    unknown = [c for c in conditions if c not in CONDITIONS and c != "tag_all_ab"]
    if unknown:
        ap.error(f"unknown conditions {unknown}: choose from {', '.join(CONDITIONS)}, tag_all_ab")
    ab = {"object": args.ab_object} if args.ab_object else {}
    if "tag_all_ab" in conditions and not ab:
        ap.error("tag_all_ab needs --ab-object")
    if args.per_hop:
        results = per_hop(args.rounds, args.seconds, conditions[1:], ab)
        print("| condition | " + " | ".join(f"{hop}, ns per run (median; rounds)" for hop in HOPS) + " |")
        print("|---" * (len(HOPS) + 1) + "|")
        for name, hops in results.items():
            cells = [
                f"{median(v):.0f}; " + ", ".join(f"{x:.0f}" for x in v) if v else "none"
                for v in hops.values()
            ]
            print(f"| `{name}` | " + " | ".join(cells) + " |")
        return 0
    run(args.rounds, args.seconds, args.perf, conditions, "veth", True, args.bpf_stats, (0, 1), ab, True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
