"""Hop actions: kernel run time per packet of the tc hop with each action, side by side with the
timestamp-only hop.

Runs agent/internal/loader's BenchmarkActionCost: six hop programs loaded from the one object with the same
ring buffer and maps (timestamp only; count; count by cpu; count by mark; histogram of len; histogram of the
latency from an earlier hop on the node), each run with BPF_PROG_TEST_RUN on one tagged UDP packet in rounds
of 1000 repeats, the hops' order rotating each round. A hop's cost is the median over rounds of its
bpf_stats growth (run_time_ns / run_cnt, enabled with BPF_ENABLE_STATS for the run's duration). Every run
writes its record to the ring buffer (drained between rounds), as a traced packet does. The machine's load
average is recorded beside the numbers: the ratios to the timestamp hop, measured in the same rounds, are
what carries over to another machine.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from common import BenchContext, log, target

AGENT = Path(__file__).resolve().parents[1] / "agent"
BASELINE = "timestamp"
HOPS = (
    "timestamp",
    "count",
    "count_by_cpu",
    "count_by_mark",
    "histogram_len",
    "histogram_latency",
    "non_matching",
    "empty",
)
# Timed again by the test run's own clock, bpf_stats off.
TESTRUN_HOPS = ("timestamp", "non_matching", "empty")
LABELS = {
    "timestamp": "timestamp only (the default hop)",
    "count": "count",
    "count_by_cpu": "count by cpu",
    "count_by_mark": "count by mark",
    "histogram_len": "histogram: len",
    "histogram_latency": "histogram: latency",
    "non_matching": "a packet the filter does not match (parsed, no record)",
    "empty": "an empty tc program (returns at once: the measurement's own cost)",
}
_METRIC = re.compile(r"([\d.]+) (\w+)-ns/pkt")


def parse_benchmark(output: str) -> dict[str, float]:
    """Hop -> ns per packet from `go test -bench BenchmarkActionCost` output."""
    line = next((line for line in output.splitlines() if line.startswith("BenchmarkActionCost")), "")
    found = {name: float(value) for value, name in _METRIC.findall(line)}
    missing = set(HOPS) | {f"{hop}_testrun" for hop in TESTRUN_HOPS}
    missing -= set(found)
    if missing:
        raise RuntimeError(f"BenchmarkActionCost: no result for {sorted(missing)} in:\n{output[-2000:]}")
    return found


def run(ctx: BenchContext) -> dict[str, Any]:
    """ns per packet of each hop, its ratio to the timestamp hop, and the load it was measured under."""
    rounds = ctx.size(30, 1000)
    load_before = os.getloadavg()
    done = subprocess.run(
        [
            "go",
            "test",
            "-run",
            "^$",
            "-bench",
            "^BenchmarkActionCost$",
            f"-benchtime={rounds}x",
            "./internal/loader",
        ],
        cwd=AGENT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"go test -bench BenchmarkActionCost failed:\n{done.stdout[-3000:]}{done.stderr[-2000:]}"
        )
    ns = parse_benchmark(done.stdout)
    load_after = os.getloadavg()
    base = ns[BASELINE]
    results: dict[str, Any] = {
        "rounds": rounds,
        "repeats_per_round": 1000,
        "cores": os.cpu_count(),
        "loadavg_1m": [load_before[0], load_after[0]],
        "ns_per_packet": {hop: ns[hop] for hop in HOPS},
        "testrun_ns_per_packet": {hop: ns[f"{hop}_testrun"] for hop in TESTRUN_HOPS},
        "ratio_to_timestamp": {hop: ns[hop] / base for hop in HOPS},
    }
    # The per-packet BPF targets, without the path's cold caches (bpf_cost.py measures them in place):
    # as measured, and above the empty program (what hoptrace's program adds to running any program there).
    empty, empty_testrun = ns["empty"], ns["empty_testrun"]
    results["targets"] = [
        target("BPF per traced packet per hop, PROG_TEST_RUN (timestamp hop)", ns[BASELINE], 100, "ns"),
        target("BPF per non-matching packet, PROG_TEST_RUN", ns["non_matching"], 20, "ns"),
        target("same, traced, above an empty program (bpf_stats)", ns[BASELINE] - empty, 100, "ns"),
        target(
            "same, non-matching, above an empty program (bpf_stats)", ns["non_matching"] - empty, 20, "ns"
        ),
        target(
            "same, traced, above an empty program (test run's clock)",
            ns["timestamp_testrun"] - empty_testrun,
            100,
            "ns",
        ),
        target(
            "same, non-matching, above an empty program (test run's clock)",
            ns["non_matching_testrun"] - empty_testrun,
            20,
            "ns",
        ),
    ]
    log("action_cost: " + ", ".join(f"{hop} {ns[hop]:.1f} ns" for hop in HOPS))
    results["table"] = {
        "columns": ["hop actions (tc hop, BPF_PROG_TEST_RUN)", "ns per packet", "× timestamp hop", "+ns"],
        "rows": [[LABELS[hop], ns[hop], ns[hop] / base, ns[hop] - base] for hop in HOPS],
        "note": f"median of {rounds} rounds of 1000 runs each, hops interleaved; "
        "bpf_stats run_time_ns/run_cnt; "
        f"load average {load_before[0]:.1f} -> {load_after[0]:.1f} on {os.cpu_count()} cores; "
        "by the test run's own clock (bpf_stats off): "
        + ", ".join(f"{hop} {ns[f'{hop}_testrun']:.0f} ns" for hop in TESTRUN_HOPS),
    }
    return results


def main() -> int:
    """`python bench/action_cost.py [--full]`: run alone and print the table."""
    ctx = BenchContext(quick="--full" not in sys.argv)
    try:
        result = run(ctx)
    finally:
        ctx.close()
    print("| " + " | ".join(result["table"]["columns"]) + " |\n|---|---|---|---|")
    for label, ns, ratio, extra in result["table"]["rows"]:
        print(f"| {label} | {ns:.1f} | {ratio:.2f} | {extra:+.1f} |")
    print(f"\n{result['table']['note']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
