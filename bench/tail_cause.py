"""Where the ping-pong's p99.9 goes under tracing: one experiment per suspect, side by side.

sockperf UDP ping-pong c1 -> c2 over the reference VXLAN path (8 hops), conditions interleaved in rounds
(order rotated), each ratio over the same round's `none` (a `_pin0` condition's over `none_pin0`, if run):

- `none`: nothing traces;
- `hops`: the 8 hop programs attached, nothing tagged (every ping parsed, none recorded; idle agents);
- `tag_all`: every ping tagged and recorded at every hop, agents streaming to a gRPC sink;
- `SUSPECT_stopped`: the same, then every agent SIGSTOPped for the measurement: the programs stay attached
  and keep recording into a 256 MiB ring that does not fill in the run, but no agent runs;
- `SUSPECT_idle`: the agents' threads and the sink's at SCHED_IDLE (any other task preempts them);
- `burnNN`: no tracer; a SCHED_IDLE process busy NN % of one vCPU (2 ms periods);
- `empty`: no tracer; a program that only returns at each of the 8 hops (at the six tc hops, and on the
  two tracepoints the path's tracepoint hops use, where it runs for every packet event of the machine):
  what any tracer with these hops costs before it does anything;
- `floor`: `tag_all`, but at the five tc hops that record without tagging, `ring_cost`'s floor program
  instead of hoptrace's (read the ID, take the clock, one record in the agent's ring; no parsing): what
  the least any per-packet recorder does at those hops costs;
- `..._pin0`: client and server pinned to vCPU 0 (`overhead.sockperf_ping_pong(pinned=True)`).

    .venv/bin/python bench/tail_cause.py --rounds 6 --seconds 5 \\
        --conditions none,tag_all,tag_all_stopped,tag_all_idle,burn60,none_pin0,tag_all_pin0
    .venv/bin/python bench/tail_cause.py --rounds 6 --seconds 5 \
        --conditions none,none_pin0,empty_pin0,floor_pin0,tag_all_pin0

It prints each condition's p99.9 and mean (medians over rounds) and the ratio to `none`, and the vCPUs'
busy and steal time (from /proc/stat) during the runs.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

from bpf_cost import empty_tc_programs, hop_prog_ids
from overhead import sockperf_ping_pong
from ring_cost import RECORDING, build_floor_object, load_floor, programs_instead, records_map_id

from common import RecordSink, log, median, path_agents, path_plans
from hoptrace.lab.bpfstate import attach_pinned_tracing
from hoptrace.lab.topology import TwoHostTopology

BIG_RING = str(1 << 28)  # records of a stopped agent's 5 s at every hop fit: the programs keep recording
BURN_PERIOD_S = 0.002

# `empty`'s tracepoint programs: where the reference path's tracepoint hops attach (bpf_cost.TP_HOPS).
EMPTY_TP_SOURCE = """\
/* Return at once: what running a program on the tracepoint costs. */
__attribute__((section("tp_btf/netif_receive_skb"), used)) int empty_rx(void *ctx) { return 0; }
__attribute__((section("tp_btf/net_dev_xmit"), used)) int empty_xmit(void *ctx) { return 0; }
char LICENSE[] __attribute__((section("license"), used)) = "GPL";
"""


def set_idle(tids: list[int], idle: bool) -> None:
    """SCHED_IDLE (or back to SCHED_OTHER) for each thread; a thread gone meanwhile is skipped."""
    policy = os.SCHED_IDLE if idle else os.SCHED_OTHER
    for tid in tids:
        with contextlib.suppress(ProcessLookupError):
            os.sched_setscheduler(tid, policy, os.sched_param(0))


def threads(pid: int | str) -> list[int]:
    """The thread ids of a process."""
    return [int(t) for t in os.listdir(f"/proc/{pid}/task")]


@contextlib.contextmanager
def burner(percent: int) -> Iterator[None]:
    """A SCHED_IDLE process busy `percent` % of one vCPU."""
    busy = BURN_PERIOD_S * percent / 100
    code = (
        "import os, time\n"
        "os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))\n"
        "while True:\n"
        "    t = time.perf_counter()\n"
        f"    while time.perf_counter() - t < {busy}: pass\n"
        f"    time.sleep({BURN_PERIOD_S - busy})\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        yield
    finally:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def empty_programs(topo: TwoHostTopology, workdir: Path) -> Iterator[None]:
    """An empty program at each hop of the reference path: tc (bpf_cost.empty_tc_programs) and tracepoint
    (EMPTY_TP_SOURCE, pinned in bpffs to be attached)."""
    src, obj = workdir / "empty_tp.bpf.c", workdir / "empty_tp.bpf.o"
    src.write_text(EMPTY_TP_SOURCE)
    subprocess.run(["clang", "-O2", "-target", "bpf", "-c", str(src), "-o", str(obj)], check=True)
    pins = Path("/sys/fs/bpf") / f"{workdir.name}-empty-tp"
    links: list[int] = []
    try:
        subprocess.run(["bpftool", "prog", "loadall", str(obj), str(pins)], check=True)
        links = [attach_pinned_tracing(str(pins / name)) for name in ("empty_rx", "empty_xmit")]
        with empty_tc_programs(topo, workdir):
            yield
    finally:
        for fd in links:
            os.close(fd)
        if pins.exists():
            for pin in pins.iterdir():
                pin.unlink()
            pins.rmdir()


@contextlib.contextmanager
def floor_hops(agents: tuple, topo: TwoHostTopology, workdir: Path) -> Iterator[None]:
    """The agents' recording tc hops replaced by ring_cost's floor program (one per node, writing into
    that node's agent's ring)."""
    ids = hop_prog_ids(topo, {"host-a": agents[0].pid, "host-b": agents[1].pid})
    obj = build_floor_object(workdir, "floor")
    pin_dir = Path("/sys/fs/bpf") / f"{workdir.name}-floor"
    pin_dir.mkdir(exist_ok=True)
    try:
        instead = {}
        for agent, node in zip(agents, ("a", "b"), strict=True):
            path = load_floor(obj, records_map_id(agent.pid), pin_dir / node)
            instead |= {hop: path for hop in RECORDING if hop.startswith(f"{node}-")}
        with programs_instead(topo, ids, instead):
            yield
    finally:
        for pin in pin_dir.iterdir():
            pin.unlink()
        pin_dir.rmdir()


@contextlib.contextmanager
def condition(name: str, topo: TwoHostTopology, workdir: Path, sink: RecordSink) -> Iterator[None]:
    """Set up condition `name` (without its `_pin0`) for the block; everything undone after."""
    if name == "none":
        yield
        return
    if name == "empty":
        with empty_programs(topo, workdir):
            yield
        return
    if name.startswith("burn"):
        with burner(int(name[len("burn") :])):
            yield
        return
    how = "stopped" if name.endswith("_stopped") else "idle" if name.endswith("_idle") else ""
    tracer = name.removesuffix("_stopped").removesuffix("_idle")
    tagging = tracer in ("tag_all", "floor")
    plans = path_plans(
        topo,
        f"tail-{tracer.replace('_', '-')}",
        {"dst": topo.addr("c2")},
        tag_udp=tagging,
        tcp_tagging=tagging,
    )
    extra = ("--ringbuf-bytes", BIG_RING) if how == "stopped" else ()
    with path_agents(topo, sink.addr, workdir, plans, *extra) as agents:
        tids = [t for a in agents for t in threads(a.pid)]
        main = threading.main_thread().native_id
        sink_tids = [
            t for t in threads("self") if t != main
        ]  # the sink's gRPC threads, not sockperf's parent
        if how == "stopped":
            for a in agents:
                os.kill(a.pid, signal.SIGSTOP)
        elif how == "idle":
            set_idle(tids + sink_tids, True)
        try:
            if tracer == "floor":
                with floor_hops(agents, topo, workdir):
                    yield
            else:
                yield
        finally:
            if how == "stopped":
                for a in agents:
                    os.kill(a.pid, signal.SIGCONT)
            elif how == "idle":
                set_idle(sink_tids, False)


def cpu_times() -> list[int]:
    """The first line of /proc/stat: jiffies of every vCPU by state."""
    with open("/proc/stat") as f:
        return [int(x) for x in f.readline().split()[1:9]]


def run(rounds: int, seconds: int, conditions: list[str]) -> dict[str, dict[str, float]]:
    """Interleaved rounds; per condition the medians and the ratio of p99.9 to the same round's `none`."""
    sink = RecordSink()
    topo = TwoHostTopology(f"tail{os.getpid() % 1000}", overlay="vxlan")
    raw: list[dict[str, dict[str, float]]] = []
    vcpus = os.cpu_count() or 1
    try:
        topo.create()
        with tempfile.TemporaryDirectory(prefix="hoptrace-tail-") as tmp:
            for r in range(rounds):
                order = conditions[r % len(conditions) :] + conditions[: r % len(conditions)]
                measured: dict[str, dict[str, float]] = {}
                for name in order:
                    pinned = name.endswith("_pin0")
                    with condition(name.removesuffix("_pin0"), topo, Path(tmp), sink):
                        before = cpu_times()
                        pp = sockperf_ping_pong(topo, seconds, pinned=pinned)
                        spent = [b - a for a, b in zip(before, cpu_times(), strict=True)]
                    key = "pp1" if pinned else "pp"
                    total = sum(spent) or 1
                    measured[name] = {
                        "p999_us": pp[f"{key}_p999_us"],
                        "mean_us": pp[f"{key}_mean_us"],
                        "busy_vcpus": (total - spent[3] - spent[4]) / total * vcpus,
                        "steal_vcpus": spent[7] / total * vcpus,
                    }
                    log(
                        f"round {r + 1} {name}: "
                        + ", ".join(f"{k} {v:.2f}" for k, v in measured[name].items())
                    )
                raw.append(measured)
    finally:
        topo.destroy()
        sink.close()
    summary = {}
    for name in conditions:
        # a pinned condition over the same round's pinned `none` when there is one
        base = "none_pin0" if name.endswith("_pin0") and "none_pin0" in conditions else "none"
        ratios = [rd[name]["p999_us"] / rd[base]["p999_us"] for rd in raw]
        row = {k: median([rd[name][k] for rd in raw]) for k in raw[0][name]}
        row.update(p999_ratio=median(ratios), p999_ratio_min=min(ratios), p999_ratio_max=max(ratios))
        summary[name] = row
        print(
            f"{name:18s} p99.9 {row['p999_us']:7.1f} µs x{row['p999_ratio']:.2f} "
            f"({row['p999_ratio_min']:.2f}..{row['p999_ratio_max']:.2f})  mean {row['mean_us']:6.2f} µs  "
            f"busy {row['busy_vcpus']:.2f} vCPUs, steal {row['steal_vcpus']:.3f}",
            flush=True,
        )
    return summary


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument(
        "--conditions", default="none,tag_all,tag_all_stopped,tag_all_idle,burn60,none_pin0,tag_all_pin0"
    )
    args = ap.parse_args()
    conditions = ["none"] + [c for c in args.conditions.split(",") if c and c != "none"]
    for name in conditions:
        base = name.removesuffix("_pin0")
        known = base in ("none", "empty", "floor") or base.startswith("burn") and base[4:].isdigit()
        known = known or base.removesuffix("_stopped").removesuffix("_idle") in ("hops", "tag_all")
        if not known:
            ap.error(f"unknown condition {name!r}")
    run(args.rounds, args.seconds, conditions)
    return 0


if __name__ == "__main__":
    sys.exit(main())
