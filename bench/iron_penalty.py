"""Iron's penalty-factor experiment on this machine, with hoptrace's accounting of the same runs.

A CPU-bound victim (netns ``{prefix}-victim``) shares CPU 1 with either a network-heavy neighbour (an iperf3
receiver in netns ``{prefix}-nbr``, fed over a veth by an iperf3 sender on CPU 0, RPS steering the
receive softirq to CPU 1) or a CPU-bound neighbour. Penalty factor (Iron) = victim's time with the traffic
neighbour / its time with the CPU neighbour. ``hoptrace iron`` runs during the traffic case and shows the
neighbour's softirq time charged to the victim.

    sudo .venv/bin/python bench/iron_penalty.py [--work N] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

from hoptrace.cli.iron import run_iron

VICTIM_CPU = "1"
SENDER_CPU = "0"
SPIN = "import sys\nn=int(sys.argv[1])\nx=0\nfor i in range(n): x+=i*i\n"


def sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run a command, text output."""
    return subprocess.run(cmd, check=check, capture_output=True, text=True)


@contextlib.contextmanager
def testbed(prefix: str) -> Iterator[dict[str, str]]:
    """Namespaces src -- nbr (veth, 198.18.60.0/24) and victim; removed on exit whatever happened."""
    names = {role: f"{prefix}-{role}" for role in ("src", "nbr", "victim", "cpu")}
    try:
        for ns in names.values():
            sh("ip", "netns", "add", ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        sh(
            "ip",
            "-n",
            names["src"],
            "link",
            "add",
            "eth0",
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            names["nbr"],
        )
        for ns, addr in ((names["src"], "198.18.60.1/24"), (names["nbr"], "198.18.60.2/24")):
            sh("ip", "-n", ns, "addr", "add", addr, "dev", "eth0")
            sh("ip", "-n", ns, "link", "set", "eth0", "up")
        # RPS: the receiver's softirq runs on the victim's CPU, whoever the sender is (Iron's setting: the
        # NIC's interrupt lands on the core the victim and the receiver share).
        sh(
            "ip",
            "netns",
            "exec",
            names["nbr"],
            "sh",
            "-c",
            f"echo {1 << int(VICTIM_CPU):x} > /sys/class/net/eth0/queues/rx-0/rps_cpus",
        )
        yield names
    finally:
        for ns in names.values():
            sh("ip", "netns", "del", ns, check=False)


def timed_victim(ns: str, work: int) -> float:
    """Seconds the victim needs for ``work`` iterations, pinned to the shared CPU."""
    start = time.monotonic()
    sh("ip", "netns", "exec", ns, "taskset", "-c", VICTIM_CPU, sys.executable, "-c", SPIN, str(work))
    return time.monotonic() - start


@contextlib.contextmanager
def traffic_neighbour(names: dict[str, str]) -> Iterator[None]:
    """iperf3 receiver in nbr on the shared CPU, sender in src on the other CPU."""
    server = subprocess.Popen(
        ["ip", "netns", "exec", names["nbr"], "taskset", "-c", VICTIM_CPU, "iperf3", "-s", "-1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(0.5)
    client = subprocess.Popen(
        [
            "ip",
            "netns",
            "exec",
            names["src"],
            "taskset",
            "-c",
            SENDER_CPU,
            "iperf3",
            "-c",
            "198.18.60.2",
            "-t",
            "600",
            "-u",
            "-b",
            "0",
            "-l",
            "1400",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        time.sleep(1.0)
        yield
    finally:
        for proc in (client, server):
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def cpu_neighbour(names: dict[str, str]) -> Iterator[None]:
    """A CPU-bound process in netns cpu on the shared CPU."""
    proc = subprocess.Popen(
        [
            "ip",
            "netns",
            "exec",
            names["cpu"],
            "taskset",
            "-c",
            VICTIM_CPU,
            sys.executable,
            "-c",
            SPIN,
            str(10**12),
        ]
    )
    try:
        time.sleep(0.5)
        yield
    finally:
        proc.kill()
        proc.wait()


def experiment(work: int) -> dict[str, Any]:
    """Both runs and the accounting of the traffic run."""
    with testbed("hi" + secrets.token_hex(2)) as names:
        with cpu_neighbour(names):
            t_cpu = timed_victim(names["victim"], work)
        account: dict[str, Any] = {}
        with traffic_neighbour(names):
            acct_thread = threading.Thread(target=lambda: account.update(run_iron(t_cpu + 2)))
            acct_thread.start()
            time.sleep(0.5)
            t_net = timed_victim(names["victim"], work)
            acct_thread.join()
        by_name = {c["container"]: c for c in account.get("containers", [])}
        return {
            "victim_s_with_cpu_neighbour": t_cpu,
            "victim_s_with_traffic_neighbour": t_net,
            "penalty_factor": t_net / t_cpu,
            "victim": by_name.get(names["victim"]),
            "neighbour": by_name.get(names["nbr"]),
            "sender": by_name.get(names["src"]),
            "accounting_seconds": account.get("summary", {}).get("seconds"),
        }


def main() -> int:
    """Run and print the experiment."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=int, default=30_000_000, help="victim loop iterations")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = experiment(args.work)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"victim with a CPU neighbour:     {result['victim_s_with_cpu_neighbour']:.2f} s")
    print(f"victim with a traffic neighbour: {result['victim_s_with_traffic_neighbour']:.2f} s")
    print(f"penalty factor:                  {result['penalty_factor']:.2f}")
    for role in ("victim", "neighbour", "sender"):
        c = result[role] or {}
        print(
            f"{role:<10} caused {c.get('caused_ns', 0) / 1e6:8.1f} ms"
            f"  charged {c.get('charged_ns', 0) / 1e6:8.1f} ms"
            f"  diff {c.get('diff_ns', 0) / 1e6:8.1f} ms"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
