"""MACE's evaluation here: container, MACE-corrected and host RTT, idle and with a flooding neighbour.

On the routed TwoHostTopology, c1 and host-a ping host-b in turn (600 echoes each, 2 ms apart) while
``hoptrace mace`` (inner-dev by default) traces c1; the "flood" rounds add a container c3 on host-a's bridge
sending 20 k UDP datagrams/s to host-b. Means over the central 98 % of echoes (as tests/presets/test_mace.py),
``--rounds`` times each; the gap is corrected - host (MACE's published bound: 20 µs).

    sudo .venv/bin/python bench/mace_rtt.py [--rounds 3] [--path inner-dev] [--json]
"""

from __future__ import annotations

import argparse
import json
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

from hoptrace.cli import mace
from hoptrace.lab import flood as flood_script
from hoptrace.lab.topology import TwoHostTopology, add_container

REPO = Path(__file__).resolve().parents[1]

FLOOD = Path(flood_script.__file__)  # run in a container namespace


def trimmed_mean(values: list[float], trim: float = 0.01) -> float:
    """Mean without the lowest and highest ``trim`` fraction."""
    ordered = sorted(values)
    cut = int(len(ordered) * trim)
    kept = ordered[cut : len(ordered) - cut] if cut else ordered
    return sum(kept) / len(kept)


def one_round(topo: TwoHostTopology, path: str, count: int) -> dict[str, float]:
    """One interleaved container/host ping under MACE: trimmed means in µs."""
    parser = argparse.ArgumentParser()
    mace.add_parser(parser.add_subparsers())
    args = parser.parse_args(
        [
            *("mace", "--container", topo.c1, "--host-netns", topo.host_a, "--path", path),
            *("--ping", topo.addr("host-b"), "--count", str(count), "--interval", "0.002"),
            "--compare-host",
        ]
    )
    report = mace.run(args)
    echoes = report["ping"]["echoes"]
    out = {
        "container_us": trimmed_mean([e["rtt_ns"] for e in echoes]) / 1e3,
        "corrected_us": trimmed_mean([e["corrected_ns"] for e in echoes]) / 1e3,
        "host_us": trimmed_mean([float(r) for r in report["ping"]["host_rtts"]]) / 1e3,
        "correction_us": trimmed_mean([e["correction_ns"] for e in echoes]) / 1e3,
        "echoes": len(echoes),
        "egress_coverage": report["summary"]["egress"]["coverage"],
        "ingress_coverage": report["summary"]["ingress"]["coverage"],
    }
    out["gap_us"] = out["corrected_us"] - out["host_us"]
    return out


def run(rounds: int = 3, path: str = "inner-dev", count: int = 600) -> dict[str, list[dict[str, float]]]:
    """Idle and flooding rounds on a fresh routed topology; everything is removed afterwards."""
    prefix = "mr" + secrets.token_hex(2)
    results: dict[str, list[dict[str, float]]] = {"idle": [], "flood": []}
    with TwoHostTopology(prefix, overlay="routed") as topo:
        c3 = add_container(topo, "c3", "198.18.1.3", "02:00:c6:12:01:03")
        try:
            for _ in range(rounds):
                results["idle"].append(one_round(topo, path, count))
                flood = subprocess.Popen(
                    [
                        *("ip", "netns", "exec", c3, sys.executable, str(FLOOD)),
                        *(topo.addr("host-b"), "9", "20000", "1000", "60"),
                    ],
                    stdout=subprocess.DEVNULL,
                )
                try:
                    results["flood"].append(one_round(topo, path, count))
                finally:
                    flood.kill()
                    flood.wait()
        finally:
            subprocess.run(["ip", "netns", "del", c3], check=False)
    return results


def format_table(results: dict[str, Any]) -> str:
    """A markdown table, one row per round."""
    lines = [
        "| case | round | container µs | correction µs | corrected µs | host µs | gap µs | coverage eg/in |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for case, rows in results.items():
        for i, r in enumerate(rows, 1):
            lines.append(
                f"| {case} | {i} | {r['container_us']:.1f} | {r['correction_us']:.1f} | "
                f"{r['corrected_us']:.1f} | {r['host_us']:.1f} | {r['gap_us']:+.1f} | "
                f"{r['egress_coverage'] * 100:.1f} / {r['ingress_coverage'] * 100:.1f} % |"
            )
    return "\n".join(lines)


def main() -> int:
    """Command line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--path", choices=mace.PATHS, default="inner-dev")
    parser.add_argument("--count", type=int, default=600)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = run(args.rounds, args.path, args.count)
    print(json.dumps(results, indent=2) if args.json else format_table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
