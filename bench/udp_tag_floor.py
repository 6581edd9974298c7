"""UDP every datagram: hoptrace's tagging against the least tagger, side by side.

iperf3 UDP (1400-byte datagrams, unlimited rate) c1 -> host-a over c1's one veth, pinned (client CPU 0,
server CPU 1), bracketed rounds (`none` between every two conditions), as `tcp_overhead.py --udp --path veth
--pin --bracket` runs them:

- `floor_tag`: the least tagger (tcp_overhead.LEAST_TAGGER_SOURCE) at c1's eth0: each datagram grown by its
  4-byte ID after the payload, as hoptrace's tagging hop does, lengths and checksums fixed, the ID recorded
  in the agent's ring; `ring_cost`'s `floor` recorder at host-a's veth (the ID read, the clock, a ring
  record);
- `tag_all`: hoptrace, every datagram tagged at c1's eth0 and recorded at both hops;
- with `--conditions`, any other of tcp_overhead's (`empty`, `floor_ring`: the floor without the growth).

Prints each condition's ratio to untraced and `tag_all over floor_tag` paired round by round (95 % bootstrap
intervals); `--perf COND` profiles that condition's first run (`perf record -a -g`); `--bpf-stats` logs each
program's ns per run in place (the least tagger's `least_tagger` beside hoptrace's tagging hop).

    .venv/bin/python bench/udp_tag_floor.py --rounds 8 --seconds 5 [--conditions floor_tag,tag_all] \\
        [--perf tag_all] [--bpf-stats]
"""

from __future__ import annotations

import argparse
import sys

from tcp_overhead import CONDITIONS, run

DEFAULT = "floor_tag,tag_all"


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
    args = ap.parse_args()
    conditions = ["none"] + [c for c in args.conditions.split(",") if c and c != "none"]
    unknown = [c for c in conditions if c not in CONDITIONS]
    if unknown:
        ap.error(f"unknown conditions {unknown}: choose from {', '.join(CONDITIONS)}")
    run(args.rounds, args.seconds, args.perf, conditions, "veth", True, args.bpf_stats, (0, 1), None, True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
