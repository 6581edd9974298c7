"""vNetTracer case study 2, scheduling delay: a latency-sensitive receiver shares its CPU with a busy loop.

A sockperf UDP ping-pong c1 -> c2 at a low rate; the sockperf server in c2 is pinned to CPU 1 (taskset), the
client to CPU 0. Cases: the server alone on CPU 1; a busy loop (``sh -c 'while :; do :; done'``, pinned to
CPU 1 too) beside it; the same busy loop under SCHED_IDLE (``chrt -i 0``), the Linux counterpart of
vNetTracer's fix (there: Xen credit2's rate limit set to 0).

Three tracers per case on the routed TwoHostTopology:
- the hoptrace trace ``sd-<case>`` (hops of examples/case-studies/scheduling-delay.yaml, c1 eth0 -> c2 eth0
  -> the server's receive call, a socket-read hop): the device path, which the CPU-bound task should not
  change, and c2 eth0 -> socket-read, which holds the scheduling delay;
- ``hoptrace mace --container <c2> --path syscalls`` on host-b (ingress: host-b wire0 ``netif_receive_skb``
  -> the server's ``recv*`` exit; egress: the reply's ``sendto`` -> wire0 ``net_dev_xmit``). Its ingress
  side sees no sockperf datagram: UDP copies a linear datagram with ``copy_linear_skb``, which does not fire
  ``net:skb_copy_datagram_iovec`` (the event MACE ties a packet to the receiving thread with);
- the hoptrace events ``sd-<case>-sched`` (applied once the server listens, with its pid): its wake-ups
  (``sched:sched_wakeup``, key pid) and its switch-ins (``sched:sched_switch``, key next_pid) with
  ``histogram: latency, since: wakeup``, the wake-up -> on CPU time as a log2 histogram in the kernel;
- and, to check both, the device -> socket time from a bpftrace timeline (``RX_TIMELINE``): host-b wire0
  ``netif_receive_skb`` of the request -> ``sched_wakeup`` of the server -> ``sched_switch`` to it ->
  its ``recvfrom``/``recvmsg`` exit. One request is in flight at a time (ping-pong), so events pair by order.

Writes bench/results/<time>-scheduling-delay.png (device -> socket time over time, per case) and
<time>-scheduling-delay.json (everything, with the per-packet series).

    sudo .venv/bin/python bench/case_scheduling_delay.py [--seconds 5] [--mps 500] [--case NAME ...] [--json]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from case_common import (
    REPO,
    SOCKPERF_PORT,
    TwoHostTopology,
    report,
    require_root,
    sockperf,
    spec,
    traced_topology,
)
from case_congested_bridge import HOPS as DEVICE_HOPS  # the same c1 -> c2 path on the routed topology

from hoptrace.cli.mace import mace_agent
from hoptrace.spec import spec_from_data
from hoptrace.v1 import trace_pb2

# ... and then the server's receive call in c2: the device -> application time with hoptrace alone.
READ_HOP = "b-c2-read"
HOPS = [*DEVICE_HOPS, (READ_HOP, "host-b", "socket-read", "", "{c2}")]

RESULTS = REPO / "bench" / "results"
SERVER_CPU = "1"
CLIENT_CPU = "0"
BUSY_LOOP = ("sh", "-c", "while :; do :; done")

# (case, command that runs the CPU-bound task on the server's CPU, or None for no such task)
CASES: list[tuple[str, tuple[str, ...] | None]] = [
    ("alone", None),
    ("cpu-shared", ("taskset", "-c", SERVER_CPU, *BUSY_LOOP)),
    ("cpu-shared-nice-10", ("nice", "-n", "-10", "taskset", "-c", SERVER_CPU, *BUSY_LOOP)),
    ("cpu-shared-sched-idle", ("chrt", "-i", "0", "taskset", "-c", SERVER_CPU, *BUSY_LOOP)),
]
SPIKE_NS = 100_000  # a device -> socket time above this is a scheduling delay, not the stack

# One line per request: wire0 rx, server woken, server switched in (0: neither happened after the rx, the
# server was already running), recv* exit, CPU, and the task the server was switched in after (meaningful
# only with a switch-in: the task that held the CPU while the server waited). The request is the sockperf
# datagram to c2 (IPv4 daddr and UDP dport compared in network byte order, read as little-endian
# integers); skb->data is the IP header at netif_receive_skb (eth_type_trans pulled the Ethernet header).
# The server's thread id comes from its own recv* exits, so its first request has no wakeup time.
RX_TIMELINE = """
tracepoint:net:netif_receive_skb
{
  $skb = (struct sk_buff *)args->skbaddr;
  if ($skb->dev->ifindex == WIRE_IFINDEX && $skb->dev->nd_net.net->ns.inum == HOST_NETNS_INO &&
      $skb->protocol == 0x0008) {
    $ip = (struct iphdr *)$skb->data;
    $udp = (struct udphdr *)($skb->data + 20);
    if ($ip->protocol == 17 && $ip->daddr == DADDR && $udp->dest == DPORT) {
      @rx = nsecs; @wk = 0; @on = 0;
    }
  }
}
tracepoint:sched:sched_wakeup /@rx && @wk == 0 && args->pid == @srv/ { @wk = nsecs; }
tracepoint:sched:sched_switch /@rx && @on == 0 && args->next_pid == @srv/
{
  @on = nsecs; @prev = args->prev_comm;
}
tracepoint:syscalls:sys_exit_recvfrom, tracepoint:syscalls:sys_exit_recvmsg
/args->ret > 0 && comm == "sockperf" && curtask->nsproxy->net_ns->ns.inum == C2_NETNS_INO/
{
  @srv = tid;
  if (@rx) { printf("rx %llu %llu %llu %llu %d %s\\n", @rx, @wk, @on, nsecs, cpu, @prev); @rx = 0; }
}
"""


def _le(value: bytes) -> int:
    """Network-order bytes as the little-endian integer a BPF load of them gives (x86, arm64)."""
    return int.from_bytes(value, "little")


@contextlib.contextmanager
def rx_timeline(topo: TwoHostTopology) -> Iterator[list[dict[str, Any]]]:
    """bpftrace running RX_TIMELINE for requests to c2; the list fills with one dict per request on exit."""
    program = (
        RX_TIMELINE.replace("WIRE_IFINDEX", str(topo.ifindex("host-b", "wire0")))
        .replace("HOST_NETNS_INO", str(topo.netns_inode("host-b")))
        .replace("C2_NETNS_INO", str(topo.netns_inode("c2")))
        .replace("DADDR", str(_le(socket.inet_aton(topo.addr("c2")))))
        .replace("DPORT", str(_le(SOCKPERF_PORT.to_bytes(2, "big"))))
    )
    proc = subprocess.Popen(
        ["bpftrace", "-e", program], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    lines: list[str] = []
    attached = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("Attaching"):
                attached.set()
            lines.append(line)
        attached.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    out: list[dict[str, Any]] = []
    try:
        if not attached.wait(60) or proc.poll() is not None:
            raise RuntimeError(f"bpftrace did not attach: {proc.stderr.read() if proc.stderr else ''}")
        yield out
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        reader.join(5)
        for line in lines:
            if not line.startswith("rx "):
                continue
            fields = line.split(maxsplit=6)
            rx, wake, oncpu, exit_, cpu = (int(x) for x in fields[1:6])
            prev = fields[6].strip() if oncpu and len(fields) > 6 else ""
            out.append({"rx": rx, "wake": wake, "oncpu": oncpu, "exit": exit_, "cpu": cpu, "prev": prev})


def decompose(requests: list[dict[str, Any]]) -> list[dict[str, float]]:
    """Per request (time order): seconds since the first, total and its parts in ns.

    rx_to_wake: host-b wire0 -> the server woken (the device path to the socket, then the wakeup);
    wake_to_oncpu: run-queue wait; oncpu_to_exit: epoll_wait return, recv*. Without a wakeup (the server was
    runnable already) the run-queue wait is from the rx; without a switch-in it was on the CPU already.
    """
    rows = []
    requests = sorted(requests, key=lambda r: r["rx"])
    t0 = requests[0]["rx"] if requests else 0
    for r in requests:
        wake = r["wake"] or r["rx"]
        oncpu = r["oncpu"] or wake
        if not r["rx"] <= wake <= oncpu <= r["exit"]:
            continue  # a wakeup or switch-in of an earlier request that raced the rx: no clean split
        rows.append(
            {
                "t_s": (r["rx"] - t0) / 1e9,
                "total_ns": r["exit"] - r["rx"],
                "rx_to_wake_ns": wake - r["rx"],
                "wake_to_oncpu_ns": oncpu - wake,
                "oncpu_to_exit_ns": r["exit"] - oncpu,
                "woken": bool(r["wake"]),
                "prev": r["prev"],
            }
        )
    return rows


def stats(values: list[float]) -> dict[str, float]:
    """count, mean, p50, p90, p95, p99, max (nearest rank) in µs."""
    if not values:
        return {
            "count": 0,
            "mean_us": 0.0,
            "p50_us": 0.0,
            "p90_us": 0.0,
            "p95_us": 0.0,
            "p99_us": 0.0,
            "max_us": 0.0,
        }
    ordered = sorted(values)

    def rank(p: float) -> float:
        return ordered[min(len(ordered), max(1, -(-len(ordered) * p // 100))) - 1] / 1e3

    return {
        "count": len(ordered),
        "mean_us": statistics.fmean(ordered) / 1e3,
        **{f"p{p}_us": rank(p) for p in (50, 90, 95, 99)},
        "max_us": ordered[-1] / 1e3,
    }


def spikes(rows: list[dict[str, float]]) -> dict[str, Any]:
    """Runs of consecutive requests above SPIKE_NS: how many, how long, how far apart (the period)."""
    runs: list[list[dict[str, float]]] = []
    current: list[dict[str, float]] = []
    for row in rows:
        if row["total_ns"] > SPIKE_NS:
            current.append(row)
        elif current:
            runs.append(current)
            current = []
    if current:
        runs.append(current)
    starts = [run[0]["t_s"] for run in runs]
    peaks = [max(x["total_ns"] for x in run) for run in runs]
    gaps = [b - a for a, b in zip(starts, starts[1:], strict=False)]
    return {
        "requests_over": sum(len(r) for r in runs),
        "runs": len(runs),
        "run_length_mean": statistics.fmean(len(r) for r in runs) if runs else 0.0,
        "run_peak_us_mean": statistics.fmean(peaks) / 1e3 if peaks else 0.0,
        "period_ms_median": statistics.median(gaps) * 1e3 if gaps else 0.0,
    }


def waited_behind(rows: list[dict[str, Any]]) -> dict[str, int]:
    """Requests whose run-queue wait exceeded SPIKE_NS: the task that ran before the server, how often."""
    counts = collections.Counter(r["prev"] or "?" for r in rows if r["wake_to_oncpu_ns"] > SPIKE_NS)
    return dict(counts.most_common(6))


def sched_spec(name: str, pid: int) -> trace_pb2.TraceSpec:
    """Event probes of one task on host-b: its wake-ups and its switch-ins, with the time between them."""
    return spec_from_data(
        {
            "name": name,
            "events": [
                {"name": "wakeup", "node": "host-b", "tracepoint": "sched:sched_wakeup",
                 "where": f"pid == {pid}", "key": "pid"},
                {"name": "run", "node": "host-b", "tracepoint": "sched:sched_switch",
                 "where": f"next_pid == {pid}", "key": "next_pid",
                 "actions": ["count", {"histogram": "latency", "since": "wakeup"}]},
            ],
        }
    )  # fmt: skip


def histogram_stats(buckets: list[dict[str, int]]) -> dict[str, Any]:
    """Count and quantiles of a log2 histogram (each quantile as its bucket's upper bound, in µs), and how
    many values are 1 ms or more (buckets from [2^20, 2^21 - 1] ns up: 1.05 ms)."""
    total = sum(b["count"] for b in buckets)
    out: dict[str, Any] = {
        "count": total,
        "over_1ms": sum(b["count"] for b in buckets if b["le"] >= (1 << 21) - 1),
    }
    for q in (0.5, 0.9, 0.99):
        seen = 0
        for b in sorted(buckets, key=lambda b: b["le"]):
            seen += b["count"]
            if seen >= q * total:
                out[f"p{round(q * 100)}_le_us"] = b["le"] / 1e3
                break
    return out


def sched_events(cluster: Any, name: str, timeout_s: float = 15) -> dict[str, Any]:
    """The wake-up -> run histogram of `name`'s events once two reports a second apart agree (the agents
    send event results every second)."""
    deadline = time.monotonic() + timeout_s
    previous = None
    while True:
        data = json.loads(cluster.hoptrace("report", name, "--since", "10m", "--json").stdout)
        events = {e["name"]: e for e in data.get("events", [])}
        run = events.get("run", {"count": 0, "histogram": [], "latency_missed": 0})
        current = (run["count"], sum(b["count"] for b in run["histogram"]))
        if current == previous or time.monotonic() > deadline:
            return {
                "wakeups": events.get("wakeup", {}).get("count", 0),
                "runs": run["count"],
                "missed": run.get("latency_missed", 0),
                "latency": histogram_stats(run["histogram"]),
                "histogram": run["histogram"],
            }
        previous = current
        time.sleep(1)


def mace_args(topo: TwoHostTopology) -> list[str]:
    """``hoptrace-agent mace`` arguments: c2 on host-b, syscall path, every packet."""
    return [
        *("--container", topo.c2, "--path", "syscalls", "--host-netns", topo.host_b),
        *("--peer", topo.addr("c1")),
    ]


def run(seconds: float = 5, mps: int = 500, cases: list[str] | None = None) -> list[dict[str, Any]]:
    """The `cases` (default: every one of CASES) in turn on one routed topology: sockperf, the trace report,
    MACE and the rx timeline."""
    results = []
    # Everything started from here inherits CPU 0 (cluster, InfluxDB, bpftrace, MACE, the client): CPU 1 is
    # left to the server and the CPU-bound task, which taskset puts there.
    affinity = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {int(CLIENT_CPU)})
    try:
        selected = [(case, hog) for case, hog in CASES if cases is None or case in cases]
        return _run_cases(seconds, mps, selected, results)
    finally:
        os.sched_setaffinity(0, affinity)


def _run_cases(
    seconds: float,
    mps: int,
    cases: list[tuple[str, tuple[str, ...] | None]],
    results: list[dict[str, Any]],
) -> list[dict[str, Any]]:
    with traced_topology("routed") as (topo, cluster):
        hops = [(n, node, at, dev, ns.format(c1=topo.c1, c2=topo.c2)) for n, node, at, dev, ns in HOPS]
        for case, hog_cmd in cases:
            name = f"sd-{case}"
            cluster.apply(spec(name, topo, hops))
            sched_name = f"{name}-sched"
            hog = topo.popen("c2", *hog_cmd) if hog_cmd else None
            try:
                with rx_timeline(topo) as requests, mace_agent(mace_args(topo)) as agent:
                    app = sockperf(
                        topo, seconds, mps,
                        server_prefix=("taskset", "-c", SERVER_CPU),
                        client_prefix=("taskset", "-c", CLIENT_CPU),
                        on_server_up=lambda pid, n=sched_name: cluster.apply(sched_spec(n, pid)),
                    )  # fmt: skip
                    summary = agent.stop()
            finally:
                if hog is not None:
                    hog.terminate()
                    hog.wait(5)
            rows = decompose(requests)
            results.append(
                {
                    "case": case,
                    "cpu_task": " ".join(hog_cmd) if hog_cmd else None,
                    "sockperf": app,
                    "mace": {"ingress": summary["ingress"], "egress": summary["egress"]},
                    "device_to_socket": {
                        "total": stats([r["total_ns"] for r in rows]),
                        "rx_to_wake": stats([r["rx_to_wake_ns"] for r in rows]),
                        "wake_to_oncpu": stats([r["wake_to_oncpu_ns"] for r in rows]),
                        "oncpu_to_exit": stats([r["oncpu_to_exit_ns"] for r in rows]),
                        "woken": sum(r["woken"] for r in rows),
                        "spikes": spikes(rows),
                        "long_waits_behind": waited_behind(rows),
                    },
                    "report": report(cluster, name, app),
                    "sched_events": sched_events(cluster, sched_name),
                    "series": rows,
                }
            )
    return results


def plot(results: list[dict[str, Any]], path: Path) -> None:
    """Device -> socket time of every request over time, one row per case: the whole run, then 100 ms."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(results), 2, figsize=(12, 2.6 * len(results)), squeeze=False)
    for (full, zoom), r in zip(axes, results, strict=True):
        xs = [row["t_s"] for row in r["series"]]
        ys = [row["total_ns"] / 1e3 for row in r["series"]]
        full.plot(xs, ys, ".", markersize=2)
        full.set_yscale("log")
        full.set_ylabel("µs")
        full.set_title(f"{r['case']}: host-b wire0 rx -> server recv exit", fontsize=9)
        mid = xs[len(xs) // 2] if xs else 0.0
        window = [(t, y) for t, y in zip(xs, ys, strict=True) if mid <= t < mid + 0.1]
        zoom.plot([t for t, _ in window], [y for _, y in window], ".-", markersize=3, linewidth=0.5)
        zoom.set_ylabel("µs")
        zoom.set_title(f"{r['case']}: 100 ms of it, request by request", fontsize=9)
    for ax in axes[-1]:
        ax.set_xlabel("s since the first request")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _st(s: dict[str, float]) -> str:
    return " / ".join(f"{s[k]:.0f}" for k in ("mean_us", "p50_us", "p90_us", "p99_us"))


def table(results: list[dict[str, Any]]) -> str:
    """Markdown tables: sockperf and the device -> socket decomposition; MACE and the hoptrace device path."""
    rows = [
        "| case | sockperf avg / p50 / p99 / p99.9 µs | wire0 rx → recv exit | rx → wakeup | wakeup → on CPU "
        "| on CPU → recv exit | requests > 100 µs (runs, median period) | long waits behind (top 3) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        s, d = r["sockperf"], r["device_to_socket"]
        sp = d["spikes"]
        rows.append(
            f"| {r['case']} "
            f"| {s.get('avg_us', 0):.1f} / {s.get('p50.000_us', 0):.1f} / {s.get('p99.000_us', 0):.1f}"
            f" / {s.get('p99.900_us', 0):.1f} "
            f"| {_st(d['total'])} | {_st(d['rx_to_wake'])} | {_st(d['wake_to_oncpu'])} "
            f"| {_st(d['oncpu_to_exit'])} "
            f"| {sp['requests_over']} of {d['total']['count']}"
            f" ({sp['runs']}, {sp['period_ms_median']:.1f} ms) "
            f"| {', '.join(f'{k} {v}' for k, v in list(d['long_waits_behind'].items())[:3])} |"
        )
    rows += [
        "",
        "| case | hoptrace c1 eth0 → c2 socket-read mean / p99 µs (complete / packets) "
        "| MACE syscalls ingress seen / reported | MACE egress sendto → wire0 xmit mean / p99 µs (count) |",
        "|---|---|---|---|",
    ]
    for r in results:
        rep, ing, eg = r["report"], r["mace"]["ingress"], r["mace"]["egress"]
        e2e = rep["end_to_end"]
        rows.append(
            f"| {r['case']} | {e2e['mean_ns'] / 1e3:.1f} / {e2e['p99_ns'] / 1e3:.1f}"
            f" ({rep['complete']} / {rep['packets']}) | {ing['seen']} / {ing['reported']} "
            f"| {eg['mean_ns'] / 1e3:.1f} / {eg['p99_ns'] / 1e3:.1f} ({eg['count']}) |"
        )
    rows += [
        "",
        "| case | hoptrace c2 eth0 → socket-read (the server's receive) mean / p50 / p90 / p99 µs (count) "
        "| bpftrace wire0 rx → recv exit mean / p50 / p90 / p99 µs |",
        "|---|---|---|",
    ]
    for r in results:
        read = next(g for g in r["report"]["segments"] if g["to"] == READ_HOP)
        rows.append(
            f"| {r['case']} | "
            + " / ".join(f"{read[k] / 1e3:.1f}" for k in ("mean_ns", "p50_ns", "p90_ns", "p99_ns"))
            + f" ({read['count']}) | {_st(r['device_to_socket']['total'])} |"
        )
    rows += [
        "",
        "| case | hoptrace events: wake-up → run, p50 / p90 / p99 bucket ≤ µs (latencies, ≥ 1 ms; missed) "
        "| bpftrace wakeup → on CPU mean / p50 / p90 / p99 µs (woken requests) |",
        "|---|---|---|",
    ]
    for r in results:
        ev = r["sched_events"]
        lat = ev["latency"]
        quantiles = " / ".join(f"{lat.get(k, 0):.0f}" for k in ("p50_le_us", "p90_le_us", "p99_le_us"))
        rows.append(
            f"| {r['case']} | {quantiles} ({lat['count']}, {lat['over_1ms']}; {ev['missed']}) "
            f"| {_st(r['device_to_socket']['wake_to_oncpu'])} ({r['device_to_socket']['woken']}) |"
        )
    return "\n".join(rows)


def main() -> int:
    """Command line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5, help="sockperf run per case (default 5)")
    parser.add_argument("--mps", type=int, default=500, help="sockperf messages per second (default 500)")
    parser.add_argument(
        "--case",
        action="append",
        choices=[case for case, _ in CASES],
        help="run this case only (repeatable; default: every case)",
    )
    parser.add_argument("--json", action="store_true", help="print everything as JSON instead of the tables")
    args = parser.parse_args()
    require_root()
    for tool in ("sockperf", "taskset", "chrt", "bpftrace"):
        if shutil.which(tool) is None:
            sys.exit(f"{tool} is missing: run make setup")
    results = run(args.seconds, args.mps, args.case)
    RESULTS.mkdir(exist_ok=True)
    stem = RESULTS / (datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ") + "-scheduling-delay")
    stem.with_suffix(".json").write_text(json.dumps(results, indent=1))
    plot(results, stem.with_suffix(".png"))
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print(table(results))
        for r in results:
            d = r["device_to_socket"]
            print(f"{r['case']}: spikes {json.dumps(d['spikes'])}; waited behind {d['long_waits_behind']}")
        print(f"wrote {stem}.png and {stem}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
