"""What the records ring costs a traced tc hop in place (issue 13), side by side.

The 8-hop c1 -> c2 VXLAN path, sockperf UDP at a fixed rate, every packet tagged and recorded at every hop;
bpf_stats' ns per run of the five tc hops that record but do not tag (their median), conditions
interleaved in rounds:

- `ring`: the object as built, the agent's ring of 8 MiB (its default);
- `ring1M`, `ring128M`: the same with a ring of 1 or 128 MiB (do the cold lines of a large ring cost?);
- `local`: the same object but for one change, built here from a copy of kernel-patch/: the record is
  written into a per-CPU array slot instead of the shared ring (no reserve, no lock, a line that stays in
  this CPU's cache; nothing reaches the agent). What is left is what the hop costs besides the ring;
- `empty`: a tc program that only returns at the same hops (`bpf_cost.empty_tc_programs`);
- `..._pin`: client and server on one vCPU (`common.PINNED_CPU`), so every hop runs there: no other CPU
  writes the ring's lock or head meanwhile (the agent still reads the ring from wherever it runs).

    .venv/bin/python bench/ring_cost.py --rounds 3 \\
        --conditions ring,ring1M,ring128M,ring_pin,local,local_pin,empty,empty_pin
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bpf_cost import TC_HOPS, empty_tc_programs, hop_prog_ids, hop_run_times

from common import (
    REPO,
    SOCKPERF_PORT,
    RecordSink,
    TwoHostTopology,
    bpf_stats_enabled,
    log,
    median,
    path_agents,
    path_plans,
)

RINGS = {"ring": 8 << 20, "ring1M": 1 << 20, "ring128M": 128 << 20, "local": 8 << 20}
CONDITIONS = ("ring", "ring1M", "ring128M", "local", "empty")
SECONDS, MPS = 5, 20_000
TAGGER = "a-c1-eth0-out"  # it also grows the packet: left out of the median

# The `local` object's one change to hop.bpf.h: the record goes to a per-CPU slot, not the ring.
RESERVE = """\
	if (act_record[0])
		rec = bpf_ringbuf_reserve(&records, sizeof(*rec) + sizeof(*vals), 0);
	else
		rec = bpf_ringbuf_reserve(&records, sizeof(*rec), 0);
"""
LOCAL_SLOT = """\
	__u32 slot = 0;

	rec = bpf_map_lookup_elem(&bench_local_record, &slot);
"""
LOCAL_MAP = """\
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u8[128]); /* a record and its values */
} bench_local_record SEC(".maps");

"""
SUBMIT = "\tsubmit_record(rec);\n}\n"
LOCAL_SUBMIT = "\tcount(HOPTRACE_C_RECORDED, 1);\n}\n"


def build_local_object(workdir: Path) -> Path:
    """The hop object with the record written to a per-CPU slot (LOCAL_SLOT), built as `make bpf` does."""
    src = workdir / "kernel-patch-local"
    shutil.rmtree(src, ignore_errors=True)
    shutil.copytree(REPO / "kernel-patch", src, ignore=shutil.ignore_patterns("build"))
    header = src / "include" / "hop.bpf.h"
    text = header.read_text()
    for old, new in ((RESERVE, LOCAL_SLOT), (SUBMIT, LOCAL_SUBMIT)):
        if text.count(old) != 1:
            raise RuntimeError(f"hop.bpf.h changed: the local variant's patch no longer applies ({old!r})")
        text = text.replace(old, new)
    anchor = "static __always_inline void emit_record("
    text = text.replace(anchor, LOCAL_MAP + anchor, 1)
    header.write_text(text)
    obj = workdir / "hoptrace-local.bpf.o"
    subprocess.run(
        ["clang", "-O2", "-g", "-Wall", "-Werror", "-target", "bpf", "-D__TARGET_ARCH_x86",
         f"-I{REPO / 'kernel-patch' / 'build'}", f"-I{src / 'include'}",
         "-c", str(src / "hoptrace.bpf.c"), "-o", str(obj)],
        check=True,
    )  # fmt: skip
    return obj


def tc_median(hops: dict[str, Any], skip: str = "") -> float | None:
    """The median ns per run of the tc hops, `skip` left out."""
    return median(
        [v["ns_per_run"] for h, v in hops.items() if h in TC_HOPS and h != skip and v["ns_per_run"]]
    )


def measure(
    topo: TwoHostTopology, sink: RecordSink, workdir: Path, condition: str, local: Path
) -> float | None:
    """One condition's median ns per run of the recording tc hops."""
    pinned = condition.endswith("_pin")
    base = condition.removesuffix("_pin")
    if base == "empty":
        with empty_tc_programs(topo, workdir) as ids:
            return tc_median(hop_run_times(ids, topo, SECONDS, MPS, pinned)["hops"])
    filter_ = {"protocol": "udp", "dst": topo.addr("c2"), "dstPort": SOCKPERF_PORT}
    plans = path_plans(topo, f"ringcost-{condition}", filter_)
    if base == "local":
        for plan in plans:
            plan["objectPath"] = str(local)
    with path_agents(topo, sink.addr, workdir, plans, "--ringbuf-bytes", str(RINGS[base])) as (a, b):
        ids = hop_prog_ids(topo, {"host-a": a.pid, "host-b": b.pid})
        records = sink.count()
        data = hop_run_times(ids, topo, SECONDS, MPS, pinned)
        log(f"ring_cost {condition}: {sink.count() - records} records")
        return tc_median(data["hops"], skip=TAGGER)


def run(rounds: int, conditions: list[str]) -> dict[str, list[float]]:
    """Each condition's medians, one per round (order rotated per round)."""
    workdir = Path(tempfile.mkdtemp(prefix="hoptrace-ring-cost-"))
    local = build_local_object(workdir)
    results: dict[str, list[float]] = {c: [] for c in conditions}
    sink = RecordSink()
    topo = TwoHostTopology("hrc", overlay="vxlan")
    try:
        topo.create()
        with bpf_stats_enabled():
            for r in range(rounds):
                order = conditions[r % len(conditions) :] + conditions[: r % len(conditions)]
                for condition in order:
                    ns = measure(topo, sink, workdir, condition, local)
                    if ns is not None:
                        results[condition].append(ns)
                    log(
                        f"ring_cost round {r}: {condition} {ns:.0f} ns per run"
                        if ns
                        else f"{condition}: none"
                    )
    finally:
        topo.destroy()
        sink.close()
        shutil.rmtree(workdir, ignore_errors=True)
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--conditions", default="ring,ring1M,ring128M,ring_pin,local,local_pin,empty,empty_pin")
    args = ap.parse_args()
    conditions = [c for c in args.conditions.split(",") if c]
    for name in conditions:
        if name.removesuffix("_pin") not in CONDITIONS:
            ap.error(f"unknown condition {name!r} (known: {', '.join(CONDITIONS)}, each also with _pin)")
    results = run(args.rounds, conditions)
    print("| condition | ns per run, recording tc hops (median over rounds) | rounds |")
    print("|---|---|---|")
    for name, values in results.items():
        shown = ", ".join(f"{v:.0f}" for v in values)
        print(f"| `{name}` | {median(values):.0f} | {shown} |" if values else f"| `{name}` | none | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
