"""Event probes: kernel run time of the event program (kernel-patch/include/event.bpf.h) per tracepoint hit.

With `kernel.bpf_stats_enabled=1` the kernel adds each program's run time to `run_time_ns` and counts its runs
in `run_cnt`. One standalone agent runs a spec of event probes alone on `net:net_dev_xmit` (it fires for
every frame any device of the machine transmits) while sockperf sends UDP c1 -> c2 over the VXLAN path,
one probe per condition, each its own program (the agent loads the event program once per event):

- `count`: no where:, a plain count (one hash lookup and an atomic add);
- `where_miss`: four terms whose first never holds (`len == 1 and ...`): one argument read, then out;
- `where_count_by_cpu_hist`: `len > 0 and rc == 0`, count by cpu and a histogram of len;
- `where_count_record_2`: the same terms, a count and `record: [len, rc]` (per-CPU statistics of two
  arguments);
- `latency_mark` / `latency_since_mark`: an event-to-event latency on the same tracepoint, keyed by the
  skb: the first writes each frame's time into the LRU `event_marks`, the second looks it up, deletes it and
  histograms the difference.

Each program's ns per run is its `run_time_ns / run_cnt` growth during the traffic. The event program
reads each argument with one bpf_probe_read_kernel (offsets are load-time constants, see event.bpf.h).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import yaml
from bpf_cost import sockperf_throughput

from common import (
    BenchContext,
    PlanAgent,
    RecordSink,
    TwoHostTopology,
    bpf_stats_enabled,
    log,
    progs_of,
    target,
)
from hoptrace.dispatcher.compile import standalone_plans
from hoptrace.spec import check_spec, load_spec

BPF_OBJECT = Path(__file__).resolve().parents[1] / "kernel-patch" / "build" / "hoptrace.bpf.o"
CONDITIONS = {
    "count": {"actions": ["count"]},
    "where_miss": {"where": "len == 1 and rc == 0 and len < 2 and len > 0", "actions": ["count"]},
    "where_count_by_cpu_hist": {
        "where": "len > 0 and rc == 0",
        "actions": [{"count": {"by": "cpu"}}, {"histogram": "len"}],
    },
    "where_count_record_2": {"where": "len > 0 and rc == 0", "actions": ["count", {"record": ["len", "rc"]}]},
    # An event-to-event latency on one tracepoint: the first remembers each frame's time by its skb, the
    # second (attached after it, so it runs after it) takes that entry out and histograms the difference.
    "latency_mark": {"key": "skbaddr", "actions": ["count"]},
    "latency_since_mark": {
        "key": "skbaddr",
        "actions": ["count", {"histogram": "latency", "since": "latency-mark"}],
    },
}


def event_spec(name: str) -> Any:
    """The spec of one event probe per condition, all on host-a's agent."""
    events = [
        {"name": condition.replace("_", "-"), "node": "host-a", "tracepoint": "net:net_dev_xmit", **settings}
        for condition, settings in CONDITIONS.items()
    ]
    return load_spec(yaml.safe_dump({"name": name, "events": events}))


def event_prog_ids(pid: int) -> dict[str, int]:
    """Condition -> program id of the agent's event programs, in spec order (the agent loads them in order,
    so their ids increase in that order)."""
    ids = sorted(p["id"] for p in progs_of({pid}).values() if str(p.get("name", "")).startswith("event_tp"))
    if len(ids) != len(CONDITIONS):
        raise RuntimeError(f"expected {len(CONDITIONS)} event programs of the agent, found {ids}")
    return dict(zip(CONDITIONS, ids, strict=True))


def run(ctx: BenchContext) -> dict[str, Any]:
    """ns per run of each condition's event program, and the targets."""
    seconds = ctx.size(2, 10)
    mps = ctx.size(10_000, 20_000)
    results: dict[str, Any] = {"seconds": seconds, "mps": mps, "conditions": {}}
    sink = RecordSink()
    topo = TwoHostTopology(ctx.prefix(), overlay="vxlan")
    try:
        topo.create()
        (plan,) = standalone_plans(check_spec(event_spec("event-cost")), BPF_OBJECT).values()
        agent = PlanAgent(plan, "host-a", topo.host_a, sink.addr, ctx.workdir, "--clock-server", "off")
        with bpf_stats_enabled():
            agent.start()
            try:
                ids = event_prog_ids(agent.pid)
                before = {p["id"]: p for p in progs_of({agent.pid}).values()}
                traffic = sockperf_throughput(topo, seconds, mps)
                after = {p["id"]: p for p in progs_of({agent.pid}).values()}
            finally:
                agent.stop()
        for condition, pid in ids.items():
            runs = after[pid].get("run_cnt", 0) - before[pid].get("run_cnt", 0)
            ns = after[pid].get("run_time_ns", 0) - before[pid].get("run_time_ns", 0)
            results["conditions"][condition] = {
                "prog_id": pid,
                "runs": runs,
                "ns_per_run": ns / runs if runs else None,
            }
        results["sent"] = traffic["sent"]
        log(
            "event_cost: "
            + ", ".join(
                f"{c} {v['ns_per_run']:.0f} ns ({v['runs']} runs)" for c, v in results["conditions"].items()
            )
        )
    finally:
        topo.destroy()
        sink.close()
    results["table"] = {
        "columns": ["probe (net:net_dev_xmit)", "ns per run", "runs"],
        "rows": [[c, v["ns_per_run"], v["runs"]] for c, v in results["conditions"].items()],
        "note": f"{results['sent']} datagrams sent by sockperf; every frame any device transmits is a run",
    }
    full = results["conditions"]["where_count_by_cpu_hist"]["ns_per_run"]
    results["targets"] = [
        target(
            "event program run time per hit, count only",
            results["conditions"]["count"]["ns_per_run"],
            150,
            "ns",
        ),
        target("event program run time per hit, where + count by cpu + histogram", full, 300, "ns"),
    ]
    return results


def main() -> int:
    """`python bench/event_cost.py [--full]`: run alone and print the per-condition table."""
    ctx = BenchContext(quick="--full" not in sys.argv)
    try:
        result = run(ctx)
    finally:
        ctx.close()
    print("| condition | runs | ns per run |\n|---|---|---|")
    for condition, v in result["conditions"].items():
        print(f"| {condition} | {v['runs']} | {v['ns_per_run']:.0f} |")
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    sent, mps, seconds = result["sent"], result["mps"], result["seconds"]
    print(f"\n{sent} datagrams sent by sockperf at {mps}/s for {seconds} s; {started}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
